"""compare: one table and four plots for a set of runs, and loud flags on numbers
that cannot be trusted.

The table extends the harness's plain `table_rows` (harness/results.py: same
columns, same maths) with a label per run and a speed-up measured against V1 *of the same setup*:
comparing V4 medium with V1 small would be meaningless.

It reads two kinds of files: the results JSON of one run (harness/results.py)
and the JSON of `benchmarks/compare_versions.py` (every version, several
repeats). The second is turned into the first - one result per (version, mode),
medians over the repeats - so every table, flag and plot below serves both.
"""
from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pandas as pd
from matplotlib.ticker import StrMethodFormatter

from harness.results import (NOISY_SPREAD, SchemaError, at_pace_else_all, comparison_paces, host_slowdowns,
                             is_noisy, numbers, run_key, step_spread, table_rows, validate)

from .common import (INTERPRETER_MARK, AnalysisError, interpreted, load_results, memory_column, memory_kind, plt,
                     result_paths, save_figure, text_table, unique_labels)

FLOAT_FORMATS = {"tokens/s": ",.0f", "speedup": ".2f", "step ms": ".2f", "fwd ms": ".2f",
                 "bwd ms": ".2f", "opt ms": ".2f", "MFU %": ".1f", "peak MB": ",.0f",
                 "peak RSS MB": ",.0f", "final loss": ".4f", "spread %": ".1f", "p90/p10": ".2f"}
COMPARE_VERSIONS_SCHEMA = "compare_versions/1"
MODE_ORDER = ("eager", "compile", "reduce-overhead", "max-autotune")
GUARD_BY_EXIT_CODE_NOTE = (
    "gradient guard 'passed (exit code)': compare_versions keeps a run's numbers only when the "
    "harness exited 0, and the harness exits 5 when the guard fails after step 1; how many "
    "parameters it checked was not recorded")


# ------------------------------------------------- compare_versions JSONs
def read_compare_versions(path) -> dict | None:
    """The report if `path` is a compare_versions JSON; None for anything else
    (a results JSON, or a broken file that load_results will explain)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("compare_versions/"):
        return None
    if data["schema"] != COMPARE_VERSIONS_SCHEMA:
        raise AnalysisError(f"{path}: schema {data['schema']} is not {COMPARE_VERSIONS_SCHEMA}")
    if not isinstance(data.get("runs"), list):
        raise AnalysisError(f"{path}: compare_versions JSON without a 'runs' list")
    return data


def row_as_result(row: dict, report: dict) -> dict:
    """One successful compare_versions row in the results schema of one run.

    Rows written since compare_versions stores it carry the run's complete
    results dict under 'result': used as it is. Older rows keep only medians
    and the final loss; this fills exactly those fields and nothing more."""
    if "result" in row:
        result = copy.deepcopy(row["result"])
        validate(result)
        return result
    gpu = row["device"]["backend"] != "cpu"
    return {
        "schema_version": 1, "version": row["version"], "created": report.get("created"),
        "command": report.get("command"), "git_commit": report.get("git_commit"),
        "config": row["config"], "run": row["run"], "options": row["options"], "device": row["device"],
        "losses": [],  # no per-step losses in the row: no loss curve for this run
        "final_loss": row["final_loss"],
        "timing_ms": {**{phase: {"median": ms} for phase, ms in row["phases_ms"].items()},
                      "step": {"median": row["step_ms"]}},
        "throughput": {"tokens_per_s": row["tokens_per_s"]},
        "flops": {"achieved_tflops": row["achieved_tflops"]},
        "mfu": {"value": row["mfu_datasheet"], "peak_tflops": row.get("peak_tflops_datasheet")},
        "memory": {"peak_allocated_mb" if gpu else "peak_rss_mb": row["peak_memory_mb"]},
        # Not a measurement: the row exists only because the harness exited 0, and it
        # exits 5 (harness/errors.py) when the gradient-flow guard fails after step 1.
        # How many parameters the guard checked is unknown, so checked_params stays None.
        "gradient_guard": {"passed": True, "checked_params": None, "passed_by_exit_code": True},
        "warnings": [],
    }


def guard_passed(result: dict) -> bool:
    """The results record that the gradient-flow guard looked and passed."""
    guard = result.get("gradient_guard") or {}
    return bool(guard.get("passed") and (guard.get("checked_params") or guard.get("passed_by_exit_code")))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def final_loss(result: dict):
    return numbers(result)["final_loss"]


def median_of_repeats(repeats: list[dict]) -> dict:
    """One result for the repeats of a (version, mode): the median of every number.

    One bar per (version, mode) reads better in a workshop than one per repeat;
    the repeats' spread survives as the throughput plot's whiskers and the
    table's 'spread %'. Per-repeat problems stay visible as warnings."""
    n = len(repeats)
    out = copy.deepcopy(repeats[0])  # config, run, options and device are the same in every repeat
    each = [numbers(r) for r in repeats]
    out["timing_ms"] = {phase: {"median": _median(m[f"{phase}_ms"] for m in each), "n": n}
                        for phase in repeats[0]["timing_ms"]}
    out["throughput"] = {"tokens_per_s": _median(m["tokens_per_s"] for m in each)}
    out["flops"]["achieved_tflops"] = _median(m["achieved_tflops"] for m in each)
    out["mfu"]["value"] = _median(m["mfu"] for m in each)
    out["memory"] = {key: _median(r["memory"].get(key) for r in repeats) for key in out["memory"]}
    curves = [r["losses"] for r in repeats]
    same_length = curves[0] and all(len(c) == len(curves[0]) for c in curves)
    out["losses"] = [statistics.median(step) for step in zip(*curves)] if same_length else []
    out["final_loss"] = _median(final_loss(r) for r in repeats)
    guards = [r["gradient_guard"] for r in repeats]
    checked = [g["checked_params"] for g in guards if g.get("checked_params") is not None]
    out["gradient_guard"] = {"passed": all(g.get("passed") for g in guards),
                             "checked_params": min(checked) if len(checked) == n else None}
    if any(g.get("passed_by_exit_code") for g in guards):
        out["gradient_guard"]["passed_by_exit_code"] = True
    out["warnings"] = []
    for i, r in enumerate(repeats, 1):
        prefix = f"repeat {i}/{n}: " if n > 1 else ""
        out["warnings"] += [prefix + w for w in r["warnings"]]
        fwd, bwd = each[i - 1]["forward_ms"], each[i - 1]["backward_ms"]
        if n > 1 and fwd and bwd is not None and bwd < fwd and not guard_passed(r):
            # the median may hide one odd repeat
            out["warnings"].append(f"{prefix}backward {bwd:.2f} ms < forward {fwd:.2f} ms in this "
                                   "repeat, whose gradient guard did not pass (a cut graph?)")
    out["repeats"] = {"n": n, "tokens_per_s": [m["tokens_per_s"] for m in each]}
    out["_host_slow"] = [x for r in repeats for x in r.get("_host_slow", [])]
    out["_host_left_out"] = sum(r.get("_host_left_out", 0) for r in repeats)
    return out


def results_from_compare_versions(report: dict, path) -> tuple[list[dict], list[str]]:
    """(one median result per (version, mode), notes on failed runs) of one file."""
    groups, notes = {}, []
    slow = host_slowdowns(comparison_paces(report["runs"]))  # as compare_versions' table
    for i, row in enumerate(report["runs"]):
        try:
            key = (row["version"], row["mode"])
            if row["exit_code"] != 0:
                notes.append(f"{path}: {key[0]} {key[1]} repeat {row.get('repeat', '?')} failed "
                             f"(exit code {row['exit_code']}: {row.get('error', 'no reason recorded')}) "
                             "- left out")
                continue
            result = row_as_result(row, report)
            if (report.get("ceiling") or {}).get("matmul_tflops"):  # probed beside these runs
                result["_matmul_tflops"] = report["ceiling"]["matmul_tflops"]
            if (reading := slow.get(run_key(row))) is not None:
                result["_host_slow"] = [reading]
        except KeyError as e:
            raise AnalysisError(f"{path}: row {i} has no {e.args[0]!r} - not a compare_versions row") from None
        except SchemaError as e:
            raise AnalysisError(f"{path}: row {i}'s stored result: {e}") from None
        result["_path"] = str(path)
        groups.setdefault(key, []).append(result)
    if not groups:
        raise AnalysisError(f"{path}: no successful run in this compare_versions JSON")

    def order(key):
        version, mode = key
        return (not version.startswith("v"), version, MODE_ORDER.index(mode) if mode in MODE_ORDER else 99)

    return [median_of_repeats(counted(groups[key])) for key in sorted(groups, key=order)], notes


def counted(repeats: list[dict]) -> list[dict]:
    """The repeats a row's median takes, as compare_versions' table does: those whose host ran
    at pace where any did (the others' number goes to `_host_left_out`), else all of them."""
    fine = at_pace_else_all(repeats, lambda r: r.get("_host_slow"))
    if len(fine) < len(repeats):
        fine[0] = {**fine[0], "_host_left_out": len(repeats) - len(fine)}
    return fine


def load_runs(paths) -> tuple[list[dict], list[str]]:
    """Results JSONs and compare_versions JSONs (files or folders) -> (results, notes)."""
    results, notes = [], []
    for path in result_paths(paths):
        report = read_compare_versions(path)
        if report is None:
            results += load_results([path])
        else:
            more, why = results_from_compare_versions(report, path)
            results, notes = results + more, notes + why
    return results, notes


# ------------------------------------------------------------------ table and flags
def setup_key(result: dict) -> tuple:
    """What must be equal for two runs to be compared: model, shape and precision."""
    run = result["run"]
    return (tuple(sorted(result["config"].items())), run["batch_size"], run["seq_len"],
            run["precision"], run.get("grad_accum", 1), run.get("world_size", 1))


def spread_percent(result: dict) -> float | None:
    """(max - min) / median of the repeats' tokens/s: how far to trust a small difference."""
    speeds = result.get("repeats", {}).get("tokens_per_s")
    return (max(speeds) - min(speeds)) / statistics.median(speeds) * 100 if speeds else None


INTERPRETED = "interpreted"  # the speed-up cell of a run in Triton's interpreter: no ratio


def comparison_table(results: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(table_rows(results)).rename(columns={"peak MB": memory_column(results)})
    df.insert(0, "run", unique_labels(results))
    df = df.drop(columns=["version"])
    df["final loss"] = [final_loss(r) for r in results]  # also runs that kept only the final loss
    # Speed-up against the first V1 run of the same setup (not just any V1).
    speedups = []
    for r, tps in zip(results, df["tokens/s"]):
        base = next((b for b in results if b["version"] == "v1" and setup_key(b) == setup_key(r)), None)
        base_tps = numbers(base)["tokens_per_s"] if base else None
        speedups.append(INTERPRETED if interpreted(r) else tps / base_tps if base_tps and tps else None)
    df["speedup"] = speedups
    if all(spread is None for spread in df["p90/p10"]):
        df = df.drop(columns=["p90/p10"])  # medians over repeats keep no percentiles
    if len({optimizer_of(r) for r in results}) > 1:
        df["optimizer"] = [optimizer_of(r) for r in results]
    if any("repeats" in r for r in results):  # medians over repeats (compare_versions)
        df["repeats"] = [r["repeats"]["n"] if "repeats" in r else 1 for r in results]
        df["spread %"] = [spread_percent(r) for r in results]
    if any(r["gradient_guard"].get("passed_by_exit_code") for r in results):
        df["guard"] = ["passed (exit code)" if r["gradient_guard"].get("passed_by_exit_code")
                       else "passed" if r["gradient_guard"].get("passed") else "FAILED" for r in results]
    return df


def optimizer_of(result: dict) -> str:
    return str(result["run"].get("optimizer") or "default")


def suspicious(results: list[dict]) -> list[str]:
    """Reasons to distrust a comparison, one line each (empty list: none found).
    Each reads what the results record: a backward faster than the forward is a cut
    graph only where the gradient guard did not pass (where it did, the run is
    launch-bound: see observations)."""
    flags = []
    labels = unique_labels(results)
    for label, r in zip(labels, results):
        m = numbers(r)
        fwd, bwd = m["forward_ms"], m["backward_ms"]
        if not guard_passed(r):
            guard = r.get("gradient_guard")
            cut = (f"; backward ({bwd:.2f} ms) is faster than forward ({fwd:.2f} ms)"
                   if fwd and bwd is not None and bwd < fwd else "")
            flags.append(f"{label}: gradient-flow guard missing or failed ({guard or 'no record'}){cut} "
                         "- its speed may come from not computing gradients")
        if is_noisy(r) and not interpreted(r):  # an interpreted run shows no speed-up to doubt
            flags.append(f"{label}: step times spread {step_spread(r):.1f}x (p90/p10, over "
                         f"{NOISY_SPREAD}x): the machine was busy, its speed-up means little")
        mfu = m["mfu"]
        if mfu is not None and mfu > 1.0:
            flags.append(f"{label}: MFU {mfu * 100:.0f}% is above 100% - the timing cannot be "
                         "right (missing synchronization?)")
        flags += [f"{label}: {w}" for w in r.get("warnings", [])
                  if "faster than forward" not in w and not (interpreted(r) and INTERPRETER_MARK in w)]
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
def observations(results: list[dict]) -> list[str]:
    """What is true of the data and worth knowing, but no reason to distrust it."""
    notes = []
    labels = unique_labels(results)
    slow = [label for label, r in zip(labels, results) if interpreted(r)]
    if slow:
        notes.append(f"{', '.join(slow)}: the Triton kernels ran in Triton's CPU interpreter, a "
                     "correctness demo taking seconds a step, so its speed is no measurement and no "
                     "speed-up is shown (its losses still check the maths); the step-time plot "
                     "draws it on a scale of its own. The GPU results are in docs/RESULTS.md")
    launch_bound = [label for label, r, m in zip(labels, results, map(numbers, results))
                    if guard_passed(r) and not interpreted(r)
                    and (m["backward_ms"] or 0) < (m["forward_ms"] or 0)]
    if launch_bound:
        notes.append(f"backward faster than forward ({', '.join(launch_bound)}) with the gradient "
                     "guard passed: the run is launch-bound (the host sets the pace, and autograd "
                     "launches the backward from C++ faster than Python launches the forward)")
    optimizers = sorted({optimizer_of(r) for r in results})
    if len(optimizers) > 1:
        notes.append(f"optimizers differ ({', '.join(optimizers)}): the 'optimizer' column and "
                     "the labels name each row's; a speed-up between rows of different optimizers "
                     "includes the optimizer's share")
    return notes


def short_labels(labels: list[str]) -> tuple[list[str], str]:
    """Words every label shares move to the title: 'v4 small bf16 +compile' -> 'v4 +compile'."""
    shared = [w for w in labels[0].split() if all(w in label.split() for label in labels)]
    if len(labels) < 2 or not shared:
        return labels, ""
    short = [" ".join(w for w in label.split() if w not in shared) or label for label in labels]
    return short, " ".join(shared)


def _bar_labels(ax, bars, texts):
    for bar, text in zip(bars, texts):
        if bar.get_height() == bar.get_height():  # skip NaN
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=8)


def _bars(n: int):
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * n + 2), 4.2))
    _bar_axis(ax)
    return fig, ax


def _bar_axis(ax):
    ax.tick_params(axis="x", rotation=25)
    plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _title(text: str, note: str) -> str:
    return f"{text}\n{note}" if note else text


def plot_throughput(df: pd.DataFrame, out_dir, name="compare_throughput.png", results=None, note=""):
    """Bars of tokens/s, labelled with the speed-up against V1; whiskers: min..max over repeats."""
    fig, ax = _bars(len(df))
    spread = [r.get("repeats", {}).get("tokens_per_s") for r in results] if results else [None] * len(df)
    spread = [s if s and len(s) > 1 else None for s in spread]  # one repeat has no range to draw
    errors = [[t - min(s) if s else 0 for t, s in zip(df["tokens/s"], spread)],
              [max(s) - t if s else 0 for t, s in zip(df["tokens/s"], spread)]]
    bars = ax.bar(df["run"], df["tokens/s"], color="tab:blue",
                  yerr=errors if any(spread) else None, capsize=3, ecolor="black")
    _bar_labels(ax, bars, [f"{t:,.0f}" + (f"\n{s}" if isinstance(s, str) else
                                          f"\n{s:.2f}x V1" if s == s and s is not None else "")
                           for t, s in zip(df["tokens/s"], df["speedup"])])
    ax.set_ylabel("throughput (tokens/s, median step)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.margins(y=0.15)
    whiskers = " (whiskers: min..max over repeats)" if any(spread) else ""
    ax.set_title(_title("Training throughput, higher is better" + whiskers, note))
    return save_figure(fig, out_dir, name)


def _step_bars(ax, df: pd.DataFrame):
    parts = df[["fwd ms", "bwd ms", "opt ms"]].fillna(0)
    other = (df["step ms"] - parts.sum(axis=1)).clip(lower=0)
    bottom = pd.Series(0.0, index=df.index)
    for column, label, color in (("fwd ms", "forward", "tab:blue"), ("bwd ms", "backward", "tab:orange"),
                                 ("opt ms", "optimizer", "tab:green")):
        ax.bar(df["run"], parts[column], bottom=bottom, label=label, color=color)
        bottom += parts[column]
    bars = ax.bar(df["run"], other, bottom=bottom, label="other (gaps, data)", color="tab:gray")
    _bar_labels(ax, bars, [f"{ms:.1f} ms" for ms in df["step ms"]])
    ax.margins(y=0.1)


def plot_step_breakdown(df: pd.DataFrame, out_dir, name="compare_step_time.png", note="", apart=()):
    """Stacked forward/backward/optimizer; 'other' is the rest of the step (launch gaps, data).
    The rows whose index is in `apart` (runs in Triton's interpreter: seconds a step, where the
    others take milliseconds) get a panel with a scale of their own, so every bar stays readable."""
    alone = df.index.isin(list(apart))
    if not alone.any() or alone.all():
        fig, ax = _bars(len(df))
        _step_bars(ax, df)
        axes = [ax]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.1 * len(df) + 3), 4.2),
                                 gridspec_kw={"width_ratios": [(~alone).sum() + 1, alone.sum() + 1]})
        for ax, part in zip(axes, (df[~alone], df[alone])):
            _bar_axis(ax)
            _step_bars(ax, part)
        axes[1].set_title("Triton's CPU interpreter\n(its own scale)", fontsize=9)
    axes[0].set_ylabel("time per step (ms, medians)")
    fig.suptitle(_title("Where a training step goes, lower is better", note))
    axes[0].legend()
    return save_figure(fig, out_dir, name)


def plot_memory(df: pd.DataFrame, results: list[dict], out_dir, name="compare_memory.png", note=""):
    fig, ax = _bars(len(df))
    peak = df[memory_column(results)]
    bars = ax.bar(df["run"], peak, color="tab:purple")
    _bar_labels(ax, bars, [f"{mb:,.0f}" for mb in peak])
    kinds = sorted({memory_kind(r) for r in results})
    ax.set_ylabel(f"peak memory (MiB, {' / '.join(kinds)})")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.margins(y=0.1)
    ax.set_title(_title("Peak memory, lower is better", note))
    return save_figure(fig, out_dir, name)


def plot_losses(results: list[dict], labels: list[str], out_dir, name="compare_loss.png", note=""):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, r in zip(labels, results):
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label, linewidth=1.3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title(_title("Loss curves (same seed and data should overlap)", note))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out_dir, name)


def plot_prefix(paths) -> str:
    """The plots' name, from what is compared, so that two comparisons sharing an output
    folder keep their own plots: results/workshop gives compare_workshop_throughput.png,
    v1.json and v3.json compare_v1_v3_throughput.png; one compare_versions JSON keeps its
    own name (compare_medium.json gives compare_medium_throughput.png)."""
    given = [Path(p) for p in paths]
    files = result_paths(given)
    if len(files) == 1 and read_compare_versions(files[0]):
        return files[0].stem
    names = [p.resolve().name if p.is_dir() else p.stem for p in given]
    name = "_".join(names) if len(names) <= 4 else f"{'_'.join(names[:3])}_and_{len(names) - 3}_more"
    return "compare_" + re.sub(r"[^\w.+-]", "-", name)


def compare_runs(paths_or_results, out_dir=None, plots: bool = True, prefix: str | None = None) -> dict:
    """Notebook entry point: returns {'table': DataFrame, 'flags': [...], 'notes': [...],
    'plots': [paths], 'results': [...]}. Plot files are named '<prefix>_throughput.png' etc.
    (prefix: see plot_prefix); the loss plot is left out when no run kept per-step losses."""
    if paths_or_results and isinstance(paths_or_results[0], dict):
        results, notes, prefix = paths_or_results, [], prefix or "compare"
    else:
        results, notes = load_runs(paths_or_results)
        prefix = prefix or plot_prefix(paths_or_results)
    df = comparison_table(results)
    if any(r["gradient_guard"].get("passed_by_exit_code") for r in results):
        notes.append(GUARD_BY_EXIT_CODE_NOTE)
    if any("repeats" in r for r in results):
        notes.append("compare_versions runs: one row per (version, mode), medians over its repeats; "
                     "'spread %' = (max - min) / median of their tokens/s")
    notes += observations(results)
    out = {"table": df, "flags": suspicious(results), "notes": notes, "plots": [], "results": results}
    if plots and out_dir is not None:
        short, shared = short_labels(list(df["run"]))
        devices = sorted({r["device"]["name"] for r in results})
        note = ", ".join(filter(None, [shared, devices[0] if len(devices) == 1 else ""]))
        plotted = df.assign(run=short)
        apart = [i for i, r in zip(df.index, results) if interpreted(r)]
        out["plots"] = [plot_throughput(plotted, out_dir, f"{prefix}_throughput.png", results, note),
                        plot_step_breakdown(plotted, out_dir, f"{prefix}_step_time.png", note, apart),
                        plot_memory(plotted, results, out_dir, f"{prefix}_memory.png", note)]
        curves = [(label, r) for label, r in zip(short, results) if r["losses"]]
        if curves:
            out["plots"].append(plot_losses([r for _, r in curves], [label for label, _ in curves],
                                            out_dir, f"{prefix}_loss.png", note))
    return out


def format_report(out: dict) -> str:
    results = out["results"]
    device = results[0]["device"]
    lines = [f"device: {device['name']} ({device['backend']}), torch {device['torch']}",
             text_table(out["table"], FLOAT_FORMATS)]
    lines += [f"note: {note}" for note in out.get("notes", [])]
    if out["flags"]:
        lines += ["", "!" * 72, f"!! {len(out['flags'])} SUSPICIOUS RESULT(S) - do not quote these "
                  "numbers before checking:"]
        lines += [f"!!  - {flag}" for flag in out["flags"]]
        lines += ["!" * 72]
    lines += [f"plot: {p}" for p in out["plots"]]
    return "\n".join(lines)
