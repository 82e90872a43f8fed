#!/usr/bin/env bash
# Data-parallel scaling on one node: 1 GPU, then DDP on 2 GPUs, then FSDP2 on 2 GPUs.
# Knobs: STEPS (60), NGPU (2), EXTRA_ARGS (e.g. "--compile", passed to every run), FSDP (1; 0 skips it).
#
#   OUT_DIR=results/ddp bash benchmarks/gpu/ddp.sh
#
# Every run uses the same per-GPU batch (the medium preset's 16 x 512 tokens),
# so 2 GPUs do twice the work per step; scaling efficiency =
# global tokens/s / (2 x single-GPU tokens/s). Target on 2 H200s: >= 90%.
# Writes single.json, ddp2.json, fsdp2.json, scaling.json, topology.txt and
# runs.log to $OUT_DIR. Expected wall time: about 2-3 minutes (mostly start-up:
# three torch imports and NCCL set-up; the timed steps take seconds).
#
# NVLink multicast (NVLS) stays off: this script never sets NCCL_NVLS_ENABLE=1
# (it refuses to run if it is set) and keeps a machine's own value otherwise.
set -euo pipefail

OUT_DIR=${OUT_DIR:-results/ddp}
PY=${PYTHON:-python3}
NGPU=${NGPU:-2}
STEPS=${STEPS:-60}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "${NCCL_NVLS_ENABLE:-0}" = "1" ]; then
    echo "error: NCCL_NVLS_ENABLE=1 is set; this benchmark runs with NVLink multicast off" >&2
    exit 2
fi
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

visible=$($PY -c 'import torch; print(torch.cuda.device_count())')
if [ "$visible" -lt "$NGPU" ]; then
    echo "error: needs $NGPU GPUs, $visible visible" >&2
    exit 2
fi

SCRIPT=version4_sdpa/tiny_llama_v4.py
[ -f "$SCRIPT" ] || SCRIPT=version1_baseline/tiny_llama_v1.py
ARGS=(--preset medium --precision bf16 --num-steps "$STEPS" --warmup-steps 10 --log-every 20 ${EXTRA_ARGS:-})
LOG="$OUT_DIR/runs.log"  # every run's full output
: > "$LOG"
(nvidia-smi topo -m || rocm-smi --showtopo) > "$OUT_DIR/topology.txt" 2>&1 || true

run() {  # run NAME COMMAND...: one line of progress here, everything in the log
    local name=$1; shift
    echo "== $name: $*" | tee -a "$LOG"
    if timeout 150 "$@" >> "$LOG" 2>&1; then
        grep "tok/s | step" "$LOG" | tail -n 1
    else
        echo "   $name failed (exit $?): see $LOG" | tee -a "$LOG"
        return 1
    fi
}
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU")

run "1 GPU" env CUDA_VISIBLE_DEVICES=0 $PY "$SCRIPT" "${ARGS[@]}" --output "$OUT_DIR/single.json"
runs=()
run "DDP x$NGPU" "${TORCHRUN[@]}" "$SCRIPT" "${ARGS[@]}" --output "$OUT_DIR/ddp$NGPU.json" \
    && runs+=("$OUT_DIR/ddp$NGPU.json")
[ "${FSDP:-1}" = 1 ] && run "FSDP2 x$NGPU" "${TORCHRUN[@]}" "$SCRIPT" "${ARGS[@]}" --fsdp --output "$OUT_DIR/fsdp$NGPU.json" \
    && runs+=("$OUT_DIR/fsdp$NGPU.json")

echo
if [ ${#runs[@]} -eq 0 ]; then
    echo "no multi-GPU run succeeded: see $LOG" >&2
    exit 1
fi
$PY -m harness.distributed "$OUT_DIR/single.json" "${runs[@]}" --json "$OUT_DIR/scaling.json"
$PY - "$OUT_DIR/scaling.json" <<'EOF'
import json, sys
for path, row in json.load(open(sys.argv[1]))["runs"].items():
    eff = row["efficiency"]
    verdict = "meets" if eff is not None and eff >= 0.90 else "BELOW"
    print(f"{row['kind']} x{row['world_size']}: scaling efficiency {eff:.1%} ({verdict} the 90% target)")
EOF
