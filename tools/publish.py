"""Publish measured results: one data set per GPU model, and the docs generated from it.

    python tools/publish.py                 # fill every published block from docs/published/
    python tools/publish.py --check         # exit 1 if a block or a RESULTS.md is out of date
    python tools/publish.py collect WORK OUT   # (benchmarks/reproduce.sh's publish step)
    python tools/publish.py compare-row REPORT VERSION MODE OUT   # (reproduce: a comparison's run as a row)

A published set, `docs/published/<gpu>/` (copied from `results/published/<gpu>/`, which
`bash benchmarks/reproduce.sh` writes), holds:

    summary.json          every number the docs quote (schema "published/1"; read by this script)
    compare_medium.json   benchmarks/compare_versions.py, medium preset (every run's full results)
    compare_small.json    the same, small preset
    compare_large.json    V1, V3, V4 and the peer, large preset
    kernels.json          version3_triton/bench_kernels.py
    ceilings.json         python -m benchmarks.ceilings
    memory_check.json     python -m analysis_tools memory: the model against measured peaks
    flop_counters         (in summary.json) DeepSpeed's and FlopCounterMode's counts against the formula
    rows.json             the full results JSON of every other row (exercise answers)
    environment.txt       setup/check_environment.py
    *.png                 throughput and step-time plots per preset, roofline, memory model
    RESULTS.md            the set's own results page (docs/RESULTS.md is the same, for the docs)

Markdown files mark each generated block with `<!-- published:NAME -->` ... `<!-- /published -->`;
this script rewrites what lies between the two from summary.json, and `--check` (run by the
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
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tools.published_format import (MODE_NAMES, PLACEHOLDER, VERSION_NAMES, best,  # noqa: E402,F401
                                    compare_caption, num, pct, ratio, speed, table)
PUBLISHED = REPO / "docs" / "published"
PRIMARY_GPU = "h200"  # the set README.md, docs/RESULTS.md and the exercises quote
SCHEMA = "published/1"
BLOCK = re.compile(r"(<!-- published:([a-z0-9-]+) -->\n)(.*?)(<!-- /published -->)", re.S)
MARKDOWN = ["README.md", "docs/*.md", "exercises/**/*.md", "version*/README.md",
            "version*/**/README.md"]
# ---------------------------------------------------------------- naming the GPU
def gpu_slug(name: str | None = None) -> str:
    """'NVIDIA H200' -> 'h200', 'AMD Instinct MI300X' -> 'mi300x'; no GPU -> 'cpu'."""
    if name is None:
        import torch
        if not torch.cuda.is_available():
            return "cpu"
        name = torch.cuda.get_device_name(0)
    words = [w for w in re.split(r"[\s_]+", name.lower())
             if w not in ("nvidia", "amd", "instinct", "radeon", "geforce", "tesla", "pro")]
    for w in words:
        if re.search(r"\d", w) and re.match(r"^[a-z0-9-]+$", w):
            return w
    return re.sub(r"[^a-z0-9]+", "-", " ".join(words)).strip("-") or "gpu"


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
    t, mem, run = result["timing_ms"], result["memory"], result["run"]
    return {"ok": True, "tokens_per_s": result["throughput"]["tokens_per_s"],
            "step_ms": t["step"]["median"], "forward_ms": t["forward"]["median"],
            "backward_ms": t["backward"]["median"], "optimizer_ms": t["optimizer"]["median"],
            "mfu": result["mfu"]["value"],
            "peak_mb": mem.get("peak_allocated_mb", mem.get("peak_rss_mb")),
            "final_loss": result["losses"][-1] if result["losses"] else None,
            "batch_size": run["batch_size"], "seq_len": run["seq_len"], "precision": run["precision"],
            "sdpa_kernel": result["options"].get("sdpa_kernel")}


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
            "version", "mode", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "step_ms",
            "x_v1_eager", "mfu_datasheet", "mfu_measured_ceiling", "peak_memory_mb", "sdpa_kernel",
            "error")}, **{f"{p}_ms": v for p, v in med.items()}})
    peak = next((r["peak_tflops_datasheet"] for r in report["runs"] if r.get("peak_tflops_datasheet")), None)
    return {"preset": report["preset"], "precision": report["precision"], "config": report["config"],
            "batch_size": report["batch_size"], "seq_len": report["seq_len"],
            "num_steps": report["num_steps"], "warmup_steps": report["warmup_steps"],
            "repeats": report["repeats"], "command": report["command"],
            "ceiling_tflops": report["ceiling"]["matmul_tflops"],
            "ceiling_spread_percent": report["ceiling"].get("spread_percent"),
            "datasheet_tflops": peak, "rows": rows, "sdpa_sweep": report.get("sdpa_sweep", [])}


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


def debug_json(log: Path, out: Path) -> int:
    """The outcomes list run_all_stages.py --json prints last, as a file of its own."""
    text = log.read_text() if log.exists() else ""
    start = text.rfind("\n[")
    try:
        outcomes = json.loads(text[start + 1:]) if start >= 0 else None
    except ValueError:
        outcomes = None
    if outcomes is None:
        print(f"error: no outcomes JSON at the end of {log}", file=sys.stderr)
        return 1
    out.write_text(json.dumps(outcomes, indent=1) + "\n")
    return 0


def collect(work: Path, out: Path) -> dict:
    """Assemble reproduce's rows in `work` into the published set `out` (+ out.tgz)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    summary: dict = {"schema": SCHEMA, "gpu": work.name, "compare": {}, "rows": {}}
    for preset in ("medium", "small", "large"):
        report = _load(work / f"compare_{preset}.json")
        if report:
            shutil.copy(work / f"compare_{preset}.json", out)
            summary["compare"][preset] = compare_summary(report)
            summary.setdefault("device", report["device"])
            summary.setdefault("git_commit", report.get("git_commit"))
            summary.setdefault("created", report.get("created"))
            _plots(out / f"compare_{preset}.json", out)
    full_rows = {}
    for path in sorted(work.glob("*/*.json")):
        section, name = path.parent.name, path.stem
        if name in ("memory_check", "outcomes", "ceilings") or path.name.startswith("."):
            continue
        data = _load(path)
        if isinstance(data, dict) and ("schema_version" in data or "exit_code" in data):
            summary["rows"][f"{section}/{name}"] = compact(data)
            full_rows[f"{section}/{name}"] = data
            summary.setdefault("device", data.get("device"))
            summary.setdefault("git_commit", data.get("git_commit"))
            summary.setdefault("created", data.get("created"))
    if full_rows:
        (out / "rows.json").write_text(json.dumps(full_rows) + "\n")
    for src, dst, key in ((work / "kernels.json", "kernels.json", "kernels"),
                          (work / "analysis" / "ceilings.json", "ceilings.json", "ceilings"),
                          (work / "memory" / "memory_check.json", "memory_check.json", "memory"),
                          (work / "debug" / "outcomes.json", None, "debug")):
        data = _load(src)
        if data is not None:
            summary[key] = data
            if dst:
                shutil.copy(src, out / dst)
    flop_rows = flop_counter_rows(work)
    if flop_rows:
        summary["flop_counters"] = flop_rows
    profiles = {v: profile_summary(work / "analysis" / v) for v in ("v1", "v3", "v4")}
    summary["profiles"] = {k: v for k, v in profiles.items() if v}
    for png in ("analysis/roofline_medium.png", "memory/memory_model.png"):
        if (work / png).exists():
            shutil.copy(work / png, out)
    if (work / "environment.txt").exists():
        shutil.copy(work / "environment.txt", out)
    summary["reproduce"] = "bash benchmarks/reproduce.sh"
    summary["published"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary["files"] = sorted(p.name for p in out.iterdir()) + ["summary.json", "RESULTS.md"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "RESULTS.md").write_text(results_page(summary, image_dir=""))
    with tarfile.open(out.with_suffix(".tgz"), "w:gz") as tar:
        tar.add(out, arcname=out.name)
    print(f"published set: {out}/ ({len(list(out.iterdir()))} files) and {out.with_suffix('.tgz')}")
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
def provenance(s: dict) -> str:
    d = s.get("device") or {}
    return (f"Measured on {d.get('name', '?')} (torch {d.get('torch', '?')}), "
            f"{(s.get('created') or '?')[:10]}, by `bash benchmarks/reproduce.sh`; "
            "the full header is in [docs/RESULTS.md](docs/RESULTS.md).")


def row_table(s: dict, rows: list[tuple[str, str]], cols=("tok/s", "step ms", "fwd / bwd / opt ms", "peak MB")) -> str:
    """A table of reproduce rows: (label, 'section/name') each."""
    getters = {
        "tok/s": lambda r: num(r.get("tokens_per_s")),
        "step ms": lambda r: num(r.get("step_ms"), ".2f"),
        "fwd / bwd / opt ms": lambda r: " / ".join(num(r.get(k), ".2f") for k in ("forward_ms", "backward_ms", "optimizer_ms")),
        "MFU": lambda r: pct(r.get("mfu")),
        "peak MB": lambda r: num(r.get("peak_mb")),
        "final loss": lambda r: num(r.get("final_loss"), ".4f"),
        "SDPA kernel": lambda r: r.get("sdpa_kernel") or "-",
    }
    out = []
    for label, key in rows:
        r = s["rows"].get(key, {"ok": False, "error": "not run"})
        if not r.get("ok"):
            why = f"exit {r['exit_code']}: {r.get('error')}" if r.get("exit_code") else r.get("error", "not run")
            out.append([label] + [why] + ["-"] * (len(cols) - 1))
        else:
            out.append([label] + [getters[c](r) for c in cols])
    return table(["run", *cols], out)


def compare_table(s: dict, preset: str, modes=None) -> str:
    c = s["compare"].get(preset)
    if not c:
        return PLACEHOLDER
    rows = []
    for r in c["rows"]:
        if modes and (r["version"], r["mode"]) not in modes:
            continue
        spread = (f" ({num(r['tokens_per_s_min'])}..{num(r['tokens_per_s_max'])})"
                  if r.get("tokens_per_s_min") != r.get("tokens_per_s_max") else "")
        rows.append([VERSION_NAMES.get(r["version"], r["version"]), MODE_NAMES.get(r["mode"], r["mode"]),
                     num(r["tokens_per_s"]) + spread if r["tokens_per_s"] else f"failed: {r.get('error')}",
                     num(r["x_v1_eager"], ".2f"), num(r["step_ms"], ".2f"),
                     " / ".join(num(r.get(f"{p}_ms"), ".2f") for p in ("forward", "backward", "optimizer")),
                     pct(r["mfu_datasheet"]), pct(r["mfu_measured_ceiling"]), num(r["peak_memory_mb"])])
    speed_column = "tokens/s (min..max)" if c["repeats"] > 1 else "tokens/s"  # one run: no range
    return table(["version", "mode", speed_column, "x V1", "step ms", "fwd / bwd / opt ms",
                  "MFU (datasheet)", "MFU (measured ceiling)", "peak MB"], rows)


def kernels_table(s: dict) -> str:
    k = s.get("kernels")
    if not k:
        return PLACEHOLDER
    copy = k.get("copy_gbs")
    rows = []
    for kind in ("rmsnorm", "add_rmsnorm", "swiglu", "attention"):
        for r in k.get(kind, []):
            bandwidth = kind != "attention"
            rate = (f"{num(r.get('gbs'), ',.0f')} GB/s" if bandwidth
                    else f"{num(r.get('tflops'), ',.1f')} TFLOP/s")
            graph = r.get("graph_gbs") if bandwidth else None
            of_copy = (f"{num(graph, ',.0f')} GB/s = {pct(graph / copy)} of copy"
                       if graph and copy else "-")
            rows.append([kind.replace("add_rmsnorm", "residual add + rmsnorm"), r.get("shape", "?"),
                         r.get("impl", "?"), num(r.get("fwd_ms"), ".3f"), num(r.get("bwd_ms"), ".3f"),
                         num(r.get("fwd_bwd_graph_ms"), ".3f"), rate, of_copy])
    return table(["kernel", "shape", "implementation", "fwd ms", "bwd ms", "fwd+bwd ms (graph replay)",
                  "rate (do_bench)", "rate (graph replay)"], rows)


def profile_block(s: dict, version: str) -> str:
    p = s.get("profiles", {}).get(version)
    if not p:
        return PLACEHOLDER
    ops = table(["operator", "calls", "self device ms"],
                [[f"`{o['name']}`", str(o["calls"]), num(o["self_device_ms"], ".2f")] for o in p["top_operators"]])
    cats = p.get("kernel_ms_by_category", {})
    total = sum(cats.values()) or 1
    kern = table(["kernel category", "ms (profiled steps)", "share"],
                 [[c, num(ms, ".2f"), pct(ms / total)] for c, ms in cats.items()])
    return f"{ops}\n\n{kern}"


# ---------------------------------------------------------------- the blocks
def _rows(prefix: str, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(label, f"{prefix}/{name}") for label, name in names]


MEMORY_ROWS = _rows("memory", [(f"V1 batch {b} x seq 512", f"v1_b{b}_s512") for b in (4, 8, 16, 32)]
                    + [(f"V1 batch 16 x seq {t}", f"v1_b16_s{t}") for t in (128, 256)])
ATTN_ROWS = _rows("memory", [(f"{v.upper()} batch 8 x seq {t}", f"attn_{v}_s{t}")
                             for t in (256, 512, 1024) for v in ("v1", "v4")])
LEVER_ROWS = _rows("levers", [("fp32", "prec_fp32"), ("tf32", "prec_tf32"), ("bf16", "prec_bf16"),
                              ("bf16, batch 8 x 2 accumulated", "batch8_accum2"),
                              ("bf16, checkpointing", "ckpt_on"), ("bf16, checkpointing, batch 32", "ckpt_on_b32"),
                              ("bf16, text data (vocab 1000)", "data_text"), ("bf16, fused AdamW", "opt_fused")])
FUSION_ROWS = _rows("fusion", [("V2, every fusion on", "v2_all_on"), ("V2 without fused QKV", "v2_no_fused_qkv"),
                               ("V2 without fused gate/up", "v2_no_fused_gate_up"),
                               ("V2 without fused RMSNorm", "v2_no_fused_rmsnorm"),
                               ("V2 without fused SiLU*mul", "v2_no_fused_swiglu")])
GATE_UP_ROWS = _rows("fusion", [("V4 graphs + master weights", "v4_graphs_master"),
                                ("the same, `--no-fused-gate-up`", "v4_graphs_master_no_fused_gate_up")])
V3_FUSION_ROWS = _rows("fusion", [("V3 graphs + master weights", "v3_graphs_master"),
                                   ("the same, `--no-fused-residual-norm`", "v3_graphs_master_no_fused_residual_norm"),
                                   ("the same, `--no-fused-qkv-grad`", "v3_graphs_master_no_fused_qkv_grad"),
                                   ("the same, `--no-triton-swiglu`", "v3_graphs_master_no_triton_swiglu"),
                                   ("V3 eager", "v3_eager"),
                                   ("the same, `--rope-in-attention`", "v3_eager_rope_in_attention")])
BLOCK_ROWS = _rows("blocks", [("autotuned", "autotuned"), ("BLOCK_M=32, BLOCK_N=32, 4 warps, 2 stages", "fwd_M_32_N_32_warps_4_stages_2"),
                              ("BLOCK_M=64, BLOCK_N=64, 4 warps, 3 stages", "fwd_M_64_N_64_warps_4_stages_3"),
                              ("BLOCK_M=128, BLOCK_N=64, 8 warps, 3 stages", "fwd_M_128_N_64_warps_8_stages_3")])
SDPA_ROWS = _rows("sdpa", [(f"`--sdpa-backend {b}`", f"backend_{b}") for b in ("auto", "flash", "efficient", "cudnn", "math")])
V1_MODES = {("v1", "eager")}


def debug_block(s: dict) -> str:
    outcomes = s.get("debug")
    if not outcomes:
        return PLACEHOLDER
    rows = [[str(o["stage"]), {True: "yes", False: "no", None: "n/a"}[o.get("tripped")], o["symptom"]]
            for o in outcomes]
    # Stage 4's broken run stops at the gradient guard (exit 5); the same run without the
    # guard is what an unguarded harness would have published.
    stages = _rows("debug", [(f"stage {n} {tag.replace('_', ' ')}", f"stage{n}_{tag}") for n in range(1, 6)
                             for tag in ("broken", "no_guard", "fixed")])
    return (table(["stage", "check tripped", "symptom"], rows) + "\n\n"
            + row_table(s, [r for r in stages if r[1] in s["rows"]], cols=("tok/s", "step ms", "fwd / bwd / opt ms", "final loss")))


def memory_check_block(s: dict) -> str:
    m = s.get("memory")
    if not m:
        return PLACEHOLDER
    rows = [[str(r.get("run", "?")), num(r.get("predicted MiB")), num(r.get("measured MiB")),
             num(r.get("error %"), "+.1f") + "%", str(r.get("peak moment", ""))] for r in m]
    return table(["run", "predicted MiB", "measured MiB", "error", "peak moment (model)"], rows)


FLOP_COUNTER_NAMES = {"flopcounter": "PyTorch FlopCounterMode", "deepspeed": "DeepSpeed FLOPS profiler"}
FLOP_SCOPES = {"step": "forward + backward, one step", "forward": "forward only, one step"}


def flop_counters_block(s: dict) -> str:
    rows = s.get("flop_counters")
    if not rows:
        return PLACEHOLDER
    return table(["version", "counter", "what it counts", "counted FLOPs", "analytic FLOPs", "ratio"],
                 [[VERSION_NAMES.get(r["version"], r["version"]), FLOP_COUNTER_NAMES.get(r["tool"], r["tool"]),
                   FLOP_SCOPES.get(r.get("scope"), r.get("scope") or "-"), num(r.get("counted")),
                   num(r.get("analytic")), num(r.get("ratio"), ".3f")] for r in rows])


def sdpa_sweep_block(s: dict) -> str:
    sweep = s["compare"].get("medium", {}).get("sdpa_sweep")
    if not sweep:
        return PLACEHOLDER
    return table(["SDPA backend", "fwd+bwd ms (one layer)", "TFLOP/s (causal)"],
                 [[r["backend"], num(r.get("fwd_bwd_ms"), ".3f"), num(r.get("tflops_causal"), ".0f")]
                  if "error" not in r else [r["backend"], r["error"], "-"] for r in sweep])


def graphs_block(s: dict) -> str:
    return compare_table(s, "small", modes={("v1", "eager"), ("v4", "eager"), ("v4", "compile"),
                                            ("v4", "reduce-overhead"), ("hf", "compile")})


def v1_summary(s: dict) -> str:
    rows = []
    for preset in ("medium", "small"):
        c, r = s["compare"].get(preset), speed(s, preset, "v1", "eager")
        if c and r:
            rows.append([preset, f"{c['batch_size']} x {c['seq_len']}", c["precision"], num(r["tokens_per_s"]),
                         f"{num(r['step_ms'], '.2f')} ({' / '.join(num(r.get(f'{p}_ms'), '.2f') for p in ('forward', 'backward', 'optimizer'))})",
                         pct(r["mfu_datasheet"]), num(r["peak_memory_mb"])])
    if not rows:
        return PLACEHOLDER
    return table(["preset", "batch x seq", "precision", "tokens/s", "step ms (fwd / bwd / opt)", "MFU", "peak MB"], rows)


def readme_table(s: dict) -> str:
    if not s["compare"].get("medium"):
        return PLACEHOLDER
    med, small = s["compare"]["medium"], s["compare"].get("small")
    rows = []
    for r in med["rows"]:
        rows.append([f"{VERSION_NAMES.get(r['version'], r['version'])}, {MODE_NAMES.get(r['mode'], r['mode'])}",
                     num(r["tokens_per_s"]), num(r["x_v1_eager"], ".2f"), num(r["step_ms"], ".2f"),
                     pct(r["mfu_datasheet"]), num(r["peak_memory_mb"])])
    text = [f"Medium preset (batch {med['batch_size']} x seq {med['seq_len']}), {med['precision']}, "
            "every version in one interleaved comparison:", "",
            table(["version, mode", "tokens/s", "x V1", "step ms", "MFU", "peak MB"], rows)]
    if small:
        v4 = best(s, "small", "v4")
        text += ["", f"On the launch-bound small preset (batch {small['batch_size']} x seq {small['seq_len']}) "
                     f"V4 at its best ({MODE_NAMES.get(v4.get('mode'), '-')}) runs {ratio(v4, speed(s, 'small', 'v1', 'eager'))} "
                     f"as fast as V1 and {ratio(v4, speed(s, 'small', 'hf', 'compile'))} as fast as the compiled peer."]
    text += ["", provenance(s)]
    return "\n".join(text)


BLOCKS = {
    "readme-table": readme_table,
    "v1-summary": v1_summary,
    "compare-medium": lambda s: compare_table(s, "medium"),
    "compare-small": lambda s: compare_table(s, "small"),
    "compare-large": lambda s: compare_table(s, "large"),
    "v1-profile": lambda s: profile_block(s, "v1"),
    "v3-profile": lambda s: profile_block(s, "v3"),
    "v4-profile": lambda s: profile_block(s, "v4"),
    "memory-vs-shape": lambda s: row_table(s, MEMORY_ROWS, cols=("tok/s", "step ms", "peak MB")),
    "attention-memory": lambda s: row_table(s, ATTN_ROWS, cols=("tok/s", "step ms", "peak MB")),
    "memory-check": memory_check_block,
    "levers": lambda s: row_table(s, LEVER_ROWS, cols=("tok/s", "step ms", "fwd / bwd / opt ms", "MFU", "peak MB")),
    "fusion-ablations": lambda s: row_table(s, FUSION_ROWS),
    "gate-up": lambda s: row_table(s, GATE_UP_ROWS),
    "v3-fusions": lambda s: row_table(s, V3_FUSION_ROWS),
    "v2-compile": lambda s: compare_table(s, "medium", modes={("v1", "eager"), ("v2", "eager"), ("v2", "compile")}),
    "v3-v4": lambda s: compare_table(s, "medium", modes={("v1", "eager"), ("v3", "eager"), ("v3", "compile"),
                                                         ("v4", "eager"), ("v4", "compile")}),
    "v4-modes": lambda s: compare_table(s, "medium", modes={("v4", m) for m in MODE_NAMES} | {("hf", "compile")}),
    "kernels": kernels_table,
    "block-sizes": lambda s: row_table(s, BLOCK_ROWS, cols=("tok/s", "step ms", "fwd / bwd / opt ms")),
    "sdpa-backends": lambda s: row_table(s, SDPA_ROWS, cols=("tok/s", "step ms", "fwd / bwd / opt ms", "SDPA kernel")),
    "sdpa-sweep": sdpa_sweep_block,
    "graphs-small": graphs_block,
    "debug-stages": debug_block,
    "flop-counters": flop_counters_block,
}


def render(name: str, s: dict | None) -> str:
    if name not in BLOCKS:
        raise SystemExit(f"error: unknown published block '{name}' (known: {', '.join(sorted(BLOCKS))})")
    if s is None:
        return PLACEHOLDER
    try:
        return BLOCKS[name](s)
    except (KeyError, TypeError, ValueError) as e:  # a set without this part
        return f"{PLACEHOLDER}\n<!-- {name}: {type(e).__name__} {e} -->"


# ---------------------------------------------------------------- RESULTS.md
def results_page(s: dict | None, image_dir: str) -> str:
    """The results page, all of it generated: tables, plots, what each teaches, conventions."""
    from tools.results_text import page
    return page(s, image_dir, render)


# ---------------------------------------------------------------- filling the docs
def load_set(gpu: str = PRIMARY_GPU) -> dict | None:
    path = PUBLISHED / gpu / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    if s.get("schema") != SCHEMA:
        raise SystemExit(f"error: {path}: schema {s.get('schema')} is not {SCHEMA}")
    return s


def fill(text: str, s: dict | None) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), s).rstrip("\n") + "\n" + m.group(4), text)


def markdown_files() -> list[Path]:
    files = set()
    for pattern in MARKDOWN:
        files |= {p for p in REPO.glob(pattern) if "published" not in p.parts and ".venv" not in p.parts}
    return sorted(files)


def publish(check: bool, gpu: str = PRIMARY_GPU) -> int:
    s = load_set(gpu)
    stale = []
    targets = {p: fill(p.read_text(), s) for p in markdown_files() if BLOCK.search(p.read_text())}
    targets[REPO / "docs" / "RESULTS.md"] = results_page(s, image_dir=f"published/{gpu}/")
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


def compare_row(report: Path, version: str, mode: str, out: Path) -> int:
    """A comparison's own run of (version, mode) as one row's JSON: the rows that would
    repeat a comparison's run (a step's baseline) are copied from it, not run again."""
    data = _load(report) or {}
    runs = [r for r in data.get("runs", []) if (r["version"], r["mode"]) == (version, mode)
            and r.get("exit_code") == 0 and r.get("result")]
    if not runs:
        print(f"no finished {version} {mode} run in {report}", file=sys.stderr)
        return 1
    median = sorted(runs, key=lambda r: r["tokens_per_s"])[(len(runs) - 1) // 2]
    from harness.results import write_atomic  # a row reproduce finds is never half-written
    write_atomic(out, median["result"])
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare-row"] and len(argv) == 5:
        return compare_row(Path(argv[1]), argv[2], argv[3], Path(argv[4]))
    if argv[:1] == ["collect"] and len(argv) == 3:
        collect(Path(argv[1]), Path(argv[2]))
        return 0
    if argv[:1] == ["debug-json"] and len(argv) == 3:
        return debug_json(Path(argv[1]), Path(argv[2]))
    p = argparse.ArgumentParser(prog="tools/publish.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if any generated text is out of date")
    p.add_argument("--gpu", default=PRIMARY_GPU, help=f"published set to quote (default {PRIMARY_GPU})")
    args = p.parse_args(argv)
    return publish(args.check, args.gpu)


if __name__ == "__main__":
    sys.exit(main())
