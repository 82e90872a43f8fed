"""Nsight Compute raw-page CSV -> kernel table.

`profiling/run_ncu.sh` saves a report and exports it with
    ncu -i TAG.ncu-rep --csv --page raw --print-units base > TAG.csv

Layout of that CSV (see the real files from an H200 in tests/fixtures/profilers/nvidia_h200/):
  * "==PROF==" / "==WARNING==" lines may come first;
  * a header row "ID","Process ID",...,"Kernel Name",... then ~300 metric columns;
  * a UNITS row ("", ..., "byte", "ns", "inst");
  * one row per kernel launch, numbers with thousands separators ("36,020,480").

Per launch we take:
  time  = gpu__time_duration.sum
  bytes = dram__bytes.sum (HBM traffic)
  FLOPs = fadd + fmul + 2*ffma (+ the same for fp64 'd' and fp16 'h' instructions)
The FLOP counters see CUDA-core instructions only. Tensor-core (MMA) work is
invisible to them, so for GEMM/attention kernels that used the tensor pipe we
leave FLOPs empty rather than report a number that is far too small.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import kernel_table as kt
from .readers import csv_records, number, read_text

SOURCE = "ncu"
TIME = "gpu__time_duration.sum"
DRAM = "dram__bytes.sum"
TENSOR = "sm__inst_executed_pipe_tensor.sum"
_OP = "sm__sass_thread_inst_executed_op_{}_pred_on.sum"
FLOP_TERMS = [(_OP.format(p + op), 2 if op == "fma" else 1)
              for p in ("f", "d", "h") for op in ("add", "mul", "fma")]

_PREFIX = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
         "s": 1e9, "second": 1e9}


def unit_scale(unit: str) -> float:
    """Factor to base units: 'usecond' -> 1e3 (to ns), 'Mbyte' -> 1e6, 'Kinst' -> 1e3."""
    unit = unit.strip()
    if unit in _TIME:
        return _TIME[unit]
    match = re.fullmatch(r"([KMGT]?)(byte|inst|B)", unit)
    return _PREFIX[match.group(1)] if match else 1.0


def _no_kernels_message(path, text: str) -> str:
    names = re.findall(r"^\s*\d+\.\s+(\S+)", text.split("Available Kernels:", 1)[-1], re.M)
    hint = (f" Kernels it saw: {', '.join(names[:8])}." if names else "")
    return (f"{path}: ncu profiled no kernels - the -k filter matched nothing. ncu matches the "
            f"demangled base name (a CUTLASS GEMM is 'Kernel2').{hint}")


def read_raw(path) -> list[kt.Launch]:
    text = read_text(path)
    if "No kernels were profiled" in text:
        raise kt.ProfileParseError(_no_kernels_message(path, text))
    header, rows = csv_records(path, header_test=lambda line: line.startswith(('"ID"', "ID,")))
    if "Kernel Name" not in header or TIME not in header:
        raise kt.ProfileParseError(f"{path}: not an ncu --page raw CSV with {TIME} "
                                   f"(export with: ncu -i REPORT --csv --page raw --print-units base)")
    col = {name: i for i, name in enumerate(header)}
    units = {}
    if rows and rows[0][col["ID"]] == "":
        units = dict(zip(header, rows[0]))
        rows = rows[1:]

    def value(row, name):
        if name not in col:
            return None
        v = number(row[col[name]])
        return None if v is None else v * unit_scale(units.get(name, ""))

    launches = []
    for row in rows:
        name = row[col["Kernel Name"]]
        flops = None
        if any(term in col for term, _ in FLOP_TERMS):
            flops = sum((value(row, term) or 0.0) * weight for term, weight in FLOP_TERMS)
            tensor = value(row, TENSOR)
            if kt.categorize(name) in ("gemm", "attention") and (tensor is None or tensor > 0):
                flops = None  # tensor-core FLOPs are not in the instruction counters
        launches.append(kt.Launch(name, value(row, TIME), flops, value(row, DRAM)))
    return launches


def parse(path) -> kt.KernelTable:
    path = Path(path)
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    files = [f for f in files if f.name != "kernel_table.csv"]
    if not files:
        raise kt.ProfileParseError(f"{path}: no ncu CSV here (export one with "
                                   f"ncu -i REPORT.ncu-rep --csv --page raw --print-units base)")
    launches = [l for f in files for l in read_raw(f)]
    notes = ["ncu times are per kernel under replay (caches flushed between passes); "
             "FLOPs count CUDA-core instructions only (empty for tensor-core GEMM/attention)"]
    return kt.from_launches(launches, SOURCE, files=files, notes=notes)
