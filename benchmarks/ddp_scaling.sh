#!/usr/bin/env bash
# Data-parallel scaling on one node: 1 GPU, then DDP on 2 GPUs, then FSDP2 on 2 GPUs.
# Knobs: STEPS (60), WARMUP (10), NGPU (2), EXTRA_ARGS (e.g. "--compile", passed to every run), FSDP (1; 0 skips it).
#
#   OUT_DIR=results/ddp bash benchmarks/ddp_scaling.sh
#
# Variant mode: one 1-GPU baseline, then one DDP run per variant, then one table.
#
#   VARIANTS="base bucket100 bf16 whole bf16+bucket100" EXTRA_ARGS=--compile PROFILE=1 \
#       OUT_DIR=results/ddp bash benchmarks/ddp_scaling.sh
#
#   variant     flags (only the multi-GPU runs get them; see docs/MULTI_GPU.md)
#   base        none: DDP with 25 MB buckets, fp32 all-reduce (the defaults that replace
#               DDP: with --optimizer master in EXTRA_ARGS the sharded optimizer, with
#               --compile and bf16 the all-reduce after backward)
#   bucketN     --ddp-bucket-mb N             (bucket50, bucket100, bucket200, bucket1000 ...)
#   bf16, fp16  --ddp-comm-hook bf16|fp16     (gradients all-reduced in 16 bits)
#   whole       --compile-ddp whole           (with --compile: one graph, all-reduce after backward)
#   static      --ddp-static-graph            (DDP fixes its bucket order after step 1)
#   shard       --shard-optimizer             (no DDP: reduce-scatter, 1/N of the optimizer
#                                              step, all-gather)
#   after       --reduce-after-backward       (no DDP: all-reduce after backward, in bf16
#                                              under bf16, each piece updated as it lands)
#   ddp         --no-shard-optimizer --no-reduce-after-backward (DDP where a default
#                                              replaces it: master weights, or --compile)
#   normalprio  --comm-priority normal        (NCCL on a normal-priority stream)
#   nchN        env NCCL_MAX_NCHANNELS=N      (NCCL uses at most N channels, i.e. fewer SMs
#                                              taken from the backward it overlaps; nch4 ...)
#   fsdp        --fsdp                        (FSDP2 instead of DDP)
#   noreshard   --fsdp --fsdp-reshard-after-forward false
#   bf16params  --fsdp --fsdp-param-dtype bf16
#   a+b         both, e.g. bf16+bucket100
# PROFILE=1 then runs the first variant once more under the PyTorch profiler and
# prints how much of the NCCL kernel time overlapped compute (python -m
# analysis_tools overlap); rank 0's trace is kept (gzipped), the others' dropped.
# RUN_TIMEOUT (150) caps each run; BUDGET_S (540) caps the whole script: a run that
# would start too late is skipped, so the table always comes out.
#
# Every run uses the same per-GPU batch (the medium preset's 16 x 512 tokens),
# so 2 GPUs do twice the work per step; scaling efficiency =
# global tokens/s / (2 x single-GPU tokens/s). A well-tuned run on NVLink reaches 90% or more.
# Writes single.json, one JSON per multi-GPU run (ddp2.json, fsdp2.json,
# ddp2_<variant>.json), scaling.json, topology.txt and runs.log to $OUT_DIR
# (profile/ with PROFILE=1). Wall time: about 30-90 s per run, mostly start-up
# (torch import, NCCL set-up, torch.compile); the timed steps take seconds.
# The script prints its estimate first.
#
# NVLink multicast (NVLS) stays off: this script never sets NCCL_NVLS_ENABLE=1
# (it refuses to run if it is set) and keeps a machine's own value otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=${OUT_DIR:-results/ddp}
PY=${PYTHON:-python3}
NGPU=${NGPU:-2}
STEPS=${STEPS:-60}
WARMUP=${WARMUP:-10}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
BUDGET_S=${BUDGET_S:-540}
MIN_RUN_S=45   # a run given less time than this cannot finish: skip it instead
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "${NCCL_NVLS_ENABLE:-0}" = "1" ]; then
    echo "error: NCCL_NVLS_ENABLE=1 is set; this benchmark runs with NVLink multicast off" >&2
    exit 2
fi
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

variant_flags() {  # variant_flags NAME: its flags on stdout; exit 2 on an unknown part
    local part flags=()
    for part in ${1//+/ }; do
        case $part in
            base) ;;
            bucket[0-9]*) flags+=(--ddp-bucket-mb "${part#bucket}") ;;
            bf16 | fp16) flags+=(--ddp-comm-hook "$part") ;;
            whole) flags+=(--compile-ddp whole) ;;
            static) flags+=(--ddp-static-graph) ;;
            shard) flags+=(--shard-optimizer) ;;
            after) flags+=(--reduce-after-backward) ;;
            ddp) flags+=(--no-shard-optimizer --no-reduce-after-backward) ;;
            normalprio) flags+=(--comm-priority normal) ;;
            nch[0-9]*) ;;  # an environment variable: see variant_env
            fsdp) flags+=(--fsdp) ;;
            noreshard) flags+=(--fsdp --fsdp-reshard-after-forward false) ;;
            bf16params) flags+=(--fsdp --fsdp-param-dtype bf16) ;;
            *) echo "error: unknown variant '$part' in '$1' (known: base bucketN bf16 fp16" \
                    "whole static shard after ddp normalprio nchN fsdp noreshard bf16params, joined with +)" >&2
               return 2 ;;
        esac
    done
    echo "${flags[*]}"
}

variant_env() {  # variant_env NAME: the environment assignments it adds (for `env`)
    local part
    for part in ${1//+/ }; do
        [[ $part == nch[0-9]* ]] && echo "NCCL_MAX_NCHANNELS=${part#nch}"
    done
}

if [ -n "${VARIANTS:-}" ]; then
    read -r -a variants <<< "$VARIANTS"
else  # the default: plain DDP, and FSDP2 unless FSDP=0
    variants=(base)
    [ "${FSDP:-1}" = 1 ] && variants+=(fsdp)
fi
for name in "${variants[@]}"; do variant_flags "$name" > /dev/null || exit 2; done  # typos fail now

visible=$($PY -c 'import torch; print(torch.cuda.device_count())')
if [ "$visible" -lt "$NGPU" ]; then
    echo "error: needs $NGPU GPUs, $visible visible" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"  # only once every check has passed: a refused run leaves nothing behind

SCRIPT=version4_sdpa/tiny_llama_v4.py
[ -f "$SCRIPT" ] || SCRIPT=version1_baseline/tiny_llama_v1.py
ARGS=(--preset medium --precision bf16 --num-steps "$STEPS" --warmup-steps "$WARMUP" --log-every 20 ${EXTRA_ARGS:-})
LOG="$OUT_DIR/runs.log"  # every run's full output
: > "$LOG"
(nvidia-smi topo -m || rocm-smi --showtopo) > "$OUT_DIR/topology.txt" 2>&1 || true

planned=$((1 + ${#variants[@]} + ${PROFILE:-0}))
echo "plan: 1 GPU baseline, ${#variants[@]} x $NGPU-GPU run(s) (${variants[*]})$([ "${PROFILE:-0}" = 1 ] && echo ", 1 profiled run")"
echo "expected wall time: $planned runs x 30-90 s = about $((planned / 2 + 1))-$((planned * 3 / 2)) min" \
     "(compile and NCCL set-up dominate; capped at $BUDGET_S s)"
deadline=$((SECONDS + BUDGET_S))

run() {  # run NAME COMMAND...: one line of progress here, everything in the log
    local name=$1; shift
    local left=$((deadline - SECONDS))
    if [ "$left" -lt "$MIN_RUN_S" ]; then
        echo "   $name skipped: ${left} s left of BUDGET_S=$BUDGET_S" | tee -a "$LOG"
        return 1
    fi
    echo "== $name: $*" | tee -a "$LOG"
    if timeout $((left < RUN_TIMEOUT ? left : RUN_TIMEOUT)) "$@" >> "$LOG" 2>&1; then
        grep "tok/s | step" "$LOG" | tail -n 1
    else
        echo "   $name failed (exit $?): see $LOG" | tee -a "$LOG"
        return 1
    fi
}
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU")

run "1 GPU" env CUDA_VISIBLE_DEVICES=0 $PY "$SCRIPT" "${ARGS[@]}" --output "$OUT_DIR/single.json" || {
    echo "the 1-GPU baseline failed: see $LOG" >&2; exit 1; }
runs=() missing=()
for name in "${variants[@]}"; do
    read -r -a flags <<< "$(variant_flags "$name")"
    kind=ddp; [[ " ${flags[*]} " == *" --fsdp "* ]] && kind=fsdp
    file="$OUT_DIR/$kind$NGPU.json"  # base and fsdp keep the names of the default mode
    [[ $name == base || $name == fsdp ]] || file="$OUT_DIR/$kind${NGPU}_${name//+/_}.json"
    mapfile -t envs < <(variant_env "$name")
    run "${kind^^} x$NGPU [$name]" env "${envs[@]}" "${TORCHRUN[@]}" "$SCRIPT" "${ARGS[@]}" "${flags[@]}" \
        --output "$file" && runs+=("$file") || missing+=("$name")
done

if [ "${PROFILE:-0}" = 1 ]; then
    # The profiled steps come right after warm-up; a few are enough (profiling/sessions.py).
    read -r -a flags <<< "$(variant_flags "${variants[0]}")"
    mapfile -t envs < <(variant_env "${variants[0]}")
    if run "profile [${variants[0]}]" env "${envs[@]}" "${TORCHRUN[@]}" "$SCRIPT" "${ARGS[@]}" "${flags[@]}" \
            --num-steps $((WARMUP + 4)) --profile pytorch --profile-dir "$OUT_DIR/profile" \
            --output "$OUT_DIR/profile/run.json"; then
        mapfile -t traces < <(find "$OUT_DIR/profile" -name '*.pt.trace.json' | sort)
        echo "communication/compute overlap (profiled steps; NCCL kernels also run while waiting for the other rank):"
        $PY -m analysis_tools overlap "${traces[@]}" | tee -a "$LOG" || true
        for trace in "${traces[@]}"; do  # keep rank 0's trace only, compressed (Perfetto opens .gz)
            if [[ $trace == */rank0/* ]]; then gzip -f "$trace"; else rm -f "$trace"; fi
        done
    fi
fi

echo
if [ ${#runs[@]} -eq 0 ]; then
    echo "no multi-GPU run succeeded: see $LOG" >&2
    exit 1
fi
$PY -m analysis_tools scaling "$OUT_DIR/single.json" "${runs[@]}" --json "$OUT_DIR/scaling.json"
$PY - "$OUT_DIR/scaling.json" <<'EOF'
import json, os, sys
for path, row in json.load(open(sys.argv[1]))["runs"].items():
    eff = row["efficiency"]
    verdict = "meets" if eff is not None and eff >= 0.90 else "BELOW"
    print(f"{os.path.basename(path)}: {row['kind']} x{row['world_size']} ({row['variant']}): "
          f"scaling efficiency {eff:.1%} ({verdict} the 90% target)")
EOF
[ ${#missing[@]} -eq 0 ] || echo "failed or skipped (see $LOG): ${missing[*]}"
