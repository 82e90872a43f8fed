#!/usr/bin/env bash
# The profiling suite on an NVIDIA GPU: run_all_profilers.sh for V1 and V4 on the
# small preset, each profiler's output parsed into the common kernel table.
#
#   OUT_DIR=results/profilers bash benchmarks/gpu/profilers.sh
#
# Per version: the PyTorch profiler (3 steps after warm-up), FlopCounterMode
# (one step, compared with harness/flops.py), DeepSpeed if installed, and
# Nsight Compute on the step after warm-up (--clock-control none,
# --launch-count $NCU_LAUNCHES kernels: ncu replays every kernel, so a whole
# V1 step would take minutes). Then one bounded nsys attempt on V1 (nsys could
# not write reports on some of these machines; the wrapper detects that).
# There is no AMD GPU here: the ROCm wrappers are covered by the fake-tool tests.
#
# Copies to $OUT_DIR/<version>/: the kernel tables (pytorch, ncu, nsys),
# operators.csv, flops.json, ncu's raw CSV (gzipped), run_all's log.
# Prints what ran/skipped and a compact table per version and tool.
# Expected wall time on an H100: about 3-4 minutes (to be confirmed by the run).
#
# Knobs (environment): VERSIONS (v1,v4), PRESET (small), NCU_LAUNCHES (200),
# NSYS_TIMEOUT (60 s; 0 = no nsys attempt), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/profilers}
export PYTHON=${PYTHON:-python3} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
VERSIONS=${VERSIONS:-v1,v4}
PRESET=${PRESET:-small}
NCU_LAUNCHES=${NCU_LAUNCHES:-200}
NSYS_TIMEOUT=${NSYS_TIMEOUT:-60}
PROFILES="$PWD/profiles/gpu_benchmark"
mkdir -p "$OUT_DIR"
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
command -v ncu >/dev/null && ncu --version | tail -n 1

status=0
for version in ${VERSIONS//,/ }; do
    n=${version#v}
    if ! ls version"$n"_*/tiny_llama_v"$n".py >/dev/null 2>&1; then
        echo "=== $version: not written yet, skipped"
        continue
    fi
    echo "=== $version ($((SECONDS - start)) s so far)"
    mkdir -p "$OUT_DIR/$version"
    t0=$SECONDS
    # PROFILE_MEMORY=1: the PyTorch profiler run also dumps an allocator snapshot.
    PROFILE_MEMORY=1 ./run_all_profilers.sh "$version" --preset "$PRESET" --out "$PROFILES/$version" \
        --only pytorch,flopcounter,deepspeed,ncu \
        --args-for ncu "--launch-count $NCU_LAUNCHES" > "$OUT_DIR/$version/run_all.log" 2>&1 || status=1
    echo "    run_all_profilers.sh took $((SECONDS - t0)) s"
    snapshot="$PROFILES/$version/pytorch/memory_snapshot.pickle"
    [[ -f "$snapshot" ]] && echo "    memory snapshot: $(du -h "$snapshot" | cut -f1) (not copied)"
    sed -n '/^=== summary/,$p' "$OUT_DIR/$version/run_all.log" | sed 's/^/    /'
    for tool in pytorch ncu; do
        cp "$PROFILES/$version/$tool/kernel_table.csv" "$OUT_DIR/$version/${tool}_kernel_table.csv" 2>/dev/null
    done
    cp "$PROFILES/$version/pytorch/operators.csv" "$OUT_DIR/$version/" 2>/dev/null
    cp "$PROFILES/$version/flopcounter/flops.json" "$OUT_DIR/$version/flopcounter_flops.json" 2>/dev/null
    cp "$PROFILES/$version/deepspeed/flops.json" "$OUT_DIR/$version/deepspeed_flops.json" 2>/dev/null
    for csv in "$PROFILES/$version"/ncu/"$version"_*.csv; do
        [[ -f "$csv" ]] && gzip -c "$csv" > "$OUT_DIR/$version/ncu_raw.csv.gz"
    done
done

if ((NSYS_TIMEOUT > 0)); then
    echo "=== nsys attempt on v1, at most $NSYS_TIMEOUT s ($((SECONDS - start)) s so far)"
    rc=0
    timeout "$NSYS_TIMEOUT" profiling/run_nsys.sh v1 --preset "$PRESET" --out "$PROFILES/v1" \
        > "$OUT_DIR/v1/nsys.log" 2>&1 || rc=$?
    case $rc in
        0) echo "    nsys ran"; cp "$PROFILES/v1/nsys/kernel_table.csv" "$OUT_DIR/v1/nsys_kernel_table.csv" ;;
        77) echo "    $(grep -m1 '^skipped:' "$OUT_DIR/v1/nsys.log")" ;;
        124) echo "    nsys timed out after $NSYS_TIMEOUT s" ;;
        *) echo "    nsys failed (exit $rc), see nsys.log"; tail -n 5 "$OUT_DIR/v1/nsys.log" | sed 's/^/    /' ;;
    esac
fi

echo
echo "=================== kernel tables ($((SECONDS - start)) s in all)"
"$PYTHON" - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path
from profilers.kernel_table import read_csv

out = Path(sys.argv[1])
print(f"{'version/tool':<16} {'kernels':>7} {'ms':>8}  share by category (top kernel)")
for folder in sorted(p for p in out.iterdir() if p.is_dir()):
    for path in sorted(folder.glob("*_kernel_table.csv")):
        table = read_csv(path)
        cats = " ".join(f"{c[:4]} {s * 100:.0f}%" for c, s in table.by_category().items() if s >= 0.005)
        top = table.rows[0].name[:40] if table.rows else "-"
        tool = path.name.replace("_kernel_table.csv", "")
        print(f"{folder.name + '/' + tool:<16} {len(table.rows):>7} {table.total_us / 1000:>8.2f}  {cats} ({top})")
    for path in sorted(folder.glob("*_flops.json")):
        d = json.loads(path.read_text())
        print(f"{folder.name + '/' + d['tool']:<16} counted {d['counted_flops'] / 1e9:.2f} GFLOP vs "
              f"analytic {d['analytic_flops'] / 1e9:.2f} (ratio {d['ratio']:.3f}; {d['counts']})")
EOF
exit $status
