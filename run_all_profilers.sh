#!/usr/bin/env bash
# Profile one version with every profiler that applies to this machine:
#   ./run_all_profilers.sh v1 --preset small
# See profiling/run_all_profilers.sh --help and docs/PROFILING.md.
exec "$(dirname "${BASH_SOURCE[0]}")/profiling/run_all_profilers.sh" "$@"
