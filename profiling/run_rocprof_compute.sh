#!/usr/bin/env bash
# rocprof-compute (formerly Omniperf): hardware counters per kernel, the
# empirical roofline of this GPU, and rocprof-compute's analysis tables.
#
#   profiling/run_rocprof_compute.sh v1 --preset small [--roof-only | --no-roof]
#                                    [--kernel SUBSTRING]...
#
# Runs (docs/PROFILING.md):
#   rocprof-compute profile -n TAG -p OUT/rocprof-compute/TAG [--roof-only] [-k SUBSTR]
#                           -- python tiny_llama_vN.py ...
#   rocprof-compute analyze -p <workload> --save-dfs <workload>/dfs
# It replays the application once per counter pass (many times), so the
# profiled run is short (--num-steps 4 by default) and --kernel narrows it.
#   --roof-only  only the roofline counters: fastest, enough for the plot
#   --no-roof    everything but the roofline micro-benchmarks
# Outputs: the workload folder (pmc_perf.csv, roofline.csv, sysinfo.csv, PDFs),
# analyze.txt, dfs/*.csv, and kernel_table.csv with FLOPs and HBM bytes.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PROFILE_OPTS=()
tool_option() {
    case "$1" in
        --roof-only|--no-roof) PROFILE_OPTS+=("$1"); TOOL_SHIFT=1 ;;
        --kernel|-k) need_value "$1" "${2-}" "a kernel name substring"
                     PROFILE_OPTS+=(-k "$2"); TOOL_SHIFT=2 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup rocprof-compute 4
require_tool rocprof-compute "install ROCm >= 6.2 (rocprofiler-compute) and its Python requirements"

WORKLOAD_ROOT="$TOOL_OUT/$TAG"
run_step rocprof-compute profile -n "$TAG" -p "$WORKLOAD_ROOT" ${PROFILE_OPTS[@]+"${PROFILE_OPTS[@]}"} \
    -- "${APP[@]}" --profile window
expect_output "pmc_perf.csv"
# With -p the files land in that folder or in a <gpu_model>/ folder below it.
WORKLOAD="$(dirname "$(find "$WORKLOAD_ROOT" -name pmc_perf.csv -print -quit)")"
run_step --to "$WORKLOAD/analyze.txt" rocprof-compute analyze -p "$WORKLOAD" --save-dfs "$WORKLOAD/dfs"
kernel_table "$WORKLOAD" rocprof-compute
echo "analysis: $WORKLOAD/analyze.txt, tables: $WORKLOAD/dfs (roofline in the terminal: rocprof-compute analyze -p $WORKLOAD -b 4)"
done_line
