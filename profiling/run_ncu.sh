#!/usr/bin/env bash
# Nsight Compute (NVIDIA): per-kernel time, DRAM bytes and FLOP counters of ONE
# training step after warm-up - the NVIDIA counterpart of rocprof-compute.
#
#   profiling/run_ncu.sh v1 --preset small [--launch-count 200] [--launch-skip 0]
#                        [--kernel REGEX] [--nvtx-include RANGE] [--roofline]
#                        [--metrics LIST] [--whole-run]
#
# Runs (docs/PROFILING.md):
#   ncu --clock-control none --target-processes all --profile-from-start off
#       --launch-count N [--launch-skip S] [-k regex:REGEX] --metrics LIST
#       -f -o OUT/ncu/TAG -- python tiny_llama_vN.py ... --profile window
#   ncu -i OUT/ncu/TAG.ncu-rep --csv --page raw --print-units base > OUT/ncu/TAG.csv
# The training script calls cudaProfilerStart/Stop around the step after
# warm-up (--profile window), so ncu sees only that step. ncu replays every
# kernel several times: it is slow, hence the launch limit.
#   --launch-count N    kernels to profile (default 200); --launch-skip S skips the first S
#   --kernel REGEX      only kernels whose base name matches (a CUTLASS GEMM is "Kernel2")
#   --nvtx-include R    only kernels inside NVTX range R, e.g. "backward/" or "block3/"
#   --roofline          also --set roofline: roofline charts when you open the .ncu-rep
#                       in the Nsight Compute GUI (more replay passes)
#   --whole-run         no capture window: profile from the start of the program
# --clock-control none keeps the GPU at its normal clocks (ncu would lock them
# to base clocks, lowering throughput, and it fails on shared/virtual GPUs).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Time, DRAM traffic and FP instruction counts (fp32 and fp16) per kernel; the
# tensor-pipe count tells whether those FP counters can be trusted for a GEMM.
METRICS="gpu__time_duration.sum,dram__bytes.sum,sm__cycles_elapsed.avg.per_second"
METRICS+=",sm__sass_thread_inst_executed_op_fadd_pred_on.sum,sm__sass_thread_inst_executed_op_fmul_pred_on.sum"
METRICS+=",sm__sass_thread_inst_executed_op_ffma_pred_on.sum,sm__sass_thread_inst_executed_op_hadd_pred_on.sum"
METRICS+=",sm__sass_thread_inst_executed_op_hmul_pred_on.sum,sm__sass_thread_inst_executed_op_hfma_pred_on.sum"
METRICS+=",sm__inst_executed_pipe_tensor.sum"
LAUNCH_COUNT=200
FILTER_OPTS=()
SET_OPTS=()
WINDOW=1
tool_option() {
    case "$1" in
        --launch-count|--launch-skip|--kernel|--nvtx-include|--metrics)
            need_value "$1" "${2-}"
            case "$1" in
                --launch-count) LAUNCH_COUNT=$2 ;;
                --launch-skip) FILTER_OPTS+=(--launch-skip "$2") ;;
                --kernel) FILTER_OPTS+=(-k "regex:$2") ;;
                --nvtx-include) FILTER_OPTS+=(--nvtx --nvtx-include "$2") ;;
                --metrics) METRICS=$2 ;;
            esac
            TOOL_SHIFT=2 ;;
        --roofline) SET_OPTS=(--set roofline); TOOL_SHIFT=1 ;;
        --whole-run) WINDOW=0; TOOL_SHIFT=1 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup ncu $((WARMUP_STEPS + 1))   # warm-up, then the one step ncu captures
require_tool ncu "install Nsight Compute (part of the CUDA toolkit) and add it to PATH"

CAPTURE=(--profile-from-start off)
APP_WINDOW=(--profile window)
if ((WINDOW == 0)); then CAPTURE=(); APP_WINDOW=(); fi
REPORT="$TOOL_OUT/$TAG"
run_step ncu --clock-control none --target-processes all ${CAPTURE[@]+"${CAPTURE[@]}"} \
    --launch-count "$LAUNCH_COUNT" ${FILTER_OPTS[@]+"${FILTER_OPTS[@]}"} \
    ${SET_OPTS[@]+"${SET_OPTS[@]}"} --metrics "$METRICS" -f -o "$REPORT" \
    -- "${APP[@]}" ${APP_WINDOW[@]+"${APP_WINDOW[@]}"}
if [[ ! -f "$REPORT.ncu-rep" ]]; then
    if grep -q "No kernels were profiled" "$TOOL_OUT/ncu.log" 2>/dev/null; then
        die 1 "ncu profiled no kernels: the --kernel/--nvtx-include filter matched nothing (ncu matches base names; see $FAILED_LOG for the kernels it saw)"
    fi
    die 1 "ncu exited 0 but wrote no $REPORT.ncu-rep (see $FAILED_LOG)"
fi
run_step --to "$REPORT.csv" ncu -i "$REPORT.ncu-rep" --csv --page raw --print-units base
kernel_table "$REPORT.csv" ncu
echo "report: $REPORT.ncu-rep (open in the Nsight Compute GUI: ncu-ui)"
done_line
