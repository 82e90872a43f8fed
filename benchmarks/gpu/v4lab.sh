#!/usr/bin/env bash
# V4 medium: candidate changes side by side, a profiled step, and the ceiling probe's warm-up.
#
#   OUT_DIR=results/v4lab bash benchmarks/gpu/v4lab.sh      (or: bash benchmarks/gpu/run.sh v4lab)
#
# 1. The matmul ceiling probe on a GPU that has been idle for 5 s: 3 warm-up calls (the
#    probe before session 4) against 0.5 s of warm-up (now), twice each, alternating.
# 2. benchmarks/v4_variants.py: one run per VARIANTS entry ("name[:extra flags]", flags
#    joined with commas), all with FLAGS (default: compiled with CUDA graphs and
#    --optimizer master).
# 3. PROFILE=1 (default): V4 compiled (default mode: kernels in CUDA graphs are not
#    attributed), --optimizer master, PyTorch profiler: the kernel table.
# Expected: about 45 s per variant (mostly torch.compile) + 60 s profile + 20 s probe.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/v4lab}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
FLAGS=${FLAGS:---compile --compile-mode reduce-overhead --optimizer master}
VARIANTS=${VARIANTS:-base cat1 cat1+ropehalf swiglu base:--no-fused-gate-up}
COMMON=(--preset medium --precision bf16 --num-steps 40 --warmup-steps 15 --quiet)

echo "== ceiling probe (matmul 8192^3 bf16, TFLOP/s)"
$PY - <<'PY' 2>&1 | tee "$OUT_DIR/probe.log"
import time, torch
from harness.ceilings import measure_matmul_tflops, median_ms
for round in range(2):
    time.sleep(5)  # let the clocks drop, as before a benchmark's first probe
    old = measure_matmul_tflops("cuda", "bf16", warmup=3, repeats=10)  # probe until session 3
    time.sleep(5)
    new = measure_matmul_tflops("cuda", "bf16")                        # 0.5 s warm-up, 20 repeats
    print(f"round {round + 1}: 3 warm-up calls {old:.0f}, 0.5 s warm-up {new:.0f}")
PY

printf '%-34s %12s %9s %8s %8s %8s\n' variant tok/s step_ms fwd bwd opt | tee "$OUT_DIR/table.txt"
for entry in $VARIANTS; do
    name=${entry%%:*}; extra=""; [[ $entry == *:* ]] && extra=${entry#*:}
    out="$OUT_DIR/${entry//[^A-Za-z0-9+_-]/_}.json"
    timeout 200 $PY benchmarks/v4_variants.py "$name" "${COMMON[@]}" $FLAGS ${extra//,/ } \
        --output "$out" > "$out.log" 2>&1 || { echo "$entry failed:"; tail -n 3 "$out.log"; continue; }
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['timing_ms']; print(f'{sys.argv[2]:34s} {r[\"throughput\"][\"tokens_per_s\"]:>12,.0f} {t[\"step\"][\"median\"]:9.2f} {t[\"forward\"][\"median\"]:8.2f} {t[\"backward\"][\"median\"]:8.2f} {t[\"optimizer\"][\"median\"]:8.2f}')" \
        "$out" "$entry" | tee -a "$OUT_DIR/table.txt"
done

if [ "${PROFILE:-1}" = 1 ]; then
    echo "== profile: V4 compiled, --optimizer master"
    timeout 200 $PY version4_sdpa/tiny_llama_v4.py --preset medium --precision bf16 --num-steps 14 --warmup-steps 10 \
        --compile --optimizer master ${PROFILE_FLAGS:-} --profile pytorch --profile-dir "$OUT_DIR/prof_v4" \
        --output "$OUT_DIR/prof_v4.json" > "$OUT_DIR/prof_v4.log" 2>&1 || echo "profile failed"
    find "$OUT_DIR/prof_v4" -name '*.pt.trace.json' -delete 2>/dev/null
    $PY - "$OUT_DIR/prof_v4/pytorch/kernel_table.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
steps = 3  # the profiled steps: harness.profiling.PROFILE_STEPS after warm-up
print(f"{'us/step':>8} {'calls':>5}  category     kernel")
for r in rows[:28]:
    print(f"{float(r['total_us']) / steps:8.1f} {int(r['calls']) // steps:5d}  {r['category']:12s} {r['name'][:90]}")
PY
fi
echo; cat "$OUT_DIR/table.txt"
