"""Parsers that turn every profiler's output into one kernel table.

    from profiling.parsers import kernel_table, parse
    table = parse("profiles/v1/rocprofv3")          # tool detected from the files
    print(kernel_table.format_table(table))

Command line: python -m profiling parse PATH [-o kernel_table.csv] (see --help).
Nothing here imports torch: parsing works on any machine, GPU or not.
"""
from __future__ import annotations

from pathlib import Path

from . import kernel_table, ncu, nsys, rocprof_compute, rocprofv3, torch_profiler
from .kernel_table import KernelTable, ProfileParseError, categorize

PARSERS = {"rocprofv3": rocprofv3.parse, "rocprof-compute": rocprof_compute.parse,
           "ncu": ncu.parse, "nsys": nsys.parse, "pytorch": torch_profiler.parse,
           "kernel-table": kernel_table.read_csv}
KERNEL_TABLE_HEADER = ",".join(kernel_table.COLUMNS)


def _head(path: Path, lines: int = 30) -> list[str]:
    with path.open(errors="replace") as f:
        return [line for _, line in zip(range(lines), f)]


def is_kernel_table(path) -> bool:
    """A kernel table this package wrote (kernel_table.csv): read back as it is."""
    path = Path(path)
    return (path.is_file() and path.suffix == ".csv"
            and _head(path, 1)[:1] == [KERNEL_TABLE_HEADER + "\n"])


def detect(path) -> str:
    """Which tool wrote this file or folder (one of PARSERS)."""
    path = Path(path)
    if path.is_dir():
        checks = [("rocprof-compute", "pmc_perf.csv"), ("rocprofv3", "*kernel_trace.csv"),
                  ("rocprofv3", "*kernel_stats.csv"), ("pytorch", "*.pt.trace.json*"),
                  ("pytorch", "operators.csv"), ("nsys", "*kern_sum*.csv"),
                  ("nsys", "*gpukernsum*.csv")]
        for tool, pattern in checks:
            if next(path.rglob(pattern), None) is not None:
                return tool
        if any(detect(f) == "ncu" for f in path.glob("*.csv") if f.name != "kernel_table.csv"):
            return "ncu"
        if is_kernel_table(path / "kernel_table.csv"):
            return "kernel-table"
        raise ProfileParseError(f"{path}: found no profiler output here")
    if not path.is_file():
        raise ProfileParseError(f"{path}: no such file or folder")
    name = path.name
    if is_kernel_table(path):
        return "kernel-table"
    if name.endswith(("kernel_trace.csv", "kernel_stats.csv")):
        return "rocprofv3"
    if name == "pmc_perf.csv":
        return "rocprof-compute"
    if name.endswith((".json", ".json.gz")) or name == "operators.csv":
        return "pytorch"
    if "kern_sum" in name or "gpukernsum" in name:
        return "nsys"
    lines = _head(path) if path.suffix == ".csv" else []
    if any(line.startswith("==PROF==") for line in lines):
        return "ncu"  # ncu's own log lines, also in a run that profiled nothing
    head = next((line for line in lines if line.strip() and not line.startswith("==")), "")
    if head.startswith(('"ID","Process ID"', "ID,Process ID")):
        return "ncu"
    if '"Kernel_Name"' in head or head.startswith('"Name","Calls","TotalDurationNs"'):
        return "rocprofv3"
    if "Total Time" in head:
        return "nsys"
    raise ProfileParseError(f"{path}: cannot tell which profiler wrote this (pass --tool)")


def parse(path, tool: str | None = None) -> KernelTable:
    if Path(path).is_dir() and detect(path) == "kernel-table":
        path = Path(path) / "kernel_table.csv"
    if is_kernel_table(path):
        return kernel_table.read_csv(path)  # whichever tool made it, it is the common table
    tool = tool or detect(path)
    if tool not in PARSERS:
        raise ProfileParseError(f"unknown tool {tool!r} (one of {', '.join(PARSERS)})")
    return PARSERS[tool](path)


__all__ = ["parse", "detect", "categorize", "KernelTable", "ProfileParseError", "PARSERS",
           "kernel_table", "rocprofv3", "rocprof_compute", "ncu", "nsys", "torch_profiler"]
