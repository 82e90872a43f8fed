#!/usr/bin/env bash
# Profile one version with every profiler that applies to this machine.
#
#   ./run_all_profilers.sh v1 --preset small              (from the repo root)
#   ./run_all_profilers.sh v4 --only pytorch,ncu --args-for ncu "--launch-count 100"
#
# Detects the backend PyTorch will use (PROFILE_BACKEND=rocm|cuda|cpu overrides) and runs
#   on any device  pytorch (PyTorch profiler), flopcounter, deepspeed (installed by setup/install.sh)
#   on ROCm        rocprofv3, rocprof-sys, rocprof-compute
#   on CUDA        ncu, nsys
# each through its profiling/run_*.sh wrapper, on a few steps after warm-up.
# A missing tool is one "skipped:" line, never an abort; a failed profiled run
# is reported, the others still run, and the exit code is non-zero. The
# summary at the end lists what ran (and where its outputs are), what was
# skipped and why, and what failed. Each profile replaces the previous one
# only when it succeeds. Ctrl-C stops the whole runner (exit 130): the
# profilers not yet run keep their previous profiles too.
#   --only LIST, --skip LIST    comma-separated profiler names from the list above
#   --args-for NAME "OPTIONS"   options for one wrapper (see that run_*.sh --help)
# VERSION, --preset, --num-steps, --warmup-steps, --out, --tag and anything
# after -- go to every wrapper (and so to the training script).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ALL=(pytorch flopcounter deepspeed rocprofv3 rocprof-sys rocprof-compute ncu nsys)
ONLY=""
EXCLUDE=""
declare -A EXTRA=()
tool_option() {
    case "$1" in
        --only|--skip) need_value "$1" "${2-}" "a comma-separated list"
            local name
            for name in ${2//,/ }; do
                [[ " ${ALL[*]} " == *" $name "* ]] || die 2 "$1: unknown profiler '$name' (one of ${ALL[*]})"
            done
            if [[ "$1" == --only ]]; then ONLY=",$2,"; else EXCLUDE=",$2,"; fi
            TOOL_SHIFT=2 ;;
        --args-for) (($# >= 3)) || die 2 "--args-for needs a profiler name and its options"
            [[ " ${ALL[*]} " == *" $2 "* ]] || die 2 "--args-for: unknown profiler '$2' (one of ${ALL[*]})"
            EXTRA[$2]=$3; TOOL_SHIFT=3 ;;
        *) return 1 ;;
    esac
}

command_for() {  # the wrapper command line of one profiler
    case "$1" in
        pytorch) WRAPPER=(run_pytorch_profiler.sh) ;;
        flopcounter|deepspeed) WRAPPER=(run_flops.sh --counter "$1") ;;
        *) WRAPPER=("run_${1//-/_}.sh") ;;
    esac
}

needs() {  # the backend a profiler needs, or "any"
    case "$1" in
        rocprof*) echo rocm ;;
        ncu|nsys) echo cuda ;;
        *) echo any ;;
    esac
}

parse_args "$@"
resolve_version
resolve_python
OUT_ROOT=${OUT_ROOT:-$REPO_ROOT/profiles/$VERSION}
mkdir -p "$OUT_ROOT"
OUT_ROOT="$(cd "$OUT_ROOT" && pwd)"
BACKEND="$(detect_backend)"
echo "profiling $VERSION on $BACKEND; outputs under $OUT_ROOT"

COMMON=("$VERSION" --warmup-steps "$WARMUP_STEPS" --out "$OUT_ROOT")
if [[ -n "$PRESET" ]]; then COMMON+=(--preset "$PRESET"); fi
if [[ -n "$NUM_STEPS" ]]; then COMMON+=(--num-steps "$NUM_STEPS"); fi
if [[ -n "$TAG" ]]; then COMMON+=(--tag "$TAG"); fi

RAN=() SKIPPED_LINES=() FAILED=()
declare -A TOOK=()
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# Ctrl-C reaches the running profiler too, which says so and exits 130: the
# runner stops there. Interrupted between two profilers, it stops before the next.
INTERRUPTED=0
trap 'INTERRUPTED=1' INT
for name in "${ALL[@]}"; do
    ((INTERRUPTED == 0)) || break
    if [[ -n "$ONLY" && "$ONLY" != *",$name,"* ]] || [[ "$EXCLUDE" == *",$name,"* ]]; then
        continue  # not asked for: not worth a line
    fi
    need="$(needs "$name")"
    if [[ "$need" != any && "$need" != "$BACKEND" ]]; then
        label=$([[ "$need" == rocm ]] && echo "an AMD (ROCm)" || echo "an NVIDIA (CUDA)")
        SKIPPED_LINES+=("$name (needs $label GPU; this machine runs $BACKEND)")
        continue
    fi
    command_for "$name"
    read -ra extra <<<"${EXTRA[$name]:-}"
    echo
    echo "=== $name"
    rc=0 started=$SECONDS
    { bash "$PROFILING_DIR/${WRAPPER[0]}" "${WRAPPER[@]:1}" "${COMMON[@]}" \
        ${extra[@]+"${extra[@]}"} -- ${APP_ARGS[@]+"${APP_ARGS[@]}"} 2>&1 | tee -i "$LOG"; } || rc=$?
    TOOK[$name]=$((SECONDS - started))
    if ((rc == 130)); then exit 130; fi  # the profiler has said "interrupted" already
    if ((rc == 0)); then
        RAN+=("$name")
    elif ((rc == SKIPPED)); then
        SKIPPED_LINES+=("$(grep -m1 '^skipped: ' "$LOG" | sed 's/^skipped: //' || echo "$name")")
    else
        FAILED+=("$name (exit $rc; log: $(failed_log "$name"))")
    fi
done
if ((INTERRUPTED)); then
    echo "interrupted: the profilers not run keep their previous profiles under $OUT_ROOT" >&2
    exit 130
fi

echo
echo "=== summary: $VERSION on $BACKEND, outputs under $OUT_ROOT"
for name in ${RAN[@]+"${RAN[@]}"}; do
    table="$OUT_ROOT/$name/kernel_table.csv"
    printf 'ran:     %-16s %4d s  %s%s\n' "$name" "${TOOK[$name]}" "$OUT_ROOT/$name" \
        "$([[ -f "$table" ]] && echo "  (kernel_table.csv)")"
done
for line in ${SKIPPED_LINES[@]+"${SKIPPED_LINES[@]}"}; do echo "skipped: $line"; done
for line in ${FAILED[@]+"${FAILED[@]}"}; do echo "failed:  $line"; done
tables=()
for name in ${RAN[@]+"${RAN[@]}"}; do
    [[ -f "$OUT_ROOT/$name/kernel_table.csv" ]] && tables+=("$name=$OUT_ROOT/$name/kernel_table.csv")
done
if ((${#tables[@]})); then
    echo "one kernel table: python -m profiling parse $OUT_ROOT/<profiler>/kernel_table.csv"
    echo "side by side:     python -m profiling compare ${tables[*]}"
fi
if ((${#FAILED[@]})); then exit 1; fi
