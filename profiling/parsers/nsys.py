"""Nsight Systems `nsys stats` CSV -> kernel table.

`profiling/run_nsys.sh` runs
    nsys stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum -f csv -o OUT/nsys/TAG REPORT.nsys-rep
which writes TAG_cuda_gpu_kern_sum.csv and TAG_cuda_gpu_mem_time_sum.csv.
(Before nsys 2023.1 the reports were called gpukernsum / gpumemtimesum.)

Format (NVIDIA's cuda_gpu_kern_sum.py report script, in the Nsight Systems install):
    Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
Some versions quote every field; log lines ("Generating SQLite file ...") may
come first, so we look for the line naming "Total Time"; --timeunit changes
"(ns)" to "(us)" or "(ms)". The memory report says Count/Operation instead of
Instances/Name.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import kernel_table as kt
from .readers import dict_records, number

SOURCE = "nsys"
KERNEL_REPORTS = ("cuda_gpu_kern_sum", "gpukernsum")
MEMORY_REPORTS = ("cuda_gpu_mem_time_sum", "gpumemtimesum")
_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def read_summary(path) -> list[tuple[str, int, float]]:
    """(name, calls, total_us) per row of a kernel or memory-time summary."""
    records = dict_records(path, header_test=lambda line: "Total Time" in line,
                           what="nsys stats CSV")
    if not records:
        return []
    total_col = next(c for c in records[0] if c.startswith("Total Time"))
    unit = re.search(r"\((\w+)\)", total_col)
    scale = _TO_US.get(unit.group(1) if unit else "ns", 1e-3)
    calls_col = "Instances" if "Instances" in records[0] else "Count"
    name_col = "Name" if "Name" in records[0] else "Operation"
    return [(r[name_col], int(number(r[calls_col]) or 0), (number(r[total_col]) or 0.0) * scale)
            for r in records]


def parse(path) -> kt.KernelTable:
    path = Path(path)
    if path.is_dir():
        files = [f for report in KERNEL_REPORTS + MEMORY_REPORTS
                 for f in sorted(path.glob(f"*{report}*.csv"))]
    else:
        files = [path]
    if not files:
        raise kt.ProfileParseError(f"{path}: no *_cuda_gpu_kern_sum.csv (run nsys stats -r "
                                   f"cuda_gpu_kern_sum -f csv -o PREFIX REPORT.nsys-rep)")
    items = [item for f in files for item in read_summary(f)]
    return kt.from_totals(items, SOURCE, files=files)
