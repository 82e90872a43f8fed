"""regress: did a change make things worse? Compare new results with a stored
baseline (a results JSON, or a folder of them) within tolerances.

Runs are matched by what defines them (version, model, shape, precision,
compile, checkpointing); each matched pair is checked on throughput (higher is
better), peak memory and final loss (lower is better), and the gradient guard
must still pass. Any check beyond tolerance is a regression: it is named, and
the command exits 1 - ready for CI.
"""
from __future__ import annotations

import pandas as pd

from .common import AnalysisError, load_results, peak_memory_mb, run_label

DEFAULT_TOLERANCES = {"throughput": 0.05, "memory": 0.10, "loss": 0.02}
METRICS = {  # name: (how to read it, +1 if higher is better else -1)
    "throughput": (lambda r: r["throughput"]["tokens_per_s"], +1),
    "memory": (peak_memory_mb, -1),
    "loss": (lambda r: r["losses"][-1] if r["losses"] else None, -1),
}


def match_key(r: dict) -> tuple:
    """Everything that defines a run; the final loss also needs the same data, seed and steps."""
    run = r["run"]
    settings = ("batch_size", "seq_len", "precision", "compile", "grad_checkpoint", "grad_accum",
                "world_size", "data", "seed", "num_steps", "learning_rate")
    return (r["version"], tuple(sorted(r["config"].items())), *(run.get(k) for k in settings),
            tuple(sorted((k, str(v)) for k, v in r["options"].items())))


def check(baseline: list[dict], new: list[dict], tolerances: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(one row per check, notes). A row's status is ok, improved or REGRESSED."""
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    unknown = set(tol) - set(METRICS)
    if unknown:
        raise AnalysisError(f"unknown tolerance {', '.join(sorted(unknown))} "
                            f"(use {', '.join(METRICS)})")
    by_key = {match_key(b): b for b in baseline}
    rows, notes = [], []
    for r in new:
        label = run_label(r)
        base = by_key.get(match_key(r))
        if base is None:
            notes.append(f"{label}: no baseline run with the same version, config, data and "
                         "settings - skipped")
            continue
        if base["device"]["name"] != r["device"]["name"]:
            notes.append(f"{label}: baseline ran on {base['device']['name']}, this on "
                         f"{r['device']['name']} - speed differences may be the device")
        guard_ok = bool(r["gradient_guard"].get("passed")) and r["gradient_guard"].get("checked_params", 0) > 0
        rows.append({"run": label, "metric": "gradient guard", "baseline": None, "new": None,
                     "change %": None, "tolerance %": None,
                     "status": "ok" if guard_ok else "REGRESSED"})
        for metric, (read, sign) in METRICS.items():
            old_value, new_value = read(base), read(r)
            if old_value is None or new_value is None or old_value == 0:
                continue
            change = (new_value - old_value) / abs(old_value)
            worse = -sign * change  # > 0 means worse
            status = ("REGRESSED" if worse > tol[metric] else "improved" if worse < -tol[metric] else "ok")
            rows.append({"run": label, "metric": metric, "baseline": old_value, "new": new_value,
                         "change %": change * 100, "tolerance %": tol[metric] * 100, "status": status})
    if not rows:
        raise AnalysisError("nothing to compare: no new run matches a baseline run (same version, "
                            "config, batch, seq, precision, flags, data, seed and steps)")
    return pd.DataFrame(rows), notes


def check_regressions(baseline_paths, new_paths, tolerances: dict | None = None) -> dict:
    """Notebook entry point: {'table', 'notes', 'regressions': [one line each]}."""
    baseline = load_results(baseline_paths if isinstance(baseline_paths, (list, tuple)) else [baseline_paths])
    new = load_results(new_paths)
    table, notes = check(baseline, new, tolerances)
    bad = table[table["status"] == "REGRESSED"]
    lines = [f"{row['run']}: {row['metric']} " + (
        "failed" if row["metric"] == "gradient guard" else
        f"{row['baseline']:,.4g} -> {row['new']:,.4g} ({row['change %']:+.1f}%, "
        f"tolerance {row['tolerance %']:.0f}%)") for _, row in bad.iterrows()]
    return {"table": table, "notes": notes, "regressions": lines}
