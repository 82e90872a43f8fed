"""The one kernel table every profiler is parsed into.

rocprofv3, rocprof-compute, Nsight Compute, Nsight Systems and the PyTorch
profiler all answer the same question - "where did the GPU time go?" - in
different files and units. Each parser in this package turns its tool's
output into rows of this table, so the analysis tools (and attendees) can
compare versions and tools without knowing any file format.

Columns (one row per kernel name):
  name      kernel (or, for CPU-only runs, operator) name as the tool reports it
  category  gemm | attention | norm | elementwise | optimizer | copy | other
  calls     launches seen in the profiled window
  total_us  summed duration, microseconds
  mean_us   total_us / calls
  share     fraction of all time in this table (the table is the profiled
            window, so this is the kernel's share of device time per step)
  flops     floating-point operations summed over calls, where the tool counts them
  bytes     DRAM/HBM bytes moved, summed over calls, where the tool counts them
  source    the tool (and file) the row came from
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = ("name", "category", "calls", "total_us", "mean_us", "share", "flops", "bytes", "source")
CATEGORIES = ("gemm", "attention", "norm", "elementwise", "optimizer", "copy", "other")


class ProfileParseError(ValueError):
    """A file is not what its parser expected; the message says what to do."""


# ----------------------------------------------------------------- categories
# First match wins, so the order matters: a cuDNN flash-attention kernel uses
# wgmma (a GEMM instruction) and must count as attention; the loss's
# log_softmax is not attention; a copy written as an elementwise kernel
# ("direct_copy_kernel") is a copy.
_RULES = [
    ("other", r"log_?softmax|nll_loss|cross_?entropy"),
    ("optimizer", r"adam|sgd|lamb\b|multi_tensor_apply|_foreach|lerp|addcdiv|addcmul|optimizer"),
    ("attention", r"attention|attn|flash|fmha|sdpa|scaled_dot|softmax"),
    ("gemm", r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|cijk_|hipblaslt|rocblas|tensile"
             r"|triton_tem|matmul|(^|[^a-z])(b|add|baddb)?mm([^a-z]|$)|linear"),
    ("norm", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|(^|[^a-z])norm([^a-z]|$)"
             r"|normkernel|rowwisemoments|welford|triton_(red|per)_fused\w*rsqrt"),
    # torch.compile names fused kernels after every op inside ("..._to_copy_add_mul"):
    # a pointwise/reduction kernel, whatever else its name mentions.
    ("elementwise", r"triton_(poi|red|per)_"),
    ("copy", r"memcpy|memset|copy|(^|[^a-z])cat([^a-z]|$)|catarray|transpose|contiguous|clone"
             r"|fill|embedding|index_?select|gather|scatter|(^|::)to([^a-z]|$)"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|reduce"
                    r"|silu|gelu|swiglu|relu|rope|rotary|mul|add|sub|div|exp|pow|sqrt|mean|sum"
                    r"|where|mask|tanh|sigmoid|neg|cos|sin|tril|triu|clamp|abs"),
]
_COMPILED = [(cat, re.compile(pattern, re.IGNORECASE)) for cat, pattern in _RULES]


def categorize(name: str) -> str:
    """Which kind of work a kernel or operator name is (see _RULES for how)."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


# ----------------------------------------------------------------- rows
@dataclass
class Launch:
    """One kernel launch as a tool recorded it (before aggregation)."""
    name: str
    duration_ns: float | None
    flops: float | None = None
    bytes: float | None = None


@dataclass
class KernelRow:
    name: str
    category: str
    calls: int
    total_us: float | None
    mean_us: float | None
    share: float | None
    flops: float | None
    bytes: float | None
    source: str


@dataclass
class KernelTable:
    rows: list[KernelRow]
    source: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_us(self) -> float:
        return sum(r.total_us or 0.0 for r in self.rows)

    def by_category(self) -> dict[str, float]:
        """Share of the table's time per category, in CATEGORIES order."""
        total = self.total_us
        out = {c: 0.0 for c in CATEGORIES}
        for r in self.rows:
            out[r.category] += (r.total_us or 0.0) / total if total else 0.0
        return out


def _sum_known(values) -> float | None:
    known = [v for v in values if v is not None and not math.isnan(v)]
    return sum(known) if known else None


def from_launches(launches, source: str, files=(), notes=()) -> KernelTable:
    """Group launches by kernel name: calls, total and mean time, FLOPs, bytes."""
    groups: "OrderedDict[str, list[Launch]]" = OrderedDict()
    for launch in launches:
        groups.setdefault(launch.name, []).append(launch)
    rows = []
    for name, items in groups.items():
        total_ns = _sum_known(l.duration_ns for l in items)
        rows.append(_row(name, len(items), None if total_ns is None else total_ns / 1000.0,
                         _sum_known(l.flops for l in items), _sum_known(l.bytes for l in items),
                         source))
    return _finish(rows, source, files, notes)


def from_totals(items, source: str, files=(), notes=()) -> KernelTable:
    """Rows from tools that already aggregate: (name, calls, total_us[, flops, bytes])."""
    rows = []
    for item in items:
        name, calls, total_us, *rest = item
        flops, nbytes = (list(rest) + [None, None])[:2]
        rows.append(_row(name, calls, total_us, flops, nbytes, source))
    return _finish(rows, source, files, notes)


def _row(name, calls, total_us, flops, nbytes, source) -> KernelRow:
    mean = total_us / calls if total_us is not None and calls else None
    return KernelRow(name=name, category=categorize(name), calls=int(calls), total_us=total_us,
                     mean_us=mean, share=None, flops=flops, bytes=nbytes, source=source)


def _finish(rows, source, files, notes) -> KernelTable:
    rows.sort(key=lambda r: -(r.total_us or 0.0))
    total = sum(r.total_us or 0.0 for r in rows)
    for r in rows:
        r.share = (r.total_us or 0.0) / total if total else None
    return KernelTable(rows=rows, source=source, files=[str(f) for f in files], notes=list(notes))


# ----------------------------------------------------------------- CSV in/out
def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)  # exact round trip
    return str(value)


def to_csv_text(table: KernelTable) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in table.rows:
        writer.writerow([_fmt(getattr(r, c)) for c in COLUMNS])
    return buf.getvalue()


def write_csv(table: KernelTable, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_csv_text(table))
    return path


def read_csv(path) -> KernelTable:
    """Read a table written by write_csv (what the analysis package plots from)."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ProfileParseError(f"{path}: not a kernel table (missing {', '.join(sorted(missing))})")
        rows = []
        for rec in reader:
            num = {c: (float(rec[c]) if rec[c] != "" else None)
                   for c in ("total_us", "mean_us", "share", "flops", "bytes")}
            rows.append(KernelRow(name=rec["name"], category=rec["category"],
                                  calls=int(rec["calls"] or 0), source=rec["source"], **num))
    source = rows[0].source if rows else "unknown"
    return KernelTable(rows=rows, source=source, files=[str(path)])


# ----------------------------------------------------------------- text
def format_table(table: KernelTable, top: int = 15, name_width: int = 60) -> str:
    """A compact text view: the top kernels, then time per category."""
    has_flops = any(r.flops for r in table.rows)
    has_bytes = any(r.bytes for r in table.rows)
    head = f"{'share':>6} {'total ms':>9} {'calls':>6} {'mean us':>9}  {'category':<11}"
    head += (f" {'TFLOP/s':>8}" if has_flops else "") + (f" {'GB/s':>8}" if has_bytes else "")
    lines = [f"kernel table from {table.source}: {len(table.rows)} kernels, "
             f"{table.total_us / 1000:.3f} ms in total", head + "  name"]
    for r in table.rows[:top]:
        line = (f"{_pct(r.share):>6} {_num(r.total_us, 1000, '.3f'):>9} {r.calls:>6} "
                f"{_num(r.mean_us, 1, '.2f'):>9}  {r.category:<11}")
        if has_flops:
            line += f" {_rate(r.flops, r.total_us, 1e6):>8}"
        if has_bytes:
            line += f" {_rate(r.bytes, r.total_us, 1e3):>8}"
        name = r.name if len(r.name) <= name_width else r.name[:name_width - 3] + "..."
        lines.append(f"{line}  {name}")
    if len(table.rows) > top:
        lines.append(f"  ... {len(table.rows) - top} more kernels in the CSV")
    cats = [f"{c} {_pct(s)}" for c, s in table.by_category().items() if s > 0]
    lines.append("by category: " + " | ".join(cats))
    lines.extend(f"note: {n}" for n in table.notes)
    return "\n".join(lines)


def format_comparison(tables: dict[str, KernelTable]) -> str:
    """Several kernel tables side by side: milliseconds per category and in total
    (each table is one profiled window, so equal windows compare directly)."""
    labels = list(tables)
    width = max(11, *(len(label) for label in labels))
    lines = [f"{'category':<11} " + " ".join(f"{label:>{width}}" for label in labels)]
    for category in CATEGORIES:
        times = [sum(r.total_us or 0.0 for r in t.rows if r.category == category) / 1000
                 for t in tables.values()]
        if any(times):
            lines.append(f"{category:<11} " + " ".join(f"{ms:>{width}.3f}" for ms in times))
    lines.append(f"{'total ms':<11} " + " ".join(f"{t.total_us / 1000:>{width}.3f}"
                                                 for t in tables.values()))
    lines.append(f"{'kernels':<11} " + " ".join(f"{len(t.rows):>{width}}" for t in tables.values()))
    return "\n".join(lines)


def _pct(x) -> str:
    return "" if x is None else f"{x * 100:.1f}%"


def _num(x, div, spec) -> str:
    return "" if x is None else format(x / div, spec)


def _rate(amount, total_us, per_us_scale) -> str:
    """amount per second, scaled: FLOP/us / 1e6 = TFLOP/s; byte/us / 1e3 = GB/s."""
    if not amount or not total_us:
        return ""
    return f"{amount / total_us / per_us_scale:.2f}"
