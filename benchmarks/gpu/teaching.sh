#!/usr/bin/env bash
# The GPU numbers behind the exercises' instructor answers (exercises/**/*.md).
#
#   OUT_DIR=results/teaching bash benchmarks/gpu/teaching.sh            # everything
#   OUT_DIR=results/teaching bash benchmarks/gpu/teaching.sh debug v2   # some sections
#
# Sections (each fills the "(to be filled from: ...)" placeholders of one exercise; the numbers
# the 2026-11-22 H200 runs already gave - docs/data/h200_2026-11-22/ - are in the exercises):
#   env      setup/check_environment.py on the GPU machine
#   debug    exercises/performance_debugging: stages 1-5, broken vs fixed, medium preset
#   v1       operator table of the medium preset (--profile pytorch); memory vs batch size and
#            sequence length, V1 vs V4 attention memory at seq 256/512/1024
#   levers   precision, batch size, grad checkpointing, data loading (seeds 000/001)
#   v2       fusion ablations (each --no-fused-* alone) and --compile
#   v3       flash-attention block sizes (V3_ATTN_FWD_CONFIG) vs autotuned
#   v4       SDPA backends, whole model; CUDA/HIP graphs (--compile-mode reduce-overhead) on small and medium
#   roofline ceilings of this GPU, V1 and V4 medium profiled, their kernels on the roofline
# Every training run writes $OUT_DIR/<section>/<name>.json (the results schema) and one
# line to $OUT_DIR/<section>/runs.log; the script ends with one compact table per section.
# Expected wall time on one H100/H200: about 15 minutes for everything (about 50 short
# runs of 25 steps: Python start-up, torch.compile and V3's autotuning dominate). Where a
# call is limited to 10 minutes run it in three calls of ~5 minutes each, naming the
# sections as arguments or in TEACHING_SECTIONS (for benchmarks/gpu/run.sh, which passes none):
#   TEACHING_SECTIONS="env debug v1" bash benchmarks/gpu/run.sh teaching
#   TEACHING_SECTIONS="levers v2 v3" bash benchmarks/gpu/run.sh teaching
#   TEACHING_SECTIONS="v4 roofline"  bash benchmarks/gpu/run.sh teaching
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-results/teaching}
PY=${PYTHON:-python3}
STEPS=${STEPS:-25}
MEDIUM=${PRESET:-medium}        # PRESET=tiny SMALL_PRESET=tiny: a quick smoke test on a CPU
SMALL=${SMALL_PRESET:-small}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || read -r -a SECTIONS <<< "${TEACHING_SECTIONS:-env debug v1 levers v2 v3 v4 roofline}"
wants() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }
failed=0

# train SECTION NAME SCRIPT ARGS...: one timed run -> $OUT_DIR/SECTION/NAME.json
train() {
    local section=$1 name=$2 script=$3; shift 3
    if [ ! -f "$script" ]; then echo "   skip $name: $script not written yet"; return 0; fi
    mkdir -p "$OUT_DIR/$section"
    local log="$OUT_DIR/$section/runs.log"
    echo "== $name: $script $*" >> "$log"
    if timeout 300 $PY "$script" --num-steps "$STEPS" --warmup-steps 5 --log-every "$STEPS" \
            --quiet --output "$OUT_DIR/$section/$name.json" "$@" >> "$log" 2>&1; then
        echo "   $name ok"
    else
        local rc=$?
        echo "   $name FAILED (exit $rc): $(tail -n 1 "$log")"
        # Some failures are answers: OOM (exit 3) in the memory exercise, an SDPA backend
        # this GPU lacks (exit 2). OK_EXIT lists them for one call.
        [[ " ${OK_EXIT:-3} " == *" $rc "* ]] || failed=1
    fi
}

if wants env; then
    echo "== env"
    $PY setup/check_environment.py | tee "$OUT_DIR/environment.txt"
fi

if wants debug; then
    echo "== performance debugging ($MEDIUM)"
    timeout 600 $PY exercises/performance_debugging/run_all_stages.py --preset $MEDIUM --json \
        --out-dir "$OUT_DIR/debug" > "$OUT_DIR/perf_debugging.txt" 2>&1 || failed=1
    grep -E "^stage|symptom|->" "$OUT_DIR/perf_debugging.txt"
fi

V1=version1_baseline/tiny_llama_v1.py
V2=version2_fused/tiny_llama_v2.py
V3=version3_triton/tiny_llama_v3.py
V4=version4_sdpa/tiny_llama_v4.py

if wants v1; then
    echo "== v1: operator table and memory vs shape"
    train v1 profile_medium $V1 --preset $MEDIUM --profile pytorch --profile-dir "$OUT_DIR/v1/profiles"
    for b in 4 8 16 32; do train v1 mem_b${b}_s512 $V1 --preset $MEDIUM --batch-size $b; done
    for s in 128 256 512; do train v1 mem_b16_s$s $V1 --preset $MEDIUM --seq-len $s; done
    for s in 256 512 1024; do   # the T x T scores: V1 vs V4 at growing sequence length
        train v1 attn_v1_s$s $V1 --preset $MEDIUM --batch-size 8 --seq-len $s --max-seq-len 1024
        train v1 attn_v4_s$s $V4 --preset $MEDIUM --batch-size 8 --seq-len $s --max-seq-len 1024
    done
fi

if wants levers; then
    echo "== levers: precision, batch size, grad checkpointing, data (seeds 000/001)"
    for p in fp32 tf32 bf16; do train levers prec_$p $V1 --preset $MEDIUM --precision $p; done
    train levers batch8_accum2 $V1 --preset $MEDIUM --batch-size 8 --grad-accum 2
    train levers ckpt_on $V1 --preset $MEDIUM --grad-checkpoint
    train levers ckpt_on_b32 $V1 --preset $MEDIUM --grad-checkpoint --batch-size 32
    train levers data_text $V1 --preset $MEDIUM --data text --vocab-size 1000
    train levers opt_fused $V1 --preset $MEDIUM --optimizer fused
fi

if wants v2; then
    echo "== v2: fusion ablations"
    train v2 v1 $V1 --preset $MEDIUM
    train v2 all_on $V2 --preset $MEDIUM
    for f in fused-qkv fused-gate-up fused-rmsnorm fused-swiglu; do
        train v2 no_${f//-/_} $V2 --preset $MEDIUM --no-$f
    done
    train v2 compiled $V2 --preset $MEDIUM --compile
fi

if wants v3; then
    echo "== v3: flash-attention block sizes"
    train v3 autotuned $V3 --preset $MEDIUM
    for cfg in "BLOCK_M=32,BLOCK_N=32,num_warps=4,num_stages=2" \
               "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=3" \
               "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"; do
        name=fwd_$(echo "$cfg" | sed 's/BLOCK_//g; s/num_//g; s/[=,]/_/g')
        V3_ATTN_FWD_CONFIG="$cfg" train v3 "$name" $V3 --preset $MEDIUM
    done
fi

if wants v4; then
    echo "== v4: SDPA backends and CUDA/HIP graphs"
    for b in auto flash efficient cudnn math; do
        OK_EXIT="2 3" train v4 sdpa_$b $V4 --preset $MEDIUM --sdpa-backend $b
    done
    train v4 small_eager $V4 --preset $SMALL
    train v4 small_compiled $V4 --preset $SMALL --compile
    train v4 small_graphs $V4 --preset $SMALL --compile --compile-mode reduce-overhead
    train v4 medium_graphs $V4 --preset $MEDIUM --compile --compile-mode reduce-overhead
fi

if wants roofline; then
    echo "== roofline: ceilings, V1 and V4 kernels"
    R="$OUT_DIR/roofline"
    mkdir -p "$R"
    timeout 300 $PY -m analysis_tools ceilings --out-dir "$R" > "$R/ceilings.txt" 2>&1 || failed=1
    train roofline v1_profiled $V1 --preset $MEDIUM --profile pytorch --profile-dir "$R/v1"
    train roofline v4_profiled $V4 --preset $MEDIUM --profile pytorch --profile-dir "$R/v4"
    ceilings=(); [ -f "$R/ceilings.json" ] && ceilings=(--ceilings "$R/ceilings.json")
    timeout 300 $PY -m analysis_tools roofline --preset $MEDIUM --precision bf16 --device cuda \
        "${ceilings[@]}" --kernels "v1=$R/v1/pytorch/kernel_table.csv" \
        --kernels "v4=$R/v4/pytorch/kernel_table.csv" --out-dir "$R" > "$R/roofline.txt" 2>&1 \
        || failed=1
    cat "$R/ceilings.txt" 2>/dev/null | tail -n 8
    grep -A 12 "kernel time by category" "$R/roofline.txt" || tail -n 5 "$R/roofline.txt"
fi

echo
$PY - "$OUT_DIR" <<'EOF'
# One compact table per section, from the results JSON files.
import sys
from pathlib import Path
from harness.results import SchemaError, load
for section in sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_dir()):
    rows, device = [], None
    for path in sorted(section.glob("*.json")):
        try:
            r = load(path)
        except SchemaError:  # not a training result (e.g. ceilings.json)
            continue
        device = r["device"]
        t, mem = r["timing_ms"], r["memory"]
        mfu = r["mfu"]["value"]
        rows.append((path.stem, r["run"]["precision"], r["run"]["batch_size"], r["run"]["seq_len"],
                     r["throughput"]["tokens_per_s"], t["step"]["median"], t["forward"]["median"],
                     t["backward"]["median"], mfu * 100 if mfu else float("nan"),
                     mem.get("peak_allocated_mb", mem.get("peak_rss_mb")), r["options"]))
    if not rows:
        continue
    print(f"--- {section.name}: {device['name']}, torch {device['torch']}")
    print(f"{'run':<28} {'prec':>5} {'B':>3} {'T':>5} {'tok/s':>10} {'step ms':>8} {'fwd':>7} "
          f"{'bwd':>7} {'MFU%':>5} {'peak MB':>8}")
    for name, prec, b, s, tps, step, fwd, bwd, mfu, mb, opts in rows:
        print(f"{name:<28} {prec:>5} {b:>3} {s:>5} {tps:>10,.0f} {step:>8.2f} {fwd:>7.2f} "
              f"{bwd:>7.2f} {mfu:>5.1f} {mb:>8,.0f}"
              + (f"  {opts.get('sdpa_kernel')}" if opts.get("sdpa_kernel") else ""))
EOF
exit $failed
