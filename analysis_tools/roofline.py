"""roofline: where each operation sits against the device's ceilings.

A kernel doing F FLOPs while moving B bytes has arithmetic intensity I = F/B.
It cannot run faster than min(peak FLOP/s, bandwidth x I): left of the ridge
point (peak / bandwidth) it is memory-bound, right of it compute-bound.

Points on the plot, each labelled:
- analytic ops of the config (ops.training_ops): hollow markers at the best
  rate their minimum bytes allow - where the op *could* be;
- measured ops (`--measure-ops`, opbench): filled markers at the rate each op
  reached alone on this device - explicit vs flash attention shows the jump;
- profiler kernels (`--kernels LABEL=table.csv`, the profilers' common kernel
  table), where the table has FLOPs and bytes;
- one star per run (results JSON): the whole training step, model FLOPs over
  step time, at the step's analytic intensity.

The roof: the ceilings given with --ceilings; otherwise the ceilings already
measured for this device (the output of `python -m benchmarks.ceilings`,
results/analysis/ceilings.json, when it names the same device) and the
datasheet peak of a known GPU. With neither, the plot and the command say how
to get one.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from harness import flops
from harness.config import PRESETS

from .ceilings import find_measured_ceilings, load_ceilings
from .common import AnalysisError, load_results, model_config, plt, save_figure, unique_labels
from .memory import implementation_for
from .ops import training_ops

CATEGORY_COLORS = {"gemm": "tab:blue", "attention": "tab:red", "norm": "tab:green",
                   "elementwise": "tab:orange", "optimizer": "tab:purple", "copy": "tab:brown",
                   "other": "tab:gray"}
TIME_COLUMNS = {"total_time_us": 1.0, "total_us": 1.0, "total_time_ns": 1e-3, "total_ns": 1e-3,
                "total_time_ms": 1e3, "total_ms": 1e3}


# ---------------------------------------------------------------- ceilings
def ceilings_for(device_name: str | None, precision: str, measured: dict | None = None) -> list[dict]:
    """Rooflines to draw: datasheet (if the device is known) and measured (if given)."""
    out = []
    found = flops.lookup_peak(device_name or "", None) if device_name else None
    if found and found[1].get(precision):
        key, row = found
        out.append({"label": f"{key} datasheet ({precision})", "tflops": row[precision],
                    "tbs": row["hbm_tbs"], "style": "--"})
    if measured:
        tflops = (measured.get("matmul_tflops") or {}).get(precision)
        gbs = measured.get("copy_gbs")
        if tflops and gbs:
            out.append({"label": f"measured ({precision} GEMM, copy)", "tflops": tflops,
                        "tbs": gbs / 1000, "style": "-"})
    return out


NO_ROOF = ("no roof: no ceilings measured for {device} and no datasheet peak for it; run "
           "`python -m benchmarks.ceilings` once (it writes results/analysis/ceilings.json, "
           "which roofline and report then use) or pass --ceilings FILE")


def this_device_name(device: str = "auto") -> str:
    """The name of the device the ceilings probe would measure."""
    import torch

    from harness import device as dev
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return dev.device_name(torch.device("cpu"))


def _short(path) -> str:
    """A path relative to the current folder when it lies below it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- kernel tables
def load_kernel_table(path, label: str) -> pd.DataFrame:
    """The profilers' common kernel table: name, category, calls, total time,
    and FLOPs/bytes where the tool gave them (totals over all calls, like the time)."""
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise AnalysisError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    df.columns = [c.strip().lower() for c in df.columns]
    time_col = next((c for c in TIME_COLUMNS if c in df.columns), None)
    if "name" not in df.columns or time_col is None:
        raise AnalysisError(f"{path}: a kernel table needs 'name' and a total time column "
                            f"({', '.join(TIME_COLUMNS)}); found {', '.join(df.columns)}")
    out = pd.DataFrame({"label": label, "name": df["name"].astype(str),
                        "category": df.get("category", pd.Series("other", index=df.index)).fillna("other"),
                        "time_s": pd.to_numeric(df[time_col], errors="coerce") * TIME_COLUMNS[time_col] * 1e-6})
    for col in ("flops", "bytes"):
        out[col] = pd.to_numeric(df[col], errors="coerce") if col in df.columns else float("nan")
    ok = (out["flops"] > 0) & (out["bytes"] > 0) & (out["time_s"] > 0)
    out["intensity"] = (out["flops"] / out["bytes"]).where(ok)
    out["achieved_tflops"] = (out["flops"] / out["time_s"] / 1e12).where(ok)
    return out


def category_summary(kernels: pd.DataFrame) -> pd.DataFrame:
    """Time per category and run: where the GPU time goes, even without FLOPs."""
    g = kernels.groupby(["label", "category"], as_index=False)["time_s"].sum()
    g["share %"] = g["time_s"] / g.groupby("label")["time_s"].transform("sum") * 100
    g["time ms"] = g["time_s"] * 1000
    return g.drop(columns="time_s").sort_values(["label", "time ms"], ascending=[True, False])


# ---------------------------------------------------------------- points from runs
def step_points(results: list[dict]) -> pd.DataFrame:
    """One point per run: whole-step model FLOPs / step time, at the step's intensity."""
    rows = []
    for label, r in zip(unique_labels(results), results):
        run, cfg = r["run"], model_config(r)
        impl = implementation_for(r["version"], r.get("options"), run, r["device"]["type"], cfg)
        ops = training_ops(cfg, run["batch_size"], run["seq_len"], run["precision"],
                           impl.attention, impl.fused_qkv, impl.fused_gate_up)
        rows.append({"label": label, "intensity": r["flops"]["per_step"] / ops["bytes"].sum(),
                     "achieved_tflops": r["flops"]["achieved_tflops"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- plot
def _lift(placed: list, x: float, y: float) -> int:
    """How many labels already sit near (x, y) on the log-log plot: stack above them."""
    return sum(1 for px, py in placed
               if abs(math.log10(px / x)) < 0.25 and abs(math.log10(py / y)) < 0.35)


def plot_roofline(ceilings: list[dict], analytic: pd.DataFrame | None = None,
                  measured: pd.DataFrame | None = None, kernels: pd.DataFrame | None = None,
                  steps: pd.DataFrame | None = None, out_dir=".", name="roofline.png",
                  title="Roofline", note: str | None = None):
    fig, ax = plt.subplots(figsize=(13, 7))
    xs = [s["intensity"].dropna() for s in (analytic, measured, kernels, steps) if s is not None]
    all_x = pd.concat([pd.Series([1.0]), *xs])
    lo, hi = max(all_x.min() / 4, 1e-3), all_x.max() * 8
    for c in ceilings:
        ridge = c["tflops"] / c["tbs"]
        lo, hi = min(lo, ridge / 50), max(hi, ridge * 20)
    grid = pd.Series([lo * (hi / lo) ** (i / 200) for i in range(201)])
    best = None
    for c in ceilings:
        roof = grid.clip(upper=c["tflops"] / c["tbs"]) * c["tbs"]
        ax.plot(grid, roof, c["style"], color="black", linewidth=1.2 if c["style"] == "-" else 0.9,
                label=f"{c['label']}: {c['tflops']:.3g} TFLOP/s, {c['tbs']:.3g} TB/s")
        if best is None or c["style"] == "-":
            best = c
    if analytic is not None and len(analytic):
        # Ops at (nearly) the same intensity share one marker. Each marker gets a
        # number, stacked above its neighbours so no two overlap; the numbers'
        # op names are listed beside the plot.
        groups = analytic.assign(key=analytic["intensity"].round(2)).groupby(["category", "key"])
        groups = sorted(groups, key=lambda item: item[1]["intensity"].iloc[0])
        placed, key_lines = [], []
        for number, ((category, _), group) in enumerate(groups, start=1):
            x = group["intensity"].iloc[0]
            color = CATEGORY_COLORS.get(category, "gray")
            key_lines.append(f"{number}: {', '.join(group['op'])}")
            if best:  # where the op would sit if it ran at its bound
                y = min(best["tflops"], best["tbs"] * x)
                ax.scatter(x, y, facecolors="none", s=60, edgecolors=color)
                lift = _lift(placed, x, y)
                ax.annotate(str(number), (x, y), fontsize=7, color=color, xytext=(4, -3 + 9 * lift),
                            textcoords="offset points")
            else:  # no ceiling known: mark the intensity on the axis only
                y = 1.0
                ax.axvline(x, color=color, alpha=0.3, linewidth=0.8)
                lift = _lift(placed, x, y)
                ax.annotate(str(number), (x, 0.02 + 0.04 * lift), xycoords=("data", "axes fraction"),
                            fontsize=7, color=color)
            placed.append((x, y))
        ax.text(1.01, 0.0, "analytic ops:\n" + "\n".join(key_lines), transform=ax.transAxes,
                fontsize=6, va="bottom", ha="left", family="monospace")
    if note:  # say on the plot itself why it has no roof and how to get one
        import textwrap
        ax.text(0.5, 0.55, "\n".join(textwrap.wrap(note, 70)), transform=ax.transAxes, fontsize=9,
                ha="center", va="center", bbox={"facecolor": "lightyellow", "edgecolor": "gray"})
    if measured is not None and len(measured):
        for _, row in measured.iterrows():
            ax.scatter(row["intensity"], row["achieved_tflops"], s=45,
                       color=CATEGORY_COLORS.get(row["category"], "gray"), edgecolors="black")
            ax.annotate(f"{row['op']} [{row['implementation']}]", (row["intensity"], row["achieved_tflops"]),
                        fontsize=6, xytext=(3, -8), textcoords="offset points")
    if kernels is not None and len(kernels):
        markers = "^vsDPX<>"
        for i, (label, group) in enumerate(kernels.dropna(subset=["intensity"]).groupby("label")):
            ax.scatter(group["intensity"], group["achieved_tflops"], marker=markers[i % len(markers)],
                       c=[CATEGORY_COLORS.get(c, "gray") for c in group["category"]], s=30,
                       edgecolors="black", linewidths=0.4, label=f"kernels: {label}")
    if steps is not None and len(steps):
        for _, row in steps.dropna().iterrows():
            ax.scatter(row["intensity"], row["achieved_tflops"], marker="*", s=180, color="gold",
                       edgecolors="black", zorder=5)
            ax.annotate(f"step: {row['label']}", (row["intensity"], row["achieved_tflops"]),
                        fontsize=7, xytext=(5, 5), textcoords="offset points")
    for category, color in CATEGORY_COLORS.items():
        ax.scatter([], [], color=color, label=category, s=25)
    ax.scatter([], [], facecolors="none", edgecolors="black",
               label="analytic: bound at minimum bytes" if best else "analytic intensity (no ceiling known)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if not ceilings and all(s is None or not len(s) for s in (measured, kernels, steps)):
        ax.set_ylim(1e-3, 1e3)  # nothing measured and no ceiling: only the intensities
    ax.set_xlabel("arithmetic intensity (FLOP / byte, minimum bytes)")
    ax.set_ylabel("performance (TFLOP/s)")
    ax.set_title(title)
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out_dir, name)


# ---------------------------------------------------------------- command
def draw_roofline(results=None, preset: str | None = None, batch: int | None = None,
             seq: int | None = None, precision: str | None = None, attention: str | None = None,
             ceilings_path=None, kernel_tables: dict | None = None, measure_ops: bool = False,
             device: str = "cpu", out_dir=".", name: str = "roofline.png") -> dict:
    """Notebook entry point. Returns tables (analytic, measured, kernels, steps) and the plot path."""
    if measure_ops:  # timing ops on a device this machine lacks: one line (UsageError) before any work
        from harness import device as dev
        dev.resolve_device(device)
    results = (results if results and isinstance(results[0], dict)
               else load_results(results) if results else [])
    first = results[0] if results else None
    if first:
        cfg, run = model_config(first), first["run"]
        batch, seq = batch or run["batch_size"], seq or run["seq_len"]
        precision = precision or run["precision"]
        attention = attention or implementation_for(first["version"], first.get("options"), run,
                                                    first["device"]["type"], cfg).attention
    else:
        preset = preset or "small"
        if preset not in PRESETS:
            raise AnalysisError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
        cfg = PRESETS[preset].model
        batch, seq = batch or PRESETS[preset].batch_size, seq or PRESETS[preset].seq_len
    precision, attention = precision or "bf16", attention or "explicit"
    analytic = pd.concat([training_ops(cfg, batch, seq, precision, "explicit"),
                          training_ops(cfg, batch, seq, precision, "flash")]).drop_duplicates("op")
    analytic = analytic[analytic["flops"] > 0].reset_index(drop=True)
    device_name = first["device"]["name"] if first else None
    if ceilings_path is None:  # the ceilings already measured on this device, if any
        device_name = device_name or this_device_name(device)
        ceilings_path = find_measured_ceilings(device_name, out_dir)
    ceilings_json = load_ceilings(ceilings_path) if ceilings_path else None
    device_name = ((ceilings_json or {}).get("device", {}).get("name") or device_name)
    ceilings = ceilings_for(device_name, precision, (ceilings_json or {}).get("measured"))
    if ceilings_path and any(c["style"] == "-" for c in ceilings):
        for c in ceilings:
            if c["style"] == "-":
                c["label"] += f" from {_short(ceilings_path)}"
    measured = None
    if measure_ops:
        from benchmarks.ceilings import measure_ceilings

        from .opbench import measure_ops as run_ops
        if not any(c["style"] == "-" for c in ceilings):  # measure this device's ceilings too
            ceilings += ceilings_for(None, precision, measure_ceilings(device, [precision])["measured"])
        measured = run_ops(cfg, batch, seq, precision, device)
    kernels = (pd.concat([load_kernel_table(p, label) for label, p in kernel_tables.items()],
                         ignore_index=True) if kernel_tables else None)
    steps = step_points(results) if results else None
    title = (f"Roofline: {device_name or 'unknown device'}, {precision}, "
             f"hidden {cfg.hidden_dim} x {cfg.num_layers} layers, batch {batch} x seq {seq}")
    note = None if ceilings else NO_ROOF.format(device=device_name or "this device")
    path = plot_roofline(ceilings, analytic, measured, kernels, steps, out_dir, name, title, note)
    return {"analytic": analytic, "measured": measured, "kernels": kernels, "steps": steps,
            "ceilings": ceilings, "plot": path, "note": note}
