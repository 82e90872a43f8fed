"""regress: did a change make things worse? Compare new results with a stored
baseline (a results JSON, or a folder of them) within tolerances.

Runs are matched by what defines them (version, model, shape, precision,
compile, checkpointing, the version's options); each matched pair is checked on
throughput (higher is better), peak memory and final loss (lower is better),
and the gradient guard must still pass. Any check beyond tolerance is a
regression: it is named, and the command exits 1 - ready for CI.

A version whose options changed (a new switch, a new default) still publishes
the same row: a new run without an exact match is checked against the one
baseline run that differs from it only in options, and a note names the
options that differ - so a changed default cannot hide a slower row.

Results JSONs and benchmarks/compare_versions.py JSONs both work (a comparison
counts as one median run per version and mode); `bash benchmarks/reproduce.sh`
ends by checking its comparisons against the published set this way.

A baseline is any results you trust, kept where new runs do not overwrite them:

    mkdir -p results/baseline && cp results/workshop/*.json results/baseline/
    python -m analysis_tools regress --baseline results/baseline/ results/workshop
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.results import slowdown_words

from .common import AnalysisError, numbers, run_label

DEFAULT_TOLERANCES = {"throughput": 0.05, "memory": 0.10, "loss": 0.02}
# How each metric's values are shown: tokens/s as whole numbers, MB, loss to 4 places.
DISPLAY = {"throughput": ("{:,.0f} tok/s"), "memory": "{:,.1f} MB", "loss": "{:.4f}"}
MAKE_BASELINE = ("make one from results you trust: `mkdir -p results/baseline && cp "
                 "results/workshop/*.json results/baseline/`, then `--baseline results/baseline/`")
METRICS = {  # name: (how to read it, +1 if higher is better else -1)
    "throughput": (lambda r: numbers(r)["tokens_per_s"], +1),
    "memory": (lambda r: numbers(r)["peak_memory_mb"], -1),
    "loss": (lambda r: numbers(r)["final_loss"], -1),
}


def row_key(r: dict) -> tuple:
    """What a published row is: version, model and run settings (the final loss also needs the
    same data, seed and steps) - everything but the version's own options."""
    run = r["run"]
    settings = ("batch_size", "seq_len", "precision", "compile", "compile_mode", "optimizer",
                "shard_optimizer", "reduce_after_backward", "grad_checkpoint", "grad_accum",
                "world_size", "data", "seed", "num_steps", "learning_rate")
    return (r["version"], tuple(sorted(r["config"].items())),
            *(run.get(k, ADDED_LATER.get(k)) for k in settings), parallel_key(r))


# Settings results record since a later version, with the value older results ran with.
ADDED_LATER = {"shard_optimizer": False, "reduce_after_backward": False}


# What a data-parallel run chose beyond its world size (DDP's or FSDP2's knobs): two rows of one
# model and batch on 2 GPUs, one with a lever switched back, are two rows.
PARALLEL_KNOBS = ("kind", "bucket_cap_mb", "comm_hook", "compile_ddp", "static_graph",
                  "shard_optimizer", "reduce_after_backward", "comm_priority", "reshard_after_forward",
                  "param_dtype")


def parallel_key(r: dict) -> tuple:
    d = r.get("distributed") or {}
    # a knob recorded at the value older results ran with is the row of one not recorded
    return tuple((k, d[k]) for k in PARALLEL_KNOBS
                 if k in d and not (k in ADDED_LATER and d[k] == ADDED_LATER[k]))


def options_of(r: dict) -> dict:
    return {k: str(v) for k, v in r["options"].items()}


def match_key(r: dict) -> tuple:
    """Everything that defines a run: its row and the version's options."""
    return (*row_key(r), tuple(sorted(options_of(r).items())))


def options_changed(old: dict, new: dict) -> str:
    """'fused_qkv_grad: (none) -> True, ...': the options two runs of one row differ in."""
    a, b = options_of(old), options_of(new)
    return ", ".join(f"{k}: {a.get(k, '(none)')} -> {b.get(k, '(none)')}"
                     for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def find_baseline(r: dict, by_key: dict, by_row: dict) -> tuple[dict | None, str | None]:
    """(the baseline run to check r against, a note or None). by_row holds the baseline runs
    of each row that no new run matches exactly (a run with other options is another row's
    variant, e.g. a fusion switched off, when the default it differs from was run too)."""
    label = run_label(r)
    if match_key(r) in by_key:
        return by_key[match_key(r)], None
    candidates = by_row.get(row_key(r), [])
    if len(candidates) == 1:
        return candidates[0], (f"{label}: options differ from the baseline run's "
                               f"({options_changed(candidates[0], r)}) - checked as the same row")
    if candidates:
        return None, (f"{label}: {len(candidates)} baseline runs differ from it only in options "
                      "and none matches it exactly - skipped")
    return None, f"{label}: no baseline run with the same version, config, data and settings - skipped"


def check(baseline: list[dict], new: list[dict], tolerances: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(one row per check, notes). A row's status is ok, improved or REGRESSED."""
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    unknown = set(tol) - set(METRICS)
    if unknown:
        raise AnalysisError(f"unknown tolerance {', '.join(sorted(unknown))} "
                            f"(use {', '.join(METRICS)})")
    by_key = {match_key(b): b for b in baseline}
    matched = {match_key(r) for r in new}
    by_row: dict[tuple, list[dict]] = {}
    for b in baseline:
        if match_key(b) not in matched:
            by_row.setdefault(row_key(b), []).append(b)
    rows, notes = [], []
    for r in new:
        label = run_label(r)
        if r.get("_host_slow"):  # compare_versions named its process(es) (slow_hosts)
            n = r.get("repeats", {}).get("n", 1)
            worst = max(r["_host_slow"], key=lambda s: (s["pace_x"], s["steps_x"] or 0))
            notes.append(f"{label}: the host ran slow in all {n} process(es) (the slowest "
                         f"{slowdown_words(worst)}): where the host sets the pace, that row moves "
                         "with its host")
        elif r.get("_host_left_out"):
            notes.append(f"{label}: {r['_host_left_out']} process(es) whose host ran slow left out "
                         "of its median, as in the comparison's table")
        base, note = find_baseline(r, by_key, by_row)
        if note:
            notes.append(note)
        if base is None:
            continue
        if base["device"]["name"] != r["device"]["name"]:
            notes.append(f"{label}: baseline ran on {base['device']['name']}, this on "
                         f"{r['device']['name']} - speed differences may be the device")
        guard_ok = bool(r["gradient_guard"].get("passed")) and r["gradient_guard"].get("checked_params", 0) > 0
        rows.append({"run": label, "metric": "gradient guard", "baseline": _guard(base),
                     "new": _guard(r), "change %": None, "tolerance %": None,
                     "status": "ok" if guard_ok else "REGRESSED"})
        for metric, (read, sign) in METRICS.items():
            old_value, new_value = read(base), read(r)
            if old_value is None or new_value is None or old_value == 0:
                continue
            change = (new_value - old_value) / abs(old_value)
            worse = -sign * change  # > 0 means worse
            band = tol[metric] if metric != "throughput" else throughput_band(tol[metric], base, r)
            status = ("REGRESSED" if worse > band else "improved" if worse < -band else "ok")
            rows.append({"run": label, "metric": metric, "baseline": old_value, "new": new_value,
                         "change %": change * 100, "tolerance %": band * 100, "status": status})
    if not rows:
        raise AnalysisError("nothing to compare: no new run matches a baseline run (same version, "
                            "config, batch, seq, precision, flags, data, seed and steps)")
    return pd.DataFrame(rows), notes


def throughput_band(tolerance: float, *runs: dict) -> float:
    """How far a row's tokens/s may move before it counts: the tolerance, or the spread its
    processes showed when it was measured over several ((max - min) / median of the repeats
    of a compare_versions row, baseline or new), whichever is wider. A host-paced row (eager
    on the small preset) moves by a fifth from one process to the next at unchanged code:
    that is noise, not a regression, and a single process cannot tell the two apart."""
    from .compare import spread_percent
    spreads = [s / 100 for s in map(spread_percent, runs) if s is not None]
    return max([tolerance, *spreads])


def _guard(r: dict) -> str:
    g = r["gradient_guard"]
    return f"{'passed' if g.get('passed') else 'FAILED'}, {g.get('checked_params', 0)} params"


def show(metric: str, value) -> str:
    """One value as the table shows it (gradient-guard values are text already)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return DISPLAY[metric].format(value) if metric in DISPLAY else str(value)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The check table with each value in its metric's unit, ready to print."""
    out = table.copy()
    for col in ("baseline", "new"):
        out[col] = [show(m, v) for m, v in zip(table["metric"], table[col])]
    for col, spec in (("change %", "{:+.1f}"), ("tolerance %", "{:.0f}")):
        out[col] = ["" if v is None or pd.isna(v) else spec.format(v) for v in table[col]]
    return out


def check_regressions(baseline_paths, new_paths, tolerances: dict | None = None) -> dict:
    """Notebook entry point: {'table', 'notes', 'regressions': [one line each]}."""
    baseline_paths = baseline_paths if isinstance(baseline_paths, (list, tuple)) else [baseline_paths]
    for path in baseline_paths:
        if not Path(path).exists():
            raise AnalysisError(f"baseline {path}: no such file or folder; {MAKE_BASELINE}")
    # Results JSONs, or benchmarks/compare_versions.py JSONs (one median run per version and mode)
    from .compare import load_runs
    baseline, base_notes = load_runs(baseline_paths)
    new, new_notes = load_runs(new_paths)
    table, notes = check(baseline, new, tolerances)
    notes = base_notes + new_notes + notes
    bad = table[table["status"] == "REGRESSED"]
    lines = [f"{row['run']}: {row['metric']} " + (
        f"failed ({row['new']})" if row["metric"] == "gradient guard" else
        f"{show(row['metric'], row['baseline'])} -> {show(row['metric'], row['new'])} "
        f"({row['change %']:+.1f}%, tolerance {row['tolerance %']:.0f}%)")
        for _, row in bad.iterrows()]
    return {"table": table, "notes": notes, "regressions": lines}
