#!/usr/bin/env bash
# rocprof-sys (ROCm Systems Profiler): a whole-system Perfetto timeline - CPU
# call stacks, HIP API, kernels, memory copies - of a few training steps.
#
#   profiling/run_rocprof_sys.sh v1 --preset small [--mode sample|run] [--config FILE]
#
# Runs (docs/PROFILING.md), with deterministic output names:
#   ROCPROFSYS_OUTPUT_PATH=OUT/rocprof-sys ROCPROFSYS_TIME_OUTPUT=OFF ROCPROFSYS_USE_PID=OFF
#   rocprof-sys-sample --trace --profile -- python tiny_llama_vN.py ...   (default)
#   rocprof-sys-run    --trace --profile -- python tiny_llama_vN.py ...   (--mode run)
# sample = call-stack sampling with ROCm tracing, no instrumentation: the mode
# the docs recommend for Python. --config FILE passes a settings file made by
# `rocprof-sys-avail -G FILE` (then edit it). Open OUT/rocprof-sys/perfetto-trace.proto
# in https://ui.perfetto.dev. rocprof-sys does not capture child threads and
# is a timeline tool: use run_rocprofv3.sh for kernel statistics.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODE=sample
CONFIG=()
tool_option() {
    case "$1" in
        --mode) need_choice "$1" "${2-}" sample run; MODE=$2; TOOL_SHIFT=2 ;;
        --config) need_value "$1" "${2-}" "a file"
                  [[ -f "$2" ]] || die 2 "--config $2: no such file"
                  CONFIG=(--config "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); TOOL_SHIFT=2 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup rocprof-sys 6
require_tool "rocprof-sys-$MODE" "install ROCm >= 6.3 (rocprofiler-systems) and add /opt/rocm/bin to PATH"

export ROCPROFSYS_OUTPUT_PATH="$TOOL_OUT" ROCPROFSYS_TIME_OUTPUT=OFF ROCPROFSYS_USE_PID=OFF
run_step "rocprof-sys-$MODE" ${CONFIG[@]+"${CONFIG[@]}"} --trace --profile -- "${APP[@]}" --profile window
expect_output "perfetto-trace*.proto"
done_line
