"""PyTorch profiler outputs -> kernel table, and the operator table it writes.

Two inputs:
  * the Chrome/Perfetto trace (`*.pt.trace.json[.gz]`, written by
    tensorboard_trace_handler). On a GPU it holds every kernel launch
    (cat "kernel", plus "gpu_memcpy"/"gpu_memset") with its duration in us:
    that is the kernel table. ROCm traces use the same categories.
  * operators.csv, written by profiling/sessions.py from key_averages(): one
    row per aten operator with self/total CPU and device time. On a CPU-only
    run there are no kernels, so the operators' self CPU time is the table.

Attribute names (torch/autograd/profiler_util.py): since torch 2.4 the rows of
key_averages() have device_time_total / self_device_time_total; the old
cuda_time_total raises AttributeError on them in 2.11+. We try device_*
first and fall back to cuda_* for older torch. Nothing here imports torch.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from . import kernel_table as kt
from .readers import dict_records, number, read_text

SOURCE = "pytorch"
GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
OPERATOR_COLUMNS = ("name", "calls", "self_device_us", "device_total_us", "self_cpu_us",
                    "cpu_total_us", "flops", "self_cpu_memory_bytes", "self_device_memory_bytes")


# ----------------------------------------------------------------- trace
def trace_events(path) -> list[dict]:
    """The events of a Chrome trace (a `{"traceEvents": [...]}` object or a bare list)."""
    try:
        trace = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise kt.ProfileParseError(f"{path}: not a JSON trace ({e.msg})") from None
    return trace.get("traceEvents", []) if isinstance(trace, dict) else trace


def read_trace(path) -> kt.KernelTable:
    events = trace_events(path)
    step_ranges = profiler_steps(events)
    # Only what the recorded steps launched: a graph-replayed run's window also holds the
    # kernels of the step queued before it (kernels_launched_in says why).
    gpu = kernels_launched_in(events, step_ranges, GPU_EVENT_CATEGORIES)
    steps = len(step_ranges)
    launches = [kt.Launch(e["name"], float(e.get("dur", 0)) * 1000.0) for e in gpu]
    notes = []
    if steps:
        notes.append(f"{steps} profiled step(s)")
    if gpu:
        span = max(e["ts"] + e.get("dur", 0) for e in gpu) - min(e["ts"] for e in gpu)
        busy = sum(e.get("dur", 0) for e in gpu)
        if span > 0:
            notes.append(f"GPU busy {busy / span * 100:.0f}% of the window (kernels "
                         f"{busy / 1000:.2f} ms over {span / 1000:.2f} ms)")
    else:
        notes.append("no GPU kernels in this trace (a CPU run): use operators.csv")
    return kt.from_launches(launches, SOURCE, files=[path], notes=notes)


def profiler_steps(events: list) -> list[tuple[float, float]]:
    """(start, end) on the host clock, in us, of each step the profiler recorded: its
    ProfilerStep#N ranges."""
    return [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]


def kernels_launched_in(events: list, steps: list, categories=("kernel",)) -> list[dict]:
    """The trace's GPU kernels (events of `categories`: add "gpu_memcpy", "gpu_memset" for the
    copies and fills) that the recorded `steps` (profiler_steps) launched. The host runs
    ahead of the GPU (by up to a step where CUDA/HIP graphs replay it), so kernels that the step
    before the first recorded one queued can run, and be recorded, inside the window: counted,
    they would add up to a step's kernels more than the steps hold. A kernel and the host call
    that launched it (a kernel launch, a graph launch: every kernel of a graph shares its
    launch's) carry the same correlation id; a kernel is kept when its launch is in the trace and
    began inside a step (a kernel whose launch the trace lacks was queued before it began). A
    trace without steps, or whose kernels match no launch (a profiler that does not correlate
    them), keeps every kernel."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in categories]
    launched_at = {e["args"]["correlation"]: e["ts"] for e in events
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    if not steps or not any(k.get("args", {}).get("correlation") in launched_at for k in kernels):
        return kernels

    def in_a_step(ts: float) -> bool:
        return any(a <= ts <= b for a, b in steps)

    def kept(kernel: dict) -> bool:
        correlation = kernel.get("args", {}).get("correlation")
        return correlation is None or in_a_step(launched_at.get(correlation, -math.inf))
    return [k for k in kernels if kept(k)]


def find_traces(folder) -> list[Path]:
    folder = Path(folder)
    return sorted(list(folder.rglob("*.pt.trace.json")) + list(folder.rglob("*.pt.trace.json.gz")),
                  key=lambda p: p.stat().st_mtime)


# ----------------------------------------------------------------- operator table
def _device(event, template: str) -> float:
    """event.<template with device>, falling back to the pre-2.4 'cuda' spelling.

    getattr with a default also absorbs the AttributeError that
    FunctionEventAvg.cuda_time_total raises in new torch.
    """
    for device in ("device", "cuda"):
        value = getattr(event, template.format(device), None)
        if value is not None:
            return float(value)
    return 0.0


def is_operator(event) -> bool:
    """Real operators only: not record_function ranges, profiler steps or Python frames.

    A record_function range (is_user_annotation) covers many operators, and on
    the GPU timeline it shows up again as a 'gpu_user_annotation' row whose
    device % can exceed 100 - summing it would count the same kernels twice.
    Kernel rows (device_type CUDA) are left to the kernel table.
    """
    name = event.key
    return not (getattr(event, "is_user_annotation", False) or name.startswith("ProfilerStep")
                or ".py(" in name or name.startswith("<built-in")
                or "CPU" not in str(getattr(event, "device_type", "CPU")))


def operator_records(key_averages) -> list[dict]:
    """Rows of OPERATOR_COLUMNS, slowest first (device time, or CPU time without a GPU)."""
    rows = [{"name": e.key, "calls": e.count,
             "self_device_us": _device(e, "self_{}_time_total"),
             "device_total_us": _device(e, "{}_time_total"),
             "self_cpu_us": float(e.self_cpu_time_total), "cpu_total_us": float(e.cpu_time_total),
             "flops": int(getattr(e, "flops", 0) or 0),
             "self_cpu_memory_bytes": int(getattr(e, "self_cpu_memory_usage", 0) or 0),
             "self_device_memory_bytes": int(_device(e, "self_{}_memory_usage"))}
            for e in key_averages if is_operator(e)]
    on_device = any(r["self_device_us"] > 0 for r in rows)
    key = "self_device_us" if on_device else "self_cpu_us"
    rows.sort(key=lambda r: -r[key])
    return rows


def format_operators(rows: list[dict], top: int = 15) -> str:
    """The top operators by self time: where the step's time is spent, per aten op."""
    on_device = any(r["self_device_us"] > 0 for r in rows)
    key = "self_device_us" if on_device else "self_cpu_us"
    total = sum(r[key] for r in rows) or 1.0
    label = "self device" if on_device else "self CPU"
    lines = [f"{label + ' ms':>15} {'share':>6} {'calls':>6}  operator"]
    for r in rows[:top]:
        lines.append(f"{r[key] / 1000:15.3f} {r[key] / total * 100:5.1f}% {r['calls']:>6}  {r['name']}")
    return "\n".join(lines)


def write_operator_csv(rows: list[dict], path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=OPERATOR_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def read_operator_csv(path) -> kt.KernelTable:
    records = dict_records(path, ("name", "calls", "self_device_us", "self_cpu_us"),
                           what="operators.csv")
    on_device = any((number(r["self_device_us"]) or 0) > 0 for r in records)
    column = "self_device_us" if on_device else "self_cpu_us"
    items = [(r["name"], int(number(r["calls"]) or 0), number(r[column]) or 0.0,
              number(r.get("flops")) or None) for r in records]
    note = ("operator self device time" if on_device else
            "CPU run: operator self CPU time stands in for kernel time")
    return kt.from_totals(items, f"{SOURCE} operators", files=[path], notes=[note])


# ----------------------------------------------------------------- entry point
def parse(path) -> kt.KernelTable:
    """A trace, an operators.csv, or a folder: the newest trace if it has GPU
    kernels, otherwise the operator table. A trace file without GPU kernels (a CPU
    run) is refused with the operator table to read instead."""
    path = Path(path)
    if path.is_dir():
        traces = find_traces(path)
        if traces:
            table = read_trace(traces[-1])
            if table.rows or not (path / "operators.csv").is_file():
                return table
        operators = path / "operators.csv"
        if operators.is_file():
            # A run writes its operator table after its trace: an older table belongs
            # to an earlier run, and the run of the newest trace never finished.
            if traces and operators.stat().st_mtime < traces[-1].stat().st_mtime:
                raise kt.ProfileParseError(
                    f"{operators} is older than {traces[-1].name}: they come from different "
                    f"runs (the newer one stopped before writing its operator table); profile again")
            return read_operator_csv(operators)
        raise kt.ProfileParseError(f"{path}: no *.pt.trace.json or operators.csv here")
    if path.suffix == ".csv":
        return read_operator_csv(path)
    table = read_trace(path)
    if not table.rows:  # a table of 0 kernels would read as "nothing ran"
        operators = path.parent / "operators.csv"
        instead = (f"python -m profiling parse {operators}" if operators.is_file() else
                   "the operators.csv that --profile pytorch writes beside the trace")
        raise kt.ProfileParseError(f"{path}: a CPU trace: it holds operators, no GPU kernels; "
                                   f"their times are in the operator table: {instead}")
    return table
