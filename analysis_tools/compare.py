"""compare: one table and four plots for a set of runs, and loud flags on numbers
that cannot be trusted.

The table extends the harness's plain `table_rows` (same columns, same maths)
with a label per run and a speed-up measured against V1 *of the same setup*:
comparing V4 medium with V1 small would be meaningless.
"""
from __future__ import annotations

import pandas as pd

from harness.report import table_rows

from .common import (load_results, memory_kind, peak_memory_mb, plt, save_figure, text_table,
                     unique_labels)

FLOAT_FORMATS = {"tokens/s": ",.0f", "speedup": ".2f", "step ms": ".2f", "fwd ms": ".2f",
                 "bwd ms": ".2f", "opt ms": ".2f", "MFU %": ".1f", "peak MB": ",.0f",
                 "final loss": ".4f"}


def setup_key(result: dict) -> tuple:
    """What must be equal for two runs to be compared: model, shape and precision."""
    run = result["run"]
    return (tuple(sorted(result["config"].items())), run["batch_size"], run["seq_len"],
            run["precision"], run.get("grad_accum", 1), run.get("world_size", 1))


def comparison_table(results: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(table_rows(results))
    df.insert(0, "run", unique_labels(results))
    df = df.drop(columns=["version"])
    # Speed-up against the first V1 run of the same setup (not just any V1).
    speedups = []
    for r, tps in zip(results, df["tokens/s"]):
        base = next((b for b in results if b["version"] == "v1" and setup_key(b) == setup_key(r)), None)
        base_tps = base["throughput"]["tokens_per_s"] if base else None
        speedups.append(tps / base_tps if base_tps and tps else None)
    df["speedup"] = speedups
    return df


def suspicious(results: list[dict]) -> list[str]:
    """Reasons to distrust a comparison, one line each (empty list: none found)."""
    flags = []
    labels = unique_labels(results)
    for label, r in zip(labels, results):
        t = r["timing_ms"]
        fwd, bwd = t["forward"]["median"], t["backward"]["median"]
        if fwd and bwd is not None and bwd < fwd:
            flags.append(f"{label}: backward ({bwd:.2f} ms) is faster than forward ({fwd:.2f} ms) "
                         "- backward costs ~2x forward; is the autograd graph cut?")
        guard = r.get("gradient_guard") or {}
        if not guard.get("passed") or not guard.get("checked_params"):
            flags.append(f"{label}: gradient-flow guard missing or failed ({guard or 'no record'}) "
                         "- its speed may come from not computing gradients")
        mfu = r["mfu"]["value"]
        if mfu is not None and mfu > 1.0:
            flags.append(f"{label}: MFU {mfu * 100:.0f}% is above 100% - the timing cannot be "
                         "right (missing synchronization?)")
        flags += [f"{label}: {w}" for w in r.get("warnings", []) if "faster than forward" not in w]
    if len({setup_key(r)[:3] for r in results}) > 1:
        flags.append("different model configs or shapes are compared: "
                     + "; ".join(sorted({f"{l}: batch {r['run']['batch_size']} x seq "
                                         f"{r['run']['seq_len']}" for l, r in zip(labels, results)})))
    precisions = sorted({r["run"]["precision"] for r in results})
    if len(precisions) > 1:
        flags.append(f"different precisions are compared ({', '.join(precisions)}): "
                     "speed-ups mix precision with implementation")
    data = sorted({r["run"].get("data", "synthetic") for r in results})
    if len(data) > 1:
        flags.append(f"different training data ({', '.join(data)}): loss curves are not comparable")
    devices = sorted({r["device"]["name"] for r in results})
    if len(devices) > 1:
        flags.append(f"runs come from different devices ({', '.join(devices)})")
    return flags


# ------------------------------------------------------------------ plots
def _bar_labels(ax, bars, fmt):
    for bar in bars:
        height = bar.get_height()
        if height == height:  # skip NaN
            ax.annotate(format(height, fmt), (bar.get_x() + bar.get_width() / 2, height),
                        ha="center", va="bottom", fontsize=8)


def plot_throughput(df: pd.DataFrame, out_dir, name="compare_throughput.png"):
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(df) + 2), 4))
    bars = ax.bar(df["run"], df["tokens/s"], color="tab:blue")
    _bar_labels(ax, bars, ",.0f")
    ax.set_ylabel("throughput (tokens/s, median step)")
    ax.set_title("Training throughput (higher is better)")
    ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, out_dir, name)


def plot_step_breakdown(df: pd.DataFrame, out_dir, name="compare_step_time.png"):
    """Stacked forward/backward/optimizer; 'other' is the rest of the step (launch gaps, data)."""
    parts = df[["fwd ms", "bwd ms", "opt ms"]].fillna(0)
    other = (df["step ms"] - parts.sum(axis=1)).clip(lower=0)
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(df) + 2), 4))
    bottom = pd.Series(0.0, index=df.index)
    for column, label, color in (("fwd ms", "forward", "tab:blue"), ("bwd ms", "backward", "tab:orange"),
                                 ("opt ms", "optimizer", "tab:green")):
        ax.bar(df["run"], parts[column], bottom=bottom, label=label, color=color)
        bottom += parts[column]
    ax.bar(df["run"], other, bottom=bottom, label="other (gaps, data)", color="tab:gray")
    ax.set_ylabel("time per step (ms, medians)")
    ax.set_title("Where a training step goes")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, out_dir, name)


def plot_memory(df: pd.DataFrame, results: list[dict], out_dir, name="compare_memory.png"):
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(df) + 2), 4))
    bars = ax.bar(df["run"], df["peak MB"], color="tab:purple")
    _bar_labels(ax, bars, ",.0f")
    kinds = sorted({memory_kind(r) for r in results})
    ax.set_ylabel(f"peak memory (MiB, {' / '.join(kinds)})")
    ax.set_title("Peak memory (lower is better)")
    ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, out_dir, name)


def plot_losses(results: list[dict], labels: list[str], out_dir, name="compare_loss.png"):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, r in zip(labels, results):
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label, linewidth=1.3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title("Loss curves (same seed and data should overlap)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out_dir, name)


def compare_runs(paths_or_results, out_dir=None, plots: bool = True) -> dict:
    """Notebook entry point: returns {'table': DataFrame, 'flags': [...], 'plots': [paths]}."""
    results = (paths_or_results if paths_or_results and isinstance(paths_or_results[0], dict)
               else load_results(paths_or_results))
    df = comparison_table(results)
    out = {"table": df, "flags": suspicious(results), "plots": [], "results": results}
    if plots and out_dir is not None:
        out["plots"] = [plot_throughput(df, out_dir), plot_step_breakdown(df, out_dir),
                        plot_memory(df, results, out_dir),
                        plot_losses(results, list(df["run"]), out_dir)]
    return out


def format_report(out: dict) -> str:
    results = out["results"]
    device = results[0]["device"]
    lines = [f"device: {device['name']} ({device['backend']}), torch {device['torch']}",
             text_table(out["table"], FLOAT_FORMATS)]
    if out["flags"]:
        lines += ["", "!" * 72, f"!! {len(out['flags'])} SUSPICIOUS RESULT(S) - do not quote these "
                  "numbers before checking:"]
        lines += [f"!!  - {flag}" for flag in out["flags"]]
        lines += ["!" * 72]
    lines += [f"plot: {p}" for p in out["plots"]]
    return "\n".join(lines)
