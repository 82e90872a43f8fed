#!/usr/bin/env bash
# Nsight Systems (NVIDIA): a timeline of the training steps after warm-up -
# CUDA API, kernels, memory copies, NVTX ranges - the counterpart of rocprof-sys.
#
#   profiling/run_nsys.sh v1 --preset small [--trace cuda,nvtx,osrt] [--whole-run]
#
# Runs (docs/PROFILING.md):
#   nsys profile -t cuda,nvtx,osrt --capture-range=cudaProfilerApi --capture-range-end=stop
#                -f true -o OUT/nsys/TAG -- python tiny_llama_vN.py ... --profile window
#   nsys stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum -f csv --force-export=true
#              -o OUT/nsys/TAG OUT/nsys/TAG.nsys-rep
# Open TAG.nsys-rep in the Nsight Systems GUI (nsys-ui); kernel_table.csv is
# parsed from TAG_cuda_gpu_kern_sum.csv. nsys does not work on every machine
# (on some it only writes a .qdstrm and reports "Importer error"): then this
# wrapper says so and exits as "skipped" - use run_ncu.sh or the PyTorch profiler.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TRACE=cuda,nvtx,osrt
WINDOW=1
tool_option() {
    case "$1" in
        --trace) need_value "$1" "${2-}" "a list"; TRACE=$2; TOOL_SHIFT=2 ;;
        --whole-run) WINDOW=0; TOOL_SHIFT=1 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup nsys 6
require_tool nsys "install Nsight Systems (part of the CUDA toolkit) and add it to PATH"

CAPTURE=(--capture-range=cudaProfilerApi --capture-range-end=stop)
APP_WINDOW=(--profile window)
if ((WINDOW == 0)); then CAPTURE=(); APP_WINDOW=(); fi
REPORT="$TOOL_OUT/$TAG"
run_step nsys profile -t "$TRACE" ${CAPTURE[@]+"${CAPTURE[@]}"} -f true -o "$REPORT" \
    -- "${APP[@]}" ${APP_WINDOW[@]+"${APP_WINDOW[@]}"}
if [[ ! -f "$REPORT.nsys-rep" ]]; then
    skip nsys "ran but could not write $REPORT.nsys-rep on this machine (a known importer problem; see $FAILED_LOG) - use run_ncu.sh or the PyTorch profiler"
fi
run_step nsys stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum -f csv --force-export=true \
    -o "$REPORT" "$REPORT.nsys-rep"
expect_output "*cuda_gpu_kern_sum*.csv"
kernel_table "$TOOL_OUT" nsys
echo "report: $REPORT.nsys-rep (open in the Nsight Systems GUI: nsys-ui)"
done_line
