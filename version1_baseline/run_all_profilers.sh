#!/usr/bin/env bash
# Profile this version (v1) with every profiler that applies to this machine:
#   ./run_all_profilers.sh --preset small
# Same options as profiling/run_all_profilers.sh (see --help and docs/PROFILING.md).
exec "$(dirname "${BASH_SOURCE[0]}")/../profiling/run_all_profilers.sh" v1 "$@"
