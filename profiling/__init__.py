"""Everything about profiling the four versions, in one package.

    run_*.sh, lib.sh   shell runners: one per profiler, each runs a version on a
                       few steps after warm-up (the repository root's
                       run_all_profilers.sh runs every one that applies here)
    parsers/           turn each profiler's output into one kernel table
    sessions.py        in-loop sessions behind `--profile KIND` (the trainer
                       starts one before step 0)
    __main__.py        python -m profiling parse PATH [-o kernel_table.csv]

    import profiling
    table = profiling.parse("profiles/v1/rocprofv3")  # tool detected from the files
    print(profiling.kernel_table.format_table(table))

Importing this package imports the parsers only: no torch, so parsing works on
any machine, GPU or not. sessions.py imports torch and the harness.
"""
from .parsers import (PARSERS, KernelTable, ProfileParseError, categorize, detect, kernel_table,
                      ncu, nsys, parse, rocprof_compute, rocprofv3, torch_profiler)

__all__ = ["parse", "detect", "categorize", "KernelTable", "ProfileParseError", "PARSERS",
           "kernel_table", "rocprofv3", "rocprof_compute", "ncu", "nsys", "torch_profiler"]
