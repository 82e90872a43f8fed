#!/usr/bin/env bash
# Version 3 on one GPU: its tests, its kernel benchmark, and V1/V3/V4 whole-model runs.
#
#   OUT_DIR=results/v3 bash benchmarks/gpu/v3.sh              # everything
#   OUT_DIR=results/v3 bash benchmarks/gpu/v3.sh bench models # some sections
#
# Sections:
#   tests   tests/test_triton_kernels.py + tests/test_v3_model.py on the GPU (PYTEST_ARGS, e.g. -k, narrows them): every kernel
#           against fp64 on odd shapes (outputs NaN-poisoned), bf16/fp16 error <= 2x
#           PyTorch's own, every autotuning candidate, bit-identical repeats, V3 == V1
#   bench   version3_triton/bench_kernels.py: RMSNorm GB/s vs device copy, attention vs
#           SDPA (time ratio, TFLOP/s) -> $OUT_DIR/v3_kernels.json
#   models  medium preset, bf16, 30 steps: V1 eager, V3 and V4 eager + compiled, through
#           each version's command line -> $OUT_DIR/<version>_<mode>.json
# Ends with one compact table. Expected wall time on an H100/H200: about 6-8 minutes
# (tests ~2, bench ~2, models ~3; mostly Triton compiling each kernel variant and
# torch.compile - later runs reuse Triton's on-disk cache).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/v3}
PY=${PYTHON:-python3}
STEPS=${STEPS:-30}
PRESET=${PRESET:-medium}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(tests bench models)
wants() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }
start=$SECONDS
failed=0

$PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "error: v3.sh needs a CUDA or ROCm GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null \
    || rocm-smi --showproductname 2>/dev/null | head -5

if wants tests; then
    echo "== tests ($((SECONDS - start)) s)"
    timeout 600 $PY -m pytest tests/test_triton_kernels.py tests/test_v3_model.py -q ${PYTEST_ARGS:-} \
        -p no:cacheprovider --durations=5 > "$OUT_DIR/tests.log" 2>&1 || failed=1
    tail -n 15 "$OUT_DIR/tests.log"
fi

if wants bench; then
    echo "== kernel benchmark ($((SECONDS - start)) s)"
    timeout 400 $PY version3_triton/bench_kernels.py --output "$OUT_DIR/v3_kernels.json" \
        > "$OUT_DIR/bench_kernels.log" 2>&1 || failed=1
    tail -n 4 "$OUT_DIR/bench_kernels.log"
fi

if wants models; then
    echo "== whole model, $PRESET bf16 ($((SECONDS - start)) s)"
    run() {  # name script args...
        local name=$1 script=$2; shift 2
        if timeout 300 $PY "$script" --preset "$PRESET" --precision bf16 --num-steps "$STEPS" \
                --warmup-steps 10 --quiet --output "$OUT_DIR/$name.json" "$@" \
                >> "$OUT_DIR/models.log" 2>&1; then
            echo "   $name ok ($((SECONDS - start)) s)"
        else
            echo "   $name FAILED (exit $?): $(tail -n 1 "$OUT_DIR/models.log")"; failed=1
        fi
    }
    for name in ${MODELS:-v1_eager v3_eager v4_eager v3_compile v4_compile}; do  # knob: MODELS
        script=$(ls version*_*/tiny_llama_"${name%_*}".py)
        if [ "${name#*_}" = compile ]; then run "$name" "$script" --compile; else run "$name" "$script"; fi
    done
fi

echo
echo "=================== summary ($((SECONDS - start)) s)"
$PY - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path
from harness import report
out = Path(sys.argv[1])
bench = out / "v3_kernels.json"
if bench.exists():
    b = json.loads(bench.read_text())
    print(f"kernels ({b['device']['name']}); copy bandwidth {b['copy_gbs']:,.0f} GB/s")
    for r in b["rmsnorm"]:
        print(f"  rmsnorm {r['shape']} {r['dtype']} {r['impl']:26s} f+b {r['fwd_bwd_ms']:.3f} ms "
              f"(graph {r['fwd_bwd_graph_ms'] or float('nan'):.3f}) {r['gbs']:6.0f} GB/s "
              f"= {100 * r['copy_fraction']:.0f}% of copy")
    for r in b["attention"]:
        ratio = f"  SDPA/ours {r['sdpa_time_over_ours']:.2f}" if "sdpa_time_over_ours" in r else ""
        print(f"  attn {r['shape']:22s} {r['impl'][:26]:26s} f+b {r['fwd_bwd_ms']:.3f} ms "
              f"{r['tflops']:6.1f} TFLOP/s{ratio}")
    for t in b["targets"]:
        print(f"  {'PASS' if t['passed'] else 'MISS'}  {t['claim']}: {t['value']:.2f}")
names = ("v1_eager", "v3_eager", "v4_eager", "v3_compile", "v4_compile")
runs = {n: json.loads((out / f"{n}.json").read_text()) for n in names if (out / f"{n}.json").exists()}
if runs:
    print()
    print(report.format_table(list(runs.values())))
    tps = {k: r["throughput"]["tokens_per_s"] for k, r in runs.items()}
    for claim, a, b, goal in (("V3 eager >= 0.85x V4 eager", "v3_eager", "v4_eager", 0.85),
                              ("V3 compiled >= 0.85x V4 compiled", "v3_compile", "v4_compile", 0.85),
                              ("V3 eager >= 1.5x V1 eager", "v3_eager", "v1_eager", 1.5)):
        if tps.get(a) and tps.get(b):
            ratio = tps[a] / tps[b]
            print(f"  {'PASS' if ratio >= goal else 'MISS'}  {claim}: {ratio:.2f}")
EOF
exit $failed
