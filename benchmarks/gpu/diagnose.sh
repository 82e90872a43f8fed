#!/usr/bin/env bash
# Why is a version as fast as it is? Host cost per call, a profiled compiled step, mode variants.
#
#   OUT_DIR=results/diagnose bash benchmarks/gpu/diagnose.sh                 # everything
#   OUT_DIR=results/diagnose bash benchmarks/gpu/diagnose.sh host v4profile  # some sections
#   DIAGNOSE="host normcfg" bash benchmarks/gpu/run.sh diagnose              # the same, via run.sh
#
# Sections:
#   host       benchmarks/host_overhead.py --cprofile 30: host microseconds per call of a raw
#              Triton launch, V3's launchers/autograd functions, F.rms_norm and SDPA
#   normcfg    version3_triton/bench_kernels.py --kernels rmsnorm with a few forced RMSNorm configs
#   v4profile  V4 medium compiled, PyTorch profiler over 3 steps: kernel table by category
#   v4modes    V4 medium bf16 compiled: reduce-overhead (CUDA graphs) and each SDPA backend
#   v3profile  V3 medium eager, PyTorch profiler: where the host time goes
# Knobs: STEPS (30), WARMUP (10), V4_MODES ("default reduce-overhead"), V4_BACKENDS
# ("cudnn flash efficient"). Expected: 4-6 minutes on an H100/H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/diagnose}
PY=${PYTHON:-python3}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || read -r -a SECTIONS <<< "${DIAGNOSE:-host normcfg v4profile v4modes v3profile}"
wants() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }
start=$SECONDS
failed=0
say() { echo "== $1 ($((SECONDS - start)) s)"; }

if wants host; then
    say host
    $PY benchmarks/host_overhead.py --cprofile 30 --output "$OUT_DIR/host_overhead.json" \
        > "$OUT_DIR/host_overhead.log" 2>&1 || failed=1
    head -n 16 "$OUT_DIR/host_overhead.log"
fi

if wants normcfg; then  # RMSNorm launch configurations other than the rule's (bench only)
    say normcfg
    for cfg in "" "rmsnorm_bwd=BLOCK_ROWS=2,num_warps=4,num_stages=3" \
               "rmsnorm_bwd=BLOCK_ROWS=4,num_warps=8,num_stages=2" \
               "rmsnorm_fwd=BLOCK_ROWS=2,num_warps=8,num_stages=1" \
               "rmsnorm_fwd=BLOCK_ROWS=4,num_warps=8,num_stages=2"; do
        kernel=${cfg%%=*}; value=${cfg#*=}
        env ${cfg:+V3_${kernel^^}_CONFIG=$value} $PY version3_triton/bench_kernels.py --kernels rmsnorm \
            > "$OUT_DIR/normcfg.log" 2>&1 || failed=1
        echo "  ${cfg:-rule}:"; grep -E "triton |rmsnorm_(fwd|bwd) " "$OUT_DIR/normcfg.log" | head -n 4
    done
fi

train() {  # name, version, extra args...
    local name=$1 version=$2; shift 2
    local script
    script=$(ls version*_*/tiny_llama_"$version".py)
    timeout 240 $PY "$script" --preset medium --precision bf16 --num-steps "$STEPS" \
        --warmup-steps "$WARMUP" --log-every 10 --output "$OUT_DIR/$name.json" "$@" \
        > "$OUT_DIR/$name.log" 2>&1 || { failed=1; echo "$name failed:"; tail -n 5 "$OUT_DIR/$name.log"; }
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['timing_ms']; print(f'  {sys.argv[2]:34s} {r[\"throughput\"][\"tokens_per_s\"]:>10,.0f} tok/s  step {t[\"step\"][\"median\"]:.2f} ms (fwd {t[\"forward\"][\"median\"]:.2f} bwd {t[\"backward\"][\"median\"]:.2f} opt {t[\"optimizer\"][\"median\"]:.2f})  MFU {r[\"mfu\"][\"value\"]*100:.1f}%')" \
        "$OUT_DIR/$name.json" "$name" 2>/dev/null
}

if wants v4profile; then
    say v4profile
    train v4_compile_profile v4 --compile --profile pytorch --profile-dir "$OUT_DIR/prof_v4"
    grep -A 40 -i "kernel" "$OUT_DIR/v4_compile_profile.log" | head -n 60
fi

if wants v4modes; then
    say v4modes
    for mode in ${V4_MODES:-default reduce-overhead}; do
        train "v4_compile_$mode" v4 --compile --compile-mode "$mode"
    done
    for backend in ${V4_BACKENDS:-cudnn flash efficient}; do
        train "v4_compile_sdpa_$backend" v4 --compile --sdpa-backend "$backend"
    done
fi

if wants v3profile; then
    say v3profile
    train v3_eager_profile v3 --profile pytorch --profile-dir "$OUT_DIR/prof_v3"
    grep -A 40 -i "kernel" "$OUT_DIR/v3_eager_profile.log" | head -n 60
fi

say "done, failed=$failed"
exit $failed
