#!/usr/bin/env bash
# Reproduce every number the docs publish, on this machine's GPU (CUDA or ROCm).
#
#   bash benchmarks/reproduce.sh                  # every step, about 45 minutes on an H200
#                                                 # (scaling, on 2+ GPUs only: about 54 more)
#   bash benchmarks/reproduce.sh compare-medium   # one step (or several, in any order)
#   bash benchmarks/reproduce.sh --list           # the steps, what each writes, how long it takes
#   bash benchmarks/reproduce.sh --quick          # CPU smoke test: tiny preset, a few rows, ~1 min
#   make results                                  # the same as the first line
#
# Every row (one training run, one comparison, one benchmark) writes one JSON under
# results/reproduce/<gpu>/; a row whose JSON exists is skipped, so a step that was cut off
# resumes where it stopped (--force runs every row again). A row that failed runs again, unless
# its failure is an answer (out of memory in the memory step, a backend this GPU lacks). A
# comparison is one row that keeps every finished run in its JSON: a cut one continues with
# compare_versions.py --resume, a complete one is skipped. A row that would repeat a run of the
# medium comparison (the V3 eager baseline of the fusion and block steps, V1's bf16 lever, ...)
# is copied from it. Each step's time (--list) comes from runs on an H200; where one command may
# run only so long (a job scheduler's limit), run the steps a few at a time, or set TIME_LIMIT
# (below) and run the same command until it exits with something other than 3. The README table
# needs `env compare-medium`.
# Run one reproduce at a time on a host, even on a machine with several GPUs: rows that the
# host paces (eager, compiled without graphs, the small preset, the host step, the kernel table's
# timings without graphs) slow down beside other work on its CPUs. On an H200 host, the small
# comparison's graph rows ran 11-13% slower beside a second reproduce on the other GPU than alone.
# This script measures and writes JSON; it never publishes. Its last step checks:
#   regress   python -m analysis_tools regress: the throughput of every comparison row and
#             scaling row against docs/published/<gpu>/ (exit 1 on a drop of more than 5%)
# Then one command publishes: `python tools/publish.py results/reproduce/<gpu>` writes
# docs/published/<gpu>/ (the whole set for a GPU model without one; else only the steps re-run
# here, keeping the rest, and RESULTS.md lists what was re-measured when) and fills the docs.
#
# Environment: PYTHON (.venv/bin/python if it exists, else python3), GPU (the set's name;
# default from the device, e.g. h200 or mi300x), RESULTS (results), STEPS (30 timed-run steps),
# WARMUP (10 warm-up steps before them), ROWS (a pattern: run only the rows of a step whose
# names match it, e.g. ROWS='v4_*'), REPEATS (1: rounds of each comparison), EAGER_REPEATS (3:
# rounds of the medium and small comparisons' eager rows, which the host paces), BASELINE
# (docs/published/<gpu>), MEDIUM_MODES / SMALL_MODES / LARGE_MODES (the compare_versions
# --modes; medium: eager,compile,reduce-overhead-master, small: eager,reduce-overhead, large:
# reduce-overhead-master), ROW_TIMEOUT (300: seconds a training row may run before it is
# stopped and recorded as failed), TIME_LIMIT (seconds: where one command may run only so
# long, no training row starts that its ROW_TIMEOUT could carry past the limit; the command
# then stops with exit 3, and the same command run again continues where it stopped),
# HOST_RERUNS (1: times a training row the host paces runs again where its host ran slow,
# benchmarks/experiments.py host-pace; 0 with --quick).
# max-autotune is left out by default (minutes of
# compilation, no faster step); to add it back:
#   MEDIUM_MODES=eager,compile,reduce-overhead-master,max-autotune \
#       bash benchmarks/reproduce.sh --force compare-medium
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Every row starts a fresh Python. Where the packages were installed without their compiled
# bytecode and PYTHONDONTWRITEBYTECODE is set (common in containers), each start recompiles
# torch's modules (~5 s): the rows share one bytecode cache under results/ instead (never
# beside the sources). Triton keeps each autotuned choice on disk too, so the next row with
# the same kernel and shape starts from it instead of timing every candidate again.
if [ -z "${PYTHONPYCACHEPREFIX:-}" ]; then
    export PYTHONPYCACHEPREFIX=$REPO/results/.pycache
    unset PYTHONDONTWRITEBYTECODE
fi
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}

ALL_STEPS=(env compare-medium compare-small kernels analysis debug memory levers fusion blocks sdpa host flops compare-large switches scaling regress)
describe_step() {
    case $1 in
        env)            echo "~0.1 min  environment.txt: setup/check_environment.py" ;;
        compare-medium) echo "~7.5 min  compare_medium.json: every version and mode + the HF peer, medium preset, interleaved (18 runs: each eager row 3 times, 6 compiled; more where a host-paced run's host ran slow); SDPA backends" ;;
        compare-small)  echo "~7.5 min  compare_small.json: the same on the launch-bound small preset (every row 3 times, the host paces them all; CUDA/HIP graphs)" ;;
        kernels)        echo "~4.2 min  kernels.json: V3's Triton kernels against PyTorch (benchmarks/bench_kernels.py); host_overhead.json: host microseconds per call (benchmarks/host_overhead.py)" ;;
        analysis)       echo "~2.4 min  ceilings.json, V1, V3 and V4 medium profiled (operator and kernel tables), roofline" ;;
        debug)          echo "~0.5 min  debug/: the five performance-debugging stages, broken and fixed" ;;
        memory)         echo "~1.3 min  memory/: V1 memory vs batch and sequence length, V1 vs V4 attention memory, memory model check" ;;
        levers)         echo "~1 min    levers/: precision, batch and accumulation, checkpointing, data, optimizer (V1)" ;;
        fusion)         echo "~4.5 min  fusion/: V3's fusions each on and off, V2 with each fusion switched off, V4 without the fused gate/up GEMM" ;;
        blocks)         echo "~0.6 min  blocks/: V3 flash-attention block sizes against the autotuned pick" ;;
        sdpa)           echo "~0.5 min  sdpa/: V4 medium with each SDPA backend" ;;
        host)           echo "~2 min    host/: V3 and V4 compiled with --host-probe (how long the GPU waits for the host a step, and the host's time to queue one), V3 with Triton's launcher; GPU only" ;;
        scaling)        echo "~54 min   scaling/: every version compiled and at its best on 1 GPU and under DDP on 2 (and 4) GPUs, FSDP2 x2, V4 at the large preset, the DDP and FSDP2 levers, every version at its best with the optimizer sharded (the default with master weights; DDP there is a lever row), every version compiled with the all-reduce after the backward (the default compiled with fp32 weights; DDP there is a lever row too), V4 compiled and compiled with master weights sharded too (and DDP compiled with master weights), V4 profiled on 1 GPU and x2 under DDP, FSDP2 and the all-reduce after the backward (overlap); skipped below 2 GPUs" ;;
        compare-large)  echo "~4.3 min  compare_large.json: V1, V3 and V4 at their best (graphs + master weights) and the compiled HF peer, large preset (~1 B parameters, 32k vocabulary; needs a 64+ GiB GPU)" ;;
        switches)       echo "~9 min    switches/: V3 large at its best (fused linear + CE on, its default there) with it off, with each recomputation (RoPE, SwiGLU, norms) and all three, each against the memory model's prediction (needs a 64+ GiB GPU)" ;;
        flops)          echo "~1.4 min  flops/vN/: DeepSpeed's FLOPS profiler and FlopCounterMode against the formula, V1..V4, small preset" ;;
        regress)        echo "~0.1 min  python -m analysis_tools regress against docs/published/<gpu>/" ;;
    esac
}

QUICK=0; FORCE=0; STEPS_ASKED=()
for arg in "$@"; do
    case $arg in
        --quick) QUICK=1 ;;
        --force) FORCE=1 ;;
        --list)
            for s in "${ALL_STEPS[@]}"; do printf '  %-15s %s\n' "$s" "$(describe_step "$s")"; done
            exit 0 ;;
        -h|--help) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "error: unknown option $arg (try --help)" >&2; exit 2 ;;
        *) if [ -z "$(describe_step "$arg")" ]; then
               echo "error: unknown step '$arg' (steps: ${ALL_STEPS[*]})" >&2; exit 2
           fi
           STEPS_ASKED+=("$arg") ;;
    esac
done

if [ $QUICK = 1 ]; then
    # The pipeline on a CPU: tiny preset, 4 steps, two comparison rows and one lever row.
    DEVICE=cpu; MEDIUM=tiny; SMALL=tiny; LARGE=tiny; STEPS=${STEPS:-4}; WARMUP=1; REPEATS=1; NGPU=0
    GPU=${GPU:-cpu-quick}
    [ ${#STEPS_ASKED[@]} -gt 0 ] || STEPS_ASKED=(env compare-medium levers flops regress)
else
    DEVICE=cuda; MEDIUM=medium; SMALL=small; LARGE=large; STEPS=${STEPS:-30}; WARMUP=${WARMUP:-10}; REPEATS=${REPEATS:-1}
    NGPU=$($PY -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
           2>/dev/null || echo 0)
    if [ "$NGPU" -lt 1 ]; then
        echo "error: reproduce needs a CUDA or ROCm GPU (--quick runs the pipeline on a CPU)" >&2
        exit 2
    fi
    GPU=${GPU:-$($PY -c 'from harness.device import gpu_slug; print(gpu_slug())')}
    [ ${#STEPS_ASKED[@]} -gt 0 ] || STEPS_ASKED=("${ALL_STEPS[@]}")
fi
# Counts and seconds are whole numbers; a typo stops here, before any row runs.
for var in STEPS WARMUP REPEATS EAGER_REPEATS ROW_TIMEOUT TIME_LIMIT HOST_RERUNS; do
    [ -n "${!var:-}" ] || continue
    pattern='^[0-9]+$'; [ $var = TIME_LIMIT ] && pattern='^-?[0-9]+$'
    if ! [[ ${!var} =~ $pattern ]]; then
        echo "error: $var='${!var}' is not a whole number (see --help)" >&2; exit 2
    fi
done
RESULTS=${RESULTS:-results}
W="$RESULTS/reproduce/$GPU"      # every row's JSON and log
BASELINE=${BASELINE:-docs/published/$GPU}
mkdir -p "$W"
LOG="$W/reproduce.log"
start=$SECONDS
failed=0
# Which docs block shows which row travels with the measurements: publishing reads it here.
$PY -m benchmarks.experiments manifest "$W/experiments.json" || failed=1
# Each training row runs in the background and is waited for: when reproduce itself is stopped
# (TERM from a time limit, Ctrl-C) it stops that run too - timeout passes the signal on, torchrun
# to its workers - instead of leaving it on the GPUs beside whatever runs next.
RUN_PID=
trap '[ -n "$RUN_PID" ] && kill -TERM $RUN_PID 2>/dev/null; echo "reproduce stopped" >&2; exit 143' TERM INT
say() { echo "[$(printf '%3d:%02d' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)))] $*" | tee -a "$LOG"; }
have() { [ $FORCE = 0 ] && [ -s "$1" ]; }
# done_before OUT LABEL: OUT holds a result, or a failure that is an answer (OK_EXIT); a row
# that failed otherwise (a crash, its ROW_TIMEOUT) runs again
done_before() {
    have "$1" || return 1
    local rc; rc=$(sed -n 's/^{"exit_code": \(-\{0,1\}[0-9]*\),.*/\1/p' "$1")
    if [ -z "$rc" ] || [[ " $OK_EXIT " == *" $rc "* ]]; then say "   $2: done before, skipped"; return 0; fi
    say "   $2: failed before (exit $rc), run again"; return 1
}
finished() { grep -q '"complete": true' "$1" 2>/dev/null; }   # a finished comparison

# train DIR NAME SCRIPT ARGS...: one timed run -> $W/DIR/NAME.json (skipped if done_before),
# with the flags a compare_versions run has, so a row and a comparison's run compare.
# ROW_ENV: VAR=value settings for the run; OK_EXIT: exits that are answers; ROW_GPUS: more
# than 1 starts the run under torchrun, one process per GPU.
OK_EXIT=3
ROW_TIMEOUT=${ROW_TIMEOUT:-300}
HOST_RERUNS=${HOST_RERUNS:-1}; [ $QUICK = 1 ] && HOST_RERUNS=0
host_paced() { [[ " $* " != *" reduce-overhead "* && " $* " != *" --preset $LARGE "* ]]; }
limited=0
train() {
    local dir=$1 name=$2 script=$3; shift 3
    local out="$W/$dir/$name.json"
    done_before "$out" "$dir/$name" && return 0
    if [ -n "${TIME_LIMIT:-}" ] && ((SECONDS - start + ROW_TIMEOUT > TIME_LIMIT)); then
        [ $limited = 1 ] || say "   $dir/$name and what follows: not started, TIME_LIMIT=$TIME_LIMIT s is less than ROW_TIMEOUT=$ROW_TIMEOUT s away; run the same command again to continue"
        limited=1; return 0
    fi
    mkdir -p "$W/$dir"
    local launch=($PY) rc again=0 slow
    [ "${ROW_GPUS:-1}" -gt 1 ] && launch=($PY -m torch.distributed.run --standalone --nproc-per-node "$ROW_GPUS")
    while :; do
        echo "== $name: ${launch[*]} $script $*" >> "$W/$dir/runs.log"
        env ${ROW_ENV:-} timeout "$ROW_TIMEOUT" "${launch[@]}" "$script" --device "$DEVICE" --num-steps "$STEPS" --warmup-steps "$WARMUP" \
            --quiet --output "$out" "$@" >> "$W/$dir/runs.log" 2>&1 &
        RUN_PID=$!
        wait $RUN_PID
        rc=$?
        RUN_PID=
        # A row the host paces (no graphs, not the large preset) whose host ran slow runs again,
        # HOST_RERUNS times at most; the slow run stays beside it as .NAME.slow.json. Rows that
        # replay graphs, on one GPU or several, run at full speed on a host that probes 2x slow.
        { [ $rc = 0 ] && [ $again -lt "$HOST_RERUNS" ] && host_paced "$@"; } || break
        slow=$($PY -m benchmarks.experiments host-pace "$W" "$out") && break
        if [ -n "${TIME_LIMIT:-}" ] && ((SECONDS - start + ROW_TIMEOUT > TIME_LIMIT)); then break; fi
        say "   $dir/$name: it $slow, run again"
        mv "$out" "$W/$dir/.$name.slow.json"; again=$((again + 1))
    done
    if [ $rc = 0 ]; then
        say "   $dir/$name ok"
    else
        # Some failures are answers: out of memory (exit 3) in the memory exercise, an SDPA
        # backend this GPU lacks (exit 2). They are recorded as such, not as failures.
        echo "{\"exit_code\": $rc, \"error\": $(tail -n 1 "$W/$dir/runs.log" | $PY -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}" > "$out"
        say "   $dir/$name exit $rc: $(tail -n 1 "$W/$dir/runs.log")"
        [[ " $OK_EXIT " == *" $rc "* ]] || failed=1
    fi
}

# from_compare DIR NAME VERSION MODE SCRIPT ARGS...: a row that would repeat a run of the
# medium comparison (a step's baseline: same flags, same steps) is copied from that run;
# without a finished comparison it is run like any other row.
from_compare() {
    local dir=$1 name=$2 version=$3 mode=$4; shift 4
    local out="$W/$dir/$name.json" report="$W/compare_medium.json"
    done_before "$out" "$dir/$name" && return 0
    if finished "$report" && $PY -m benchmarks.experiments compare-row "$report" "$version" "$mode" "$out" 2>/dev/null; then
        say "   $dir/$name: the medium comparison's $version $mode run"
    else
        train "$dir" "$name" "$@"
    fi
}

# run_rows STEP: the step's training rows as benchmarks/experiments.py names them (each at its
# preset, $MEDIUM unless it names another; a row that repeats a medium comparison's run is
# copied from it)
run_rows() {
    local quick=(); [ $QUICK = 1 ] && quick=(--quick)
    local listing; listing=$($PY -m benchmarks.experiments rows "$1" "${quick[@]}") || { failed=1; return; }
    local name version script same answers env gpus preset flags
    while IFS=$'\t' read -r -u 3 -a fields; do  # fd 3: a run never reads the listing
        name=${fields[0]} version=${fields[1]} script=${fields[2]} same=${fields[3]}
        answers=${fields[4]} env=${fields[5]} gpus=${fields[6]} preset=${fields[7]} flags=("${fields[@]:8}")
        case $preset in small) preset=$SMALL ;; large) preset=$LARGE ;; *) preset=$MEDIUM ;; esac
        [ "$answers" = - ] && answers=""; [ "$env" = - ] && env=""
        # shellcheck disable=SC2053  # ROWS is a pattern
        [[ $name == ${ROWS:-*} ]] || continue
        if [ "$gpus" -gt 1 ] && [ "$gpus" -gt "$NGPU" ]; then
            say "   $1/$name: skipped, needs $gpus GPUs ($NGPU here)"; continue
        fi
        # a profiled row keeps its traces beside its JSON: <step>/<name>_profile/
        [[ " ${flags[*]} " == *" --profile "* ]] && flags+=(--profile-dir "$W/$1/${name}_profile")
        if [ "$same" = - ]; then
            ROW_ENV=$env ROW_GPUS=$gpus OK_EXIT="3 $answers" train "$1" "$name" "$script" --preset "$preset" "${flags[@]}"
        else
            ROW_ENV=$env OK_EXIT="3 $answers" from_compare "$1" "$name" "$version" "$same" "$script" --preset "$preset" "${flags[@]}"
        fi
    done 3<<< "$listing"
}

# memory_check DIR ROW.json...: the memory model's prediction against each finished row (a
# row that ran out of memory has none) -> DIR/memory_check.json, once every row of the step
# ran; false where it did not run now
memory_check() {
    local dir=$1 f ok=(); shift
    for f in "$@"; do grep -q '"schema_version"' "$f" && ok+=("$f"); done
    [ $limited = 0 ] && [ ${#ok[@]} -gt 0 ] && ! have "$dir/memory_check.json" || return 1
    $PY -m analysis_tools memory "${ok[@]}" --json "$dir/memory_check.json" --out-dir "$dir" \
        > "$dir/memory_check.log" 2>&1 || failed=1
}

COMPARISONS=(medium small large)  # the presets of the compare-* steps
V1=version1_baseline/tiny_llama_v1.py
V3=version3_triton/tiny_llama_v3.py
V4=version4_sdpa/tiny_llama_v4.py

compare() {  # compare NAME PRESET: one interleaved comparison of every version and mode
    local preset=$1 out="$W/compare_$1.json" versions=v1,v2,v3,v4,hf
    local modes=${MEDIUM_MODES:-eager,compile,reduce-overhead-master} peers=compile
    if [ $FORCE = 0 ] && finished "$out"; then say "   compare_$preset: done before, skipped"; return 0; fi
    [ $QUICK = 1 ] && { versions=v1,v4; modes=eager; }
    [ "$preset" = small ] && modes=${SMALL_MODES:-eager,reduce-overhead}
    local sweep=(); [ $QUICK = 1 ] || sweep=(--sdpa-sweep)
    # Eager rows are paced by the host and move by a fifth from one process to the next: each
    # is the median of EAGER_REPEATS processes (its spread kept, and judged by regress).
    local eager=${EAGER_REPEATS:-3} repeats=$REPEATS; [ $QUICK = 1 ] && eager=$REPEATS
    # On the small preset the host paces every row, graphs included: a step of ~4 ms leaves the
    # host's share (the graph replay's own checks, the optimizer's launches) in view: V3's graph
    # row at one commit on one H200 ran 233k tokens/s in one process, 330k and 336k in two others.
    # Each small row is the median of as many processes as an eager row.
    [ "$preset" = small ] && [ $QUICK = 0 ] && [ "$eager" -gt "$repeats" ] && repeats=$eager
    if [ "$preset" = large ]; then  # the targets' versions; V1 runs eager, its one mode
        versions=v1,v3,v4,hf; modes=${LARGE_MODES:-reduce-overhead-master}; sweep=(); eager=$REPEATS
        [ $QUICK = 1 ] && { versions=v1,v4; modes=eager; }
    fi
    # The modes the host paces (without graphs; on the small preset all) run again where a
    # process's host ran slow: a shared host's Python can run at half its pace for minutes, any
    # core, any version (compare_versions.py: the median takes the processes at pace).
    local rerun=(); [ $QUICK = 1 ] || [ "$preset" = large ] || rerun=(--rerun-slow-host \
        "$(tr , '\n' <<< "$modes,$peers" | { [ "$preset" = small ] && cat || grep -v reduce-overhead; } | sort -u | paste -sd,)")
    # The JSON is rewritten after every run: --resume keeps the runs a cut left in it
    local resume=(--resume); [ $FORCE = 1 ] && resume=()
    $PY benchmarks/compare_versions.py --preset "$2" --precision bf16 --device "$DEVICE" \
        --versions $versions --modes $modes --peer-modes $peers --repeats $repeats --eager-repeats $eager \
        "${rerun[@]}" --num-steps "$STEPS" --warmup-steps "$WARMUP" "${sweep[@]}" "${resume[@]}" --output "$out" \
        2>> "$W/compare_$preset.log" | tee -a "$LOG" || failed=1
    finished "$out" || { say "   compare_$preset: incomplete (see $W/compare_$preset.log); run the step again to continue it"; failed=1; }
}

run_step() {
    say "== $1: $(describe_step "$1")"
    case $1 in
    env)
        have "$W/environment.txt" && { say "   done before, skipped"; return; }
        $PY setup/check_environment.py > "$W/environment.txt" 2>&1
        tail -n 3 "$W/environment.txt" ;;
    compare-medium) compare medium $MEDIUM ;;
    compare-small)  compare small $SMALL ;;
    compare-large)  compare large $LARGE ;;
    kernels)
        have "$W/kernels.json" && { say "   done before, skipped"; return; }
        local quick=(); [ $QUICK = 1 ] && quick=(--quick)
        $PY benchmarks/bench_kernels.py "${quick[@]}" --output "$W/kernels.json" \
            > "$W/kernels.log" 2>&1 || failed=1
        tail -n 12 "$W/kernels.log"
        if [ $QUICK = 0 ]; then  # host microseconds per call: a GPU measurement only
            $PY benchmarks/host_overhead.py --output "$W/host_overhead.json" > "$W/host_overhead.log" 2>&1 || failed=1
            tail -n 16 "$W/host_overhead.log"
        fi ;;
    analysis)
        local A="$W/analysis"; mkdir -p "$A"
        if ! have "$A/ceilings.json"; then
            $PY -m benchmarks.ceilings --device "$DEVICE" --out-dir "$A" > "$A/ceilings.log" 2>&1 || failed=1
            tail -n 6 "$A/ceilings.log"
        fi
        train analysis v1_profiled $V1 --preset $MEDIUM --precision bf16 --profile pytorch --profile-dir "$A/v1"
        train analysis v3_profiled $V3 --preset $MEDIUM --precision bf16 --compile --profile pytorch --profile-dir "$A/v3"
        train analysis v4_profiled $V4 --preset $MEDIUM --precision bf16 --compile --profile pytorch --profile-dir "$A/v4"
        [ $limited = 1 ] && return  # the roofline needs all three profiles
        local ceil=(); [ -f "$A/ceilings.json" ] && ceil=(--ceilings "$A/ceilings.json")
        $PY -m analysis_tools roofline --preset $MEDIUM --precision bf16 --device "$DEVICE" "${ceil[@]}" \
            --kernels "v1=$A/v1/pytorch/kernel_table.csv" --kernels "v3=$A/v3/pytorch/kernel_table.csv" \
            --kernels "v4=$A/v4/pytorch/kernel_table.csv" \
            --out-dir "$A" --name roofline_medium.png > "$A/roofline.log" 2>&1 || failed=1
        grep -A 24 "kernel time by category" "$A/roofline.log" || tail -n 5 "$A/roofline.log" ;;
    debug)
        have "$W/debug/outcomes.json" && { say "   done before, skipped"; return; }
        mkdir -p "$W/debug"
        timeout 540 $PY exercises/performance_debugging/run_all_stages.py --preset $MEDIUM \
            --outcomes "$W/debug/outcomes.json" --out-dir "$W/debug" > "$W/debug/stages.log" 2>&1 \
            || failed=1
        grep -E "^stage|symptom|->" "$W/debug/stages.log" | head -20 ;;
    memory)
        run_rows memory
        memory_check "$W/memory" "$W"/memory/v1_*.json && tail -n 8 "$W/memory/memory_check.log" ;;
    levers|fusion|blocks|sdpa) run_rows "$1" ;;
    host)  # a CPU runs each step as it is queued: there is no host and GPU to tell apart
        if [ $QUICK = 1 ]; then say "   skipped: --host-probe reads a GPU"; return; fi
        run_rows host ;;
    switches)
        run_rows switches
        memory_check "$W/switches" "$W"/switches/*.json && head -n 9 "$W/switches/memory_check.log" ;;
    scaling)
        if [ "$NGPU" -lt 2 ]; then say "   skipped: data-parallel scaling needs 2 or more GPUs ($NGPU here)"; return; fi
        # NVLink multicast (NVLS) stays off, as in benchmarks/ddp_scaling.sh (docs/MULTI_GPU.md)
        NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} run_rows scaling
        # Each profiled row: how much of its NCCL/RCCL kernel time ran beside compute, per rank
        # (a 1-GPU run's one trace lies in pytorch/, a torchrun's in rank<N>/pytorch/)
        for dir in "$W"/scaling/*_profile; do
            [ -d "$dir" ] && ! have "$dir/overlap.json" || continue
            mapfile -t traces < <(compgen -G "$dir/rank*/pytorch/*.pt.trace.json*"
                                  compgen -G "$dir/pytorch/*.pt.trace.json*")
            $PY -m analysis_tools overlap "${traces[@]}" --json "$dir/overlap.json" \
                > "$dir/overlap.log" 2>&1 || failed=1
            sed "s|^|   ${dir##*/}: |" "$dir/overlap.log" | tee -a "$LOG"
        done ;;
    flops)
        # V3 runs its Triton kernels in the CPU interpreter (~40 s): --quick leaves it out
        local versions=(v1 v2 v3 v4); [ $QUICK = 1 ] && versions=(v1 v2 v4)
        for v in "${versions[@]}"; do
            local F="$W/flops/$v"
            if have "$F/flopcounter/flops.json" && have "$F/deepspeed/flops.json"; then
                say "   flops/$v: done before, skipped"; continue
            fi
            mkdir -p "$F"
            # A missing tool is a "skipped:" line (exit 0); only a failed profiled run fails
            timeout 300 ./run_all_profilers.sh "$v" --preset "$SMALL" --only flopcounter,deepspeed \
                --out "$F" > "$W/flops/$v.log" 2>&1 || failed=1
            grep -E "^(ran|skipped|failed):" "$W/flops/$v.log" | sed "s/^/   flops\/$v /" | tee -a "$LOG"
        done ;;
    regress)
        if [ ! -f "$BASELINE/summary.json" ]; then
            say "   no published set in $BASELINE: nothing to regress against (publish this one first)"
            return
        fi
        local pairs=()
        for preset in "${COMPARISONS[@]}"; do
            [ -f "$BASELINE/compare_$preset.json" ] && [ -f "$W/compare_$preset.json" ] \
                && pairs+=("$preset")
            if [ -f "$W/compare_$preset.json" ] && ! finished "$W/compare_$preset.json"; then
                say "   compare_$preset.json is incomplete: run compare-$preset again before publishing it"
                failed=1
            fi
        done
        for preset in "${pairs[@]}"; do
            say "   regress compare_$preset (throughput: fail on a drop of more than 5%)"
            $PY -m analysis_tools regress --baseline "$BASELINE/compare_$preset.json" \
                --tolerance throughput=0.05 "$W/compare_$preset.json" | tee -a "$LOG" \
                || failed=1   # pipefail: the status is regress's
        done
        # The scaling rows (each 1-GPU and multi-GPU run), where both sets have them
        local R="$W/.regress"; rm -rf "$R"
        if $PY -m benchmarks.experiments step-rows "$BASELINE/rows.json" scaling "$R/baseline" 2>/dev/null \
                && $PY -m benchmarks.experiments step-rows "$W" scaling "$R/new" 2>/dev/null; then
            say "   regress scaling rows (throughput: fail on a drop of more than 5%)"
            $PY -m analysis_tools regress --baseline "$R/baseline" --tolerance throughput=0.05 "$R/new" \
                | tee -a "$LOG" || failed=1
        fi ;;
    esac
}

# The steps' times on an H200 added up (rows done before are skipped, so less when resuming).
expected=$(for s in "${STEPS_ASKED[@]}"; do  # scaling is skipped below 2 GPUs
               [ "$s" = scaling ] && [ "$NGPU" -lt 2 ] || describe_step "$s"; done \
           | awk '{sub(/^~/, "", $1); t += $1} END {printf "%.0f", t}')
say "reproduce on $GPU ($DEVICE): steps ${STEPS_ASKED[*]}; rows in $W"
[ $QUICK = 1 ] || say "expected: about $expected min on an H200 for these steps from scratch"
for step in "${STEPS_ASKED[@]}"; do [ $limited = 1 ] || run_step "$step"; done
if [ $limited = 1 ]; then
    say "stopped at the time limit after $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s: run the same command again to continue"
    exit 3
fi
say "done in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s$([ $failed = 0 ] || echo ', with failures (see the logs in '"$W"')')"
exit $failed
