"""Publish measured results: one data set per GPU model, and the docs generated from it.

    python tools/publish.py results/reproduce/<gpu>   # publish what reproduce measured, then
                                                      # fill every published block
    python tools/publish.py                 # fill every published block from docs/published/
    python tools/publish.py --check         # exit 1 if a block or a RESULTS.md is out of date

`bash benchmarks/reproduce.sh` measures: it writes results/reproduce/<gpu>/ and nothing
else. This script publishes: it reads that folder and writes docs/published/<gpu>/ - the
whole set where the GPU model has none yet, else only the steps re-run into the folder
(their comparisons, the kernel tables, training rows), keeping the rest; summary.json's
`updated` says what was re-measured when. A published set, `docs/published/<gpu>/`, holds:

    summary.json          every number the docs quote (schema "published/1"; read by this script)
    compare_medium.json   benchmarks/compare_versions.py, medium preset (every run's full results)
    compare_small.json    the same, small preset
    compare_large.json    V1, V3, V4 and the peer, large preset
    kernels.json          benchmarks/bench_kernels.py
    ceilings.json         python -m benchmarks.ceilings
    memory_check.json     python -m analysis_tools memory: the model against measured peaks
    flop_counters         (in summary.json) DeepSpeed's and FlopCounterMode's counts against the formula
    rows.json             the full results JSON of every other row (exercise answers)
    environment.txt       setup/check_environment.py
    *.png                 throughput and step-time plots per preset, roofline, memory model
    RESULTS.md            the set's own results page (docs/RESULTS.md is the same, for the docs)

Markdown files mark each generated block with `<!-- published:NAME -->` ... `<!-- /published -->`;
this script rewrites what lies between the two from summary.json (the renderers are
tools/published_blocks.py, their number formats tools/published_format.py, the results
page tools/results_text.py), and `--check` (run by the
tests) fails when any block differs from what the data says, so a number in the docs cannot
drift from its data. Without a published set each block says how to make one.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Every JSON written whole (write_json); a record's numbers read one way (numbers).
from harness.results import numbers, records_in, write_json  # noqa: E402
from tools.published_blocks import render  # noqa: E402
PUBLISHED = REPO / "docs" / "published"
PRIMARY_GPU = "h200"  # the set README.md, docs/RESULTS.md and the exercises quote
SCHEMA = "published/1"
BLOCK = re.compile(r"(<!-- published:([a-z0-9-]+) -->\n)(.*?)(<!-- /published -->)", re.S)
MARKDOWN = ["README.md", "docs/*.md", "exercises/**/*.md", "version*/README.md",
            "version*/**/README.md"]
# ---------------------------------------------------------------- naming the GPU
# ---------------------------------------------------------------- collect (reproduce's publish step)
def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def compact(result: dict | None) -> dict:
    """One training row as the docs quote it."""
    if not result:
        return {"ok": False, "error": "not run"}
    if "schema_version" not in result:  # a failed row: {"exit_code", "error"}
        return {"ok": False, "exit_code": result.get("exit_code"), "error": result.get("error")}
    m, run = numbers(result), result["run"]
    return {"ok": True, "tokens_per_s": m["tokens_per_s"],
            "step_ms": m["step_ms"], "forward_ms": m["forward_ms"],
            "backward_ms": m["backward_ms"], "optimizer_ms": m["optimizer_ms"],
            "mfu": m["mfu"], "peak_mb": m["peak_memory_mb"], "final_loss": m["final_loss"],
            "batch_size": run["batch_size"], "seq_len": run["seq_len"], "precision": run["precision"],
            "world_size": run.get("world_size", 1), "device": result["device"].get("name"),
            "torch": result["device"].get("torch"), "created": result.get("created"),
            "sdpa_kernel": result["options"].get("sdpa_kernel"),
            **({"overlap": [_overlap_numbers(r) for r in result["overlap"]["ranks"]]}
               if result.get("overlap") else {}),
            **({"host_probe": {k: result["host_probe"][k] for k in ("host_ms", "gpu_ms", "host_waited")}}
               if result.get("host_probe") else {}),
            **({"baseline_tokens_per_s": result["scaling_baseline"]["tokens_per_s"]}
               if result.get("scaling_baseline") else {}),
            **({"comm_alone_ms": comm["per_step_ms"]}
               if (comm := (result.get("distributed") or {}).get("communication") or {}).get("per_step_ms")
               else {})}


def _overlap_numbers(row: dict) -> dict:
    """A rank's communication overlap (analysis_tools overlap) as the docs quote it: its
    rank (the trace's rank<N> folder) and its milliseconds per step."""
    rank = re.search(r"rank(\d+)", row["trace"])
    return {"rank": int(rank.group(1)) if rank else None,
            **{k: row.get(k) for k in ("comm_ms_per_step", "overlapped_ms_per_step", "exposed_ms_per_step",
                                       "overlap_fraction", "compute_ms_per_step", "gpu_idle_ms_per_step",
                                       "host_step_ms")}}


def compare_summary(report: dict) -> dict:
    """The parts of a compare_versions JSON the docs quote, one row per (version, mode)."""
    phases = {}
    for run in report["runs"]:
        if run.get("exit_code") == 0:
            phases.setdefault((run["version"], run["mode"]), []).append(run["phases_ms"])
    rows = []
    for row in report["summary"]:
        ph = phases.get((row["version"], row["mode"]), [])
        med = {p: sorted(x[p] for x in ph)[len(ph) // 2] for p in ("forward", "backward", "optimizer")} if ph else {}
        rows.append({**{k: row.get(k) for k in (
            "version", "mode", "runs", "counted", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "step_ms",
            "x_v1_eager", "mfu_datasheet", "mfu_measured_ceiling", "peak_memory_mb", "sdpa_kernel",
            "error")}, **{f"{p}_ms": v for p, v in med.items()}})
    peak = next((r["peak_tflops_datasheet"] for r in report["runs"] if r.get("peak_tflops_datasheet")), None)
    return {"preset": report["preset"], "precision": report["precision"], "config": report["config"],
            "batch_size": report["batch_size"], "seq_len": report["seq_len"],
            "num_steps": report["num_steps"], "warmup_steps": report["warmup_steps"],
            "repeats": report["repeats"], "eager_repeats": report.get("eager_repeats", report["repeats"]),
            "command": report["command"],
            "ceiling_tflops": report["ceiling"]["matmul_tflops"],
            "ceiling_spread_percent": report["ceiling"].get("spread_percent"),
            "datasheet_tflops": peak, "rows": rows, "sdpa_sweep": report.get("sdpa_sweep", []),
            "slow_hosts": report.get("slow_hosts", [])}


def profile_summary(folder: Path) -> dict | None:
    """Top operators and kernel time by category of one --profile pytorch run."""
    ops_csv, kernels_csv = folder / "pytorch" / "operators.csv", folder / "pytorch" / "kernel_table.csv"
    if not ops_csv.exists():
        return None
    with ops_csv.open() as f:
        ops = sorted(csv.DictReader(f), key=lambda r: -float(r["self_device_us"] or 0))
    out = {"top_operators": [{"name": r["name"], "calls": int(r["calls"]),
                              "self_device_ms": float(r["self_device_us"] or 0) / 1e3} for r in ops[:8]]}
    if kernels_csv.exists():
        cats: dict[str, float] = {}
        with kernels_csv.open() as f:
            for r in csv.DictReader(f):
                cats[r["category"]] = cats.get(r["category"], 0.0) + float(r["total_us"] or 0) / 1e3
        out["kernel_ms_by_category"] = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
    return out


FLOP_TOOLS = ("flopcounter", "deepspeed")


def flop_counter_rows(work: Path) -> list[dict]:
    """One row per (version, tool) of reproduce's flops step: work/flops/<v>/<tool>/flops.json."""
    rows = []
    for version in ("v1", "v2", "v3", "v4"):
        for tool in FLOP_TOOLS:
            data = _load(work / "flops" / version / tool / "flops.json")
            if not isinstance(data, dict) or "counted_flops" not in data:
                continue
            rows.append({"version": version, "tool": data.get("tool", tool), "scope": data.get("scope"),
                         "counted": data["counted_flops"], "analytic": data.get("analytic_flops"),
                         "ratio": data.get("ratio"), **({"macs": data["macs"]} if "macs" in data else {})})
    return rows


def _comparisons(work: Path, out: Path):
    """reproduce's comparisons in `work`, each copied into `out` with its plots: (preset, report)."""
    for preset in ("medium", "small", "large"):
        report = _load(work / f"compare_{preset}.json")
        if report:
            shutil.copy(work / f"compare_{preset}.json", out)
            _plots(out / f"compare_{preset}.json", out)
            yield preset, report


def _rows(work: Path):
    """reproduce's training rows in `work` (a results JSON, or an exit code that is an
    answer): ('section/name', its JSON)."""
    records = records_in(work)
    baselines = {r["key"]: r.get("baseline") for r in (_load(work / "experiments.json") or {}).get("rows", [])}
    for key, data in records.items():
        extra = {}
        # a profiled row: its traces' communication overlap, beside them (the scaling step)
        overlap = _load(work / f"{key}_profile" / "overlap.json")
        if overlap:
            extra["overlap"] = overlap
        # a multi-GPU row keeps the 1-GPU throughput it was measured against, on its own
        # machine: a later machine's 1-GPU rows (4 GPUs after 2) then leave its efficiency as it was
        one = records.get(baselines.get(key) or "")
        if one and "schema_version" in one and "schema_version" in data:
            extra["scaling_baseline"] = {"key": baselines[key], "created": one.get("created"),
                                         "tokens_per_s": numbers(one)["tokens_per_s"]}
        yield key, {**data, **extra}


# The tables a step writes beside its training rows: (file in reproduce's folder, name in the
# published set or None, summary key). The kernels step writes the first two, analysis the
# ceilings (and the profiles, the roofline), memory and switches the model's checks, debug
# the outcomes.
TABLES = (("kernels.json", "kernels.json", "kernels"),
          ("host_overhead.json", "host_overhead.json", "host_overhead"),
          ("analysis/ceilings.json", "ceilings.json", "ceilings"),
          ("memory/memory_check.json", "memory_check.json", "memory"),
          ("switches/memory_check.json", None, "memory_switches"),
          ("debug/outcomes.json", None, "debug"))
PLOTS = ("analysis/roofline_medium.png", "memory/memory_model.png")


# The step whose rows each table is computed from (the memory checks read their step's rows)
_TABLE_STEPS = {(Path(dst).stem if dst else key): Path(src).parent.name for src, dst, key in TABLES}


def _stamp(part: str, data, rows: dict) -> dict:
    """When and at which commit a re-measured part was measured: its own date and commit, or,
    for a table of its step's rows (a memory check: a list, with neither), its newest row's."""
    if isinstance(data, dict):
        return {"part": part, "created": data.get("created"), "git_commit": data.get("git_commit")}
    step = _TABLE_STEPS.get(part)
    read = (rows.get(f"{step}/{entry.get('file')}") or {} for entry in data)
    created, commit = max(((r["created"], r.get("git_commit")) for r in read if r.get("created")),
                          default=(None, None))
    return {"part": part, "created": created, "git_commit": commit}


def _steps_beside_rows(work: Path, out: Path, summary: dict) -> dict:
    """Copy the tables, profiles and plots found in `work` into `out` and `summary`; returns
    {part: its data} for each table found (the profiled runs are rows of their own)."""
    found = {}
    for src, dst, key in TABLES:
        data = _load(work / src)
        if data is not None:
            summary[key] = found[Path(dst).stem if dst else key] = data
            if dst:
                shutil.copy(work / src, out / dst)
    profiles = {v: profile_summary(work / "analysis" / v) for v in ("v1", "v3", "v4")}
    if any(profiles.values()):
        summary["profiles"] = {**summary.get("profiles", {}),
                               **{k: v for k, v in profiles.items() if v}}
    for png in PLOTS:
        if (work / png).exists():
            shutil.copy(work / png, out)
    return found


def collect(work: Path, out: Path) -> dict:
    """Assemble reproduce's rows in `work` into the published set `out` (+ out.tgz)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    summary: dict = {"schema": SCHEMA, "gpu": work.name, "compare": {}, "rows": {}}
    for preset, report in _comparisons(work, out):
        summary["compare"][preset] = compare_summary(report)
        summary.setdefault("device", report["device"])
        summary.setdefault("git_commit", report.get("git_commit"))
        summary.setdefault("created", report.get("created"))
    full_rows = {}
    for key, data in _rows(work):
        summary["rows"][key], full_rows[key] = compact(data), data
        summary.setdefault("device", data.get("device"))
        summary.setdefault("git_commit", data.get("git_commit"))
        summary.setdefault("created", data.get("created"))
    if full_rows:
        write_json(out / "rows.json", full_rows, indent=None)
    _steps_beside_rows(work, out, summary)
    flop_rows = flop_counter_rows(work)
    if flop_rows:
        summary["flop_counters"] = flop_rows
    if (work / "environment.txt").exists():
        shutil.copy(work / "environment.txt", out)
    summary["experiments"] = _load(work / "experiments.json") or {}  # which block shows a row
    summary["reproduce"] = "bash benchmarks/reproduce.sh"
    summary["published"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary["files"] = sorted(p.name for p in out.iterdir()) + ["summary.json", "RESULTS.md"]
    write_json(out / "summary.json", summary, indent=1)
    (out / "RESULTS.md").write_text(results_page(summary, image_dir=""))
    print(f"published set: {out}/ ({len(list(out.iterdir()))} files)")
    return summary


def update(work: Path, out: Path) -> dict:
    """Republish the steps reproduce re-ran into `work` (its comparisons, the kernel table,
    training rows) inside the published set `out`, keeping everything else: one step
    re-measured after a change to the code it depends on. summary.json's `updated` lists
    each replaced part with when and at which commit it was measured."""
    summary = json.loads((out / "summary.json").read_text())
    parts = {}
    for preset, report in _comparisons(work, out):
        summary["compare"][preset] = compare_summary(report)
        parts[f"compare_{preset}"] = report
    parts.update(_steps_beside_rows(work, out, summary))
    rows = _load(out / "rows.json") or {}
    for key, data in _rows(work):
        summary["rows"][key], rows[key] = compact(data), data
        parts[key] = data
    if not parts:
        raise SystemExit(f"error: nothing re-measured in {work} (no comparison, row or table: "
                         f"{', '.join(src for src, _, _ in TABLES)})")
    summary["experiments"] = _load(work / "experiments.json") or summary.get("experiments", {})
    # A row its step no longer makes (renamed or dropped from the manifest) goes with it.
    manifest = {r["key"] for r in summary["experiments"].get("rows", [])}
    steps = {key.split("/")[0] for key in manifest}
    gone = {key for key in rows if key.split("/")[0] in steps and key not in manifest}
    for key in gone:
        rows.pop(key)
        summary["rows"].pop(key, None)
    write_json(out / "rows.json", rows, indent=None)
    kept = [u for u in summary.get("updated", []) if u["part"] not in {*parts, *gone}]
    summary["updated"] = kept + [_stamp(part, data, rows) for part, data in parts.items()]
    summary["files"] = sorted({*summary.get("files", []), *(p.name for p in out.iterdir())})
    write_json(out / "summary.json", summary, indent=1)
    (out / "RESULTS.md").write_text(results_page(summary, image_dir=""))
    print(f"updated in {out}/: {', '.join(parts)}"
          + (f"; dropped, no longer made: {', '.join(sorted(gone))}" if gone else ""))
    return summary


def _plots(compare_json: Path, out: Path) -> None:
    """Throughput and step-time plots of one comparison (the memory and loss plots are left out)."""
    try:
        from analysis_tools.compare import compare_runs
        made = compare_runs([str(compare_json)], out_dir=str(out))["plots"]
    except Exception as e:  # plots are a nicety: the numbers are published without them
        print(f"note: no plots for {compare_json.name}: {type(e).__name__}: {e}", file=sys.stderr)
        return
    for p in map(Path, made):
        if not p.name.endswith(("_throughput.png", "_step_time.png")):
            p.unlink(missing_ok=True)


# ---------------------------------------------------------------- formatting
def results_page(s: dict | None, image_dir: str) -> str:
    """The results page, all of it generated: tables, plots, what each teaches, conventions."""
    from tools.results_text import page
    return page(s, image_dir, render)


# ---------------------------------------------------------------- filling the docs
def load_set(gpu: str = PRIMARY_GPU, published: Path = PUBLISHED) -> dict | None:
    path = published / gpu / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    if s.get("schema") != SCHEMA:
        raise SystemExit(f"error: {path}: schema {s.get('schema')} is not {SCHEMA}")
    return s


def with_other_machines(s: dict | None, gpu: str, published: Path = PUBLISHED) -> dict | None:
    """The quoted set plus the data-parallel rows of the scaling step that it lacks and another
    GPU model's set has: a GPU count no machine of the quoted model offered (4 x H100 beside
    1 and 2 x H200). Each such row carries its machine, date and the 1-GPU throughput it was
    measured against on that machine, which the scaling table captions and divides by."""
    if s is None:
        return None
    rows = dict(s["rows"])
    for other in sorted(p.parent.name for p in published.glob("*/summary.json")):
        if other == gpu:
            continue
        for key, r in load_set(other, published)["rows"].items():
            if key.startswith("scaling/") and key not in rows and (r.get("world_size") or 1) > 1:
                rows[key] = r
    return {**s, "rows": rows}


def fill(text: str, s: dict | None) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), s).rstrip("\n") + "\n" + m.group(4), text)


def markdown_files() -> list[Path]:
    files = set()
    for pattern in MARKDOWN:
        files |= {p for p in REPO.glob(pattern) if "published" not in p.parts and ".venv" not in p.parts}
    return sorted(files)


def summary_as_compacted(gpu: str, published: Path = PUBLISHED) -> str | None:
    """The text of a set's summary.json with every row as compact() makes it today from the
    full record in rows.json: a column added to the docs reaches the rows measured before it
    (their records hold it), and a summary edited by hand shows as out of date."""
    path, full = published / gpu / "summary.json", _load(published / gpu / "rows.json")
    if not path.exists() or not full:
        return None
    s = json.loads(path.read_text())
    s["rows"] = {key: compact(full[key]) if key in full else row for key, row in s["rows"].items()}
    return json.dumps(s, indent=1) + "\n"


def publish(check: bool, gpu: str = PRIMARY_GPU) -> int:
    stale = []
    for path in sorted(PUBLISHED.glob("*/summary.json")):  # first: the docs are read from them
        new = summary_as_compacted(path.parent.name)
        if new is not None and new != path.read_text():
            stale.append(path.relative_to(REPO))
            if not check:
                write_json(path, json.loads(new), indent=1)
    s = load_set(gpu)
    quoted = with_other_machines(s, gpu)  # the docs; the set's own page shows its GPU model only
    targets = {p: fill(p.read_text(), quoted) for p in markdown_files() if BLOCK.search(p.read_text())}
    targets[REPO / "docs" / "RESULTS.md"] = results_page(quoted, image_dir=f"published/{gpu}/")
    if s:  # the set's own page, from the same data and the same text
        targets[PUBLISHED / gpu / "RESULTS.md"] = results_page(s, image_dir="")
    for path, new in targets.items():
        old = path.read_text() if path.exists() else None
        if old != new:
            stale.append(path.relative_to(REPO))
            if not check:
                path.write_text(new)
    where = f"docs/published/{gpu}/summary.json" if s else "no published set (placeholders)"
    if check:
        if stale:
            print(f"out of date with {where}: {', '.join(map(str, stale))}\n"
                  "run `python tools/publish.py` to regenerate them", file=sys.stderr)
            return 1
        print(f"published blocks match {where} ({len(targets)} files)")
        return 0
    print(f"from {where}: rewrote {len(stale)} of {len(targets)} files"
          + (f" ({', '.join(map(str, stale))})" if stale else ""))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="tools/publish.py", description=__doc__.split("\n\n")[0])
    p.add_argument("work", nargs="?", help="reproduce's folder, results/reproduce/<gpu>: publish it "
                   "into docs/published/<gpu>/ first")
    p.add_argument("--check", action="store_true", help="exit 1 if any generated text is out of date")
    p.add_argument("--gpu", default=PRIMARY_GPU, help=f"published set to quote (default {PRIMARY_GPU})")
    args = p.parse_args(argv)
    if args.work:
        if args.check:
            p.error("--check reads the docs as they are: give no folder with it")
        publish_work(Path(args.work))
    return publish(args.check, args.gpu)


def publish_work(work: Path, published: Path = PUBLISHED) -> dict:
    """reproduce's folder for one GPU model into that model's published set: the whole set
    where there is none, else only what was re-measured."""
    if not work.is_dir():
        raise SystemExit(f"error: {work} is not a folder of reproduce's results "
                         f"(bash benchmarks/reproduce.sh writes results/reproduce/<gpu>/)")
    out = published / work.resolve().name
    return update(work, out) if (out / "summary.json").exists() else collect(work, out)


if __name__ == "__main__":
    sys.exit(main())
