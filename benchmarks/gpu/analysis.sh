#!/usr/bin/env bash
# analysis_tools on an NVIDIA GPU: ceilings, V1 and V4 on the small and medium
# presets (bf16), the memory model against measured (and traced) peaks, compare,
# rooflines (analytic + measured ops + ncu kernels) and the report.
#
#   OUT_DIR=results/analysis_gpu bash benchmarks/gpu/analysis.sh
#
# Writes to $OUT_DIR: ceilings.json, memory_check.json, summary.md, report.html
# (self-contained), PNGs (roofline_medium, roofline_small_kernels, compare_*,
# memory_model, ceilings_bandwidth) and runs/<preset>/<version>.json.
# Expected wall time on an H100: about 4 minutes (ncu: +1-2 min; NCU=0 skips it,
# and existing ncu kernel tables from benchmarks/gpu/profilers.sh are reused).
#
# Knobs (environment): STEPS (30), WARMUP (10), PRESETS (small,medium), VERSIONS (v1,v4),
# NCU (1), NCU_LAUNCHES (150), PYTHON (python3), DEVICE (cuda; cpu for a dry run
# with PRESETS=tiny).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/analysis_gpu}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
PRESETS=${PRESETS:-small,medium}
VERSIONS=${VERSIONS:-v1,v4}
NCU=${NCU:-1}
NCU_LAUNCHES=${NCU_LAUNCHES:-150}
DEVICE=${DEVICE:-cuda}
WORK="$PWD/results/analysis_gpu_work"
mkdir -p "$OUT_DIR/runs" "$WORK"
start=$SECONDS
status=0
stamp() { echo "=== $1 ($((SECONDS - start)) s so far)"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
"$PY" -c "import torch; print('torch', torch.__version__,
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"

stamp "ceilings"
"$PY" -m analysis_tools ceilings --device "$DEVICE" --sweep --out-dir "$OUT_DIR" || status=1

for preset in ${PRESETS//,/ }; do
    for version in ${VERSIONS//,/ }; do
        n=${version#v}
        script=$(ls version"$n"_*/tiny_llama_v"$n".py 2>/dev/null | head -n 1)
        if [[ -z "$script" ]]; then echo "    $version: not written yet, skipped"; continue; fi
        stamp "$version $preset bf16, $STEPS steps"
        mkdir -p "$OUT_DIR/runs/$preset"
        "$PY" "$script" --preset "$preset" --precision bf16 --device "$DEVICE" --num-steps "$STEPS" --warmup-steps "$WARMUP" \
            --output "$OUT_DIR/runs/$preset/$version.json" --quiet || { echo "    FAILED"; status=1; }
    done
done

stamp "memory model vs measured (and a traced rerun of one step per run)"
"$PY" -m analysis_tools memory "$OUT_DIR"/runs/* --trace --json "$OUT_DIR/memory_check.json" \
    --out-dir "$OUT_DIR" || status=1

for preset in ${PRESETS//,/ }; do
    stamp "compare $preset"
    "$PY" -m analysis_tools compare "$OUT_DIR/runs/$preset" --out-dir "$WORK/compare_$preset" || status=1
done
for preset in ${PRESETS//,/ }; do
    cp "$WORK/compare_$preset/compare_step_time.png" "$OUT_DIR/compare_${preset}_step_time.png" 2>/dev/null
done
cp "$WORK/compare_${PRESETS##*,}/compare_throughput.png" "$OUT_DIR/compare_${PRESETS##*,}_throughput.png" 2>/dev/null

# ncu kernel tables for the small preset: reuse profilers.sh's, else a short ncu run.
kernels=()
for version in ${VERSIONS//,/ }; do
    table=""
    for candidate in /tmp/gpu_bench/profilers/"$version"/ncu_kernel_table.csv \
                     results/profilers/"$version"/ncu_kernel_table.csv; do
        [[ -f "$candidate" ]] && table=$candidate && break
    done
    if [[ -z "$table" && "$NCU" == 1 ]] && command -v ncu >/dev/null; then
        stamp "ncu $version small ($NCU_LAUNCHES kernels)"
        timeout 240 profiling/run_ncu.sh "$version" --preset small --launch-count "$NCU_LAUNCHES" \
            --out "$WORK/profiles/$version" > "$WORK/ncu_$version.log" 2>&1 || tail -n 3 "$WORK/ncu_$version.log"
        [[ -f "$WORK/profiles/$version/ncu/kernel_table.csv" ]] && table="$WORK/profiles/$version/ncu/kernel_table.csv"
    fi
    [[ -n "$table" ]] && kernels+=(--kernels "$version=$table") || echo "    no ncu kernel table for $version"
done

big=${PRESETS##*,}   # the last preset (medium by default)
stamp "roofline $big: analytic ops, every op timed alone, runs"
"$PY" -m analysis_tools roofline "$OUT_DIR"/runs/"$big"/*.json --ceilings "$OUT_DIR/ceilings.json" \
    --measure-ops --device "$DEVICE" --name "roofline_$big.png" --out-dir "$OUT_DIR" || status=1
small=${PRESETS%%,*}
stamp "roofline $small: with ncu kernel points"
"$PY" -m analysis_tools roofline "$OUT_DIR"/runs/"$small"/*.json --ceilings "$OUT_DIR/ceilings.json" \
    ${kernels[@]+"${kernels[@]}"} --name "roofline_${small}_kernels.png" --out-dir "$OUT_DIR" || status=1

stamp "report"
"$PY" -m analysis_tools report "$OUT_DIR"/runs/* --ceilings "$OUT_DIR/ceilings.json" \
    ${kernels[@]+"${kernels[@]}"} --title "Tiny LLaMA workshop: V1 vs V4 ($(date -u +%Y-%m-%d))" \
    --out-dir "$WORK/report" || status=1
cp "$WORK/report/report.html" "$WORK/report/summary.md" "$WORK/report/memory_model.png" "$OUT_DIR/" 2>/dev/null

echo
echo "=================== summary ($((SECONDS - start)) s in all)"
"$PY" - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path
import pandas as pd
from analysis_tools.common import load_results, text_table
from analysis_tools.compare import FLOAT_FORMATS, comparison_table
out = Path(sys.argv[1])
c = json.loads((out / "ceilings.json").read_text())
print("ceilings:", {k: round(v, 1) for k, v in c["measured"]["matmul_tflops"].items()}, "TFLOP/s;",
      f"copy {c['measured']['copy_gbs']:.0f} GB/s; datasheet {c['datasheet']}")
for preset in sorted(p.name for p in (out / "runs").iterdir()):
    results = load_results(sorted((out / "runs" / preset).glob("*.json")) or [out / "runs" / preset])
    print(f"\n{preset}:")
    print(text_table(comparison_table(results), FLOAT_FORMATS))
if not (out / "memory_check.json").exists():
    sys.exit("no memory_check.json: the memory step failed")
mem = pd.read_json(out / "memory_check.json")
cols = [c for c in ("run", "predicted MiB", "measured MiB", "error %", "traced MiB",
                    "traced max_allocated MiB", "peak moment") if c in mem.columns]
print("\nmemory model (target: |error| <= 15% for v1 and v4, small and medium):")
print(text_table(mem[cols], {"predicted MiB": ",.0f", "measured MiB": ",.0f", "error %": "+.1f",
                             "traced MiB": ",.0f", "traced max_allocated MiB": ",.0f"}))
EOF
ls -la "$OUT_DIR"
exit $status
