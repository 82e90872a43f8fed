"""rocprofv3 (rocprofiler-sdk) CSV outputs -> kernel table.

What `profiling/run_rocprofv3.sh` runs:
    rocprofv3 --kernel-trace --stats --truncate-kernels --marker-trace --output-format csv \
              -d OUT/rocprofv3 -o TAG -- python ...
which writes OUT/rocprofv3/TAG_kernel_trace.csv (one row per dispatch) and
TAG_kernel_stats.csv (one row per kernel name), plus agent_info/domain_stats.

Formats (documented in rocprofiler-sdk's source/docs/data/*.csv and
generateCSV.cpp, and tests/fixtures/profilers/README.md):
  kernel_trace.csv has had four headers - 16 columns (ROCm 6.2), 18 (6.3:
  +Thread_Id, Dispatch_Id), 19 (6.4: +Stream_Id), 22 (7.0: register counts
  instead of segment sizes) - and `rocpd convert` adds a leading "Guid".
  Every variant has Kernel_Name, Start_Timestamp and End_Timestamp (ns), so
  we read by column name and never by position.
  kernel_stats.csv: "Name","Calls","TotalDurationNs","AverageNs","Percentage",
  "MinNs","MaxNs","StdDev" - stable across versions.
  counter_collection.csv (--pmc): long format, one row per (dispatch, counter).
  marker_api_trace.csv (--marker-trace): "Domain","Function",...,"Start_Timestamp",
  "End_Timestamp"; a ROCTx range's name is in "Function".

The wrappers run the app with `--profile window`, which wraps the profiled
steps in a ROCTx range named "profiled_window" (torch.cuda.nvtx is ROCTx on
ROCm). When the marker trace has it, only kernels that started inside it are
counted, so warm-up steps stay out of the table.
"""
from __future__ import annotations

from pathlib import Path

from . import kernel_table as kt
from .readers import dict_records, number

TRACE_COLUMNS = ("Kernel_Name", "Start_Timestamp", "End_Timestamp")
STATS_COLUMNS = ("Name", "Calls", "TotalDurationNs")
SOURCE = "rocprofv3"
WINDOW_MARKER = "profiled_window"


def read_kernel_trace(path, window: tuple[float, float] | None = None) -> list[kt.Launch]:
    """One Launch per dispatch; with `window` (start, end in ns) only those starting inside."""
    records = dict_records(path, TRACE_COLUMNS, what="rocprofv3 kernel_trace.csv")
    launches = []
    for rec in records:
        if rec.get("Kind", "KERNEL_DISPATCH") != "KERNEL_DISPATCH":
            continue
        start, end = number(rec["Start_Timestamp"]), number(rec["End_Timestamp"])
        if window and (start is None or not window[0] <= start <= window[1]):
            continue
        duration = end - start if start is not None and end is not None else None
        launches.append(kt.Launch(rec["Kernel_Name"], duration))
    return launches


def read_kernel_stats(path) -> kt.KernelTable:
    records = dict_records(path, STATS_COLUMNS, what="rocprofv3 kernel_stats.csv")
    items = [(r["Name"], int(number(r["Calls"]) or 0), (number(r["TotalDurationNs"]) or 0) / 1000)
             for r in records]
    return kt.from_totals(items, f"{SOURCE} stats", files=[path])


def read_marker_window(path, name: str = WINDOW_MARKER) -> tuple[float, float] | None:
    """(start, end) in ns of the ROCTx range `name` in a marker_api_trace.csv, if present."""
    records = dict_records(path, ("Function", "Start_Timestamp", "End_Timestamp"),
                           what="rocprofv3 marker_api_trace.csv")
    for rec in records:
        if rec["Function"] == name:
            return number(rec["Start_Timestamp"]), number(rec["End_Timestamp"])
    return None


def read_counter_collection(path) -> list[dict]:
    """Pivot the long counter file to one dict per dispatch: {counter: value, ...}.

    Rows are (dispatch, counter) pairs; the ROCm 7 form also carries
    timestamps, the older one does not, the rocpd-converted one has a "Pid".
    """
    records = dict_records(path, ("Dispatch_Id", "Kernel_Name", "Counter_Name", "Counter_Value"),
                           what="rocprofv3 counter_collection.csv")
    dispatches: dict[str, dict] = {}
    for rec in records:
        d = dispatches.setdefault(rec["Dispatch_Id"], {
            "Dispatch_Id": int(number(rec["Dispatch_Id"]) or 0), "Kernel_Name": rec["Kernel_Name"]})
        if rec.get("Start_Timestamp") and rec.get("End_Timestamp"):
            d["duration_ns"] = number(rec["End_Timestamp"]) - number(rec["Start_Timestamp"])
        name = rec["Counter_Name"]
        d[name] = d.get(name, 0.0) + (number(rec["Counter_Value"]) or 0.0)
    return list(dispatches.values())


def find_files(folder, suffix: str) -> list[Path]:
    """rocprofv3 may nest outputs (<host>/<pid>_..., pmc_N/, pass_N/): search recursively."""
    return sorted(Path(folder).rglob(f"*{suffix}"))


def parse(path) -> kt.KernelTable:
    """A kernel_trace.csv, a kernel_stats.csv, or a folder holding them.

    The trace is preferred: it has every dispatch, so calls and times are
    exact. The stats file is the fallback (it is what --stats alone writes).
    """
    path = Path(path)
    if path.is_dir():
        traces = find_files(path, "kernel_trace.csv")
        if traces:
            window = next(filter(None, (read_marker_window(m) for m in
                                        find_files(path, "marker_api_trace.csv"))), None)
            launches = [l for t in traces for l in read_kernel_trace(t, window)]
            note = (f"only kernels inside the '{WINDOW_MARKER}' marker (the steps after warm-up)"
                    if window else "no window marker found: every kernel of the run, warm-up included")
            return kt.from_launches(launches, SOURCE, files=traces, notes=[note])
        stats = find_files(path, "kernel_stats.csv")
        if stats:
            return read_kernel_stats(stats[0])
        raise kt.ProfileParseError(f"{path}: no *kernel_trace.csv or *kernel_stats.csv here "
                                   f"(did rocprofv3 run with --kernel-trace --output-format csv?)")
    if path.name.endswith("kernel_stats.csv"):
        return read_kernel_stats(path)
    return kt.from_launches(read_kernel_trace(path), SOURCE, files=[path])
