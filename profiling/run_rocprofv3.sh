#!/usr/bin/env bash
# rocprofv3: kernel trace + per-kernel statistics of a few training steps (AMD GPUs).
#
#   profiling/run_rocprofv3.sh v1 --preset small [--sys-trace | --runtime-trace]
#                              [--pmc "SQ_WAVES GRBM_GUI_ACTIVE"] [--pftrace]
#
# Runs (docs/PROFILING.md):
#   rocprofv3 --kernel-trace --stats --truncate-kernels --marker-trace
#             --output-format csv [pftrace] -d OUT/rocprofv3 -o TAG -- python tiny_llama_vN.py ...
# and writes OUT/rocprofv3/TAG_kernel_trace.csv, TAG_kernel_stats.csv, the
# ROCTx markers (the trainer's forward/backward/optimizer ranges and the
# "profiled_window" range) and kernel_table.csv, which counts only the kernels
# inside the window. --pftrace adds a Perfetto timeline (TAG_results.pftrace).
#   --sys-trace      also HIP/HSA API calls and memory copies (bigger, slower)
#   --runtime-trace  HIP runtime API, memory copies, markers (lighter than sys)
#   --pmc "C1 C2"    hardware counters per kernel (one pass: rocprofv3 fails if
#                    the set needs more; list them with rocprofv3 -L)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TRACE_OPTS=()
FORMATS=(csv)
tool_option() {
    case "$1" in
        --sys-trace|--runtime-trace) TRACE_OPTS+=("$1"); TOOL_SHIFT=1 ;;
        --pftrace) FORMATS+=(pftrace); TOOL_SHIFT=1 ;;
        --pmc) need_value "$1" "${2-}" "counter names"
               read -ra counters <<<"${2//,/ }"; TRACE_OPTS+=(--pmc "${counters[@]}"); TOOL_SHIFT=2 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup rocprofv3 6
require_tool rocprofv3 "install ROCm >= 6.2 (rocprofiler-sdk) and add /opt/rocm/bin to PATH"

run_step rocprofv3 --kernel-trace --stats --truncate-kernels --marker-trace \
    ${TRACE_OPTS[@]+"${TRACE_OPTS[@]}"} --output-format "${FORMATS[@]}" \
    -d "$TOOL_OUT" -o "$TAG" -- "${APP[@]}" --profile window
expect_output "*kernel_trace.csv"
kernel_table "$TOOL_OUT" rocprofv3
done_line
