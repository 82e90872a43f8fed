"""The blocks of published numbers the docs hold, each rendered from the published
summary: the registry (BLOCKS: name -> renderer) and the renderers. tools/publish.py
fills every `<!-- published:NAME -->` block of the docs with render(NAME, summary)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness.results import gpu_waiting_ms  # noqa: E402
from tools.published_format import (MODE_NAMES, PLACEHOLDER, VERSION_NAMES, best,  # noqa: E402
                                    num, pct, ratio, speed, table)


def scaled_rows(s: dict, block: str) -> list[tuple[str, str, str]]:
    """(label, 'step/name', its 1-GPU row's 'step/name' or '') of the rows a docs block
    shows, in order: from the set's manifest (benchmarks/experiments.py writes it beside
    the measurements)."""
    return [(r["label"], r["key"], r.get("baseline", ""))
            for r in s.get("experiments", {}).get("rows", []) if r["block"] == block]


def block_rows(s: dict, block: str) -> list[tuple[str, str]]:
    """(label, 'step/name') of the rows a docs block shows, in order."""
    return [(label, key) for label, key, _ in scaled_rows(s, block)]


def measured(s: dict, part: str) -> str | None:
    """When a part of the set (compare_medium, kernels, a row) was measured: re-measured
    parts (publish.py update) carry their own date."""
    again = [u for u in s.get("updated", []) if u["part"] == part]
    return (again[-1] if again else s).get("created")


def provenance(s: dict, part: str = "compare_medium") -> str:
    d = s.get("device") or {}
    return (f"Measured on {d.get('name', '?')} (torch {d.get('torch', '?')}), "
            f"{(measured(s, part) or '?')[:10]}, by `bash benchmarks/reproduce.sh`; "
            "the full header is in [docs/RESULTS.md](docs/RESULTS.md).")


def _failure(r: dict) -> str:
    """Why a row has no numbers: its exit code and last line, or that it was not run."""
    return f"exit {r['exit_code']}: {r.get('error')}" if r.get("exit_code") else r.get("error", "not run")


def _phases(r: dict) -> str:
    return " / ".join(num(r.get(k), ".2f") for k in ("forward_ms", "backward_ms", "optimizer_ms"))


def row_table(s: dict, rows: list[tuple[str, str]], cols=("tok/s", "step ms", "fwd / bwd / opt ms", "peak MB")) -> str:
    """A table of reproduce rows: (label, 'section/name') each."""
    getters = {
        "tok/s": lambda r: num(r.get("tokens_per_s")),
        "step ms": lambda r: num(r.get("step_ms"), ".2f"),
        "fwd / bwd / opt ms": _phases,
        "MFU": lambda r: pct(r.get("mfu")),
        "peak MB": lambda r: num(r.get("peak_mb")),
        "final loss": lambda r: num(r.get("final_loss"), ".4f"),
        "SDPA kernel": lambda r: r.get("sdpa_kernel") or "-",
    }
    out = []
    for label, key in rows:
        r = s["rows"].get(key, {"ok": False, "error": "not run"})
        if not r.get("ok"):
            out.append([label, _failure(r)] + ["-"] * (len(cols) - 1))
        else:
            out.append([label] + [getters[c](r) for c in cols])
    return table(["run", *cols], out)


def _measured_row(s: dict, label: str, key: str, out: list, header: list) -> dict | None:
    """A block's row `key` if it has numbers; a failed one becomes a line of `out` saying why
    (its label, why, and the rest of the table's `header` empty), a row not measured is left
    out: None for both."""
    r = s["rows"].get(key)
    if r is not None and not r.get("ok"):
        out.append([label, _failure(r), *["-"] * (len(header) - 2)])
    return r if r is not None and r.get("ok") else None


def _measured_rows(s: dict, block: str, out: list, header: list):
    """(label, key, row) of each measured row of a block; a failed one becomes a line of `out`
    (_measured_row)."""
    for label, key in block_rows(s, block):
        r = _measured_row(s, label, key, out, header)
        if r is not None:
            yield label, key, r


def _measured_by_scaling(rows: list[dict]) -> str:
    """The caption of data-parallel rows' numbers: their GPUs (the most any of them used; a
    1-GPU run among them ran on the same machine), torch, days and command."""
    r = max(rows, key=lambda row: row.get("world_size", 1))
    days = sorted({(row.get("created") or "?")[:10] for row in rows})
    when = days[0] if len(days) == 1 else f"{', '.join(days[:-1])} and {days[-1]}"
    return (f"Measured on {r.get('world_size', 1)} x {r.get('device', '?')} (torch {r.get('torch', '?')}), "
            f"{when}, by `bash benchmarks/reproduce.sh scaling`.")


def scaling_table(s: dict, block: str) -> str:
    """Data-parallel rows beside the 1-GPU run they scale: efficiency = tokens/s of N GPUs /
    (N x tokens/s of one GPU at the same batch per GPU), that GPU's run measured with the row
    on the same machine. Rows not measured (too few GPUs) are left out. Beside it, what the
    step lost to data parallelism (its ms over the 1-GPU step: both are medians and tokens/s
    is tokens per step over the step, so that is step x (1 - efficiency)) and what its
    collectives take timed alone, with nothing to overlap: read together, how much of the
    communication the overlap hid."""
    header = ["run", "GPUs", "tokens/s", "tok/s per GPU", "scaling efficiency", "+ms vs 1 GPU",
              "comm ms alone", "step ms", "fwd / bwd / opt ms", "peak MB per GPU"]
    out, machines = [], {}
    for label, key, base_key in scaled_rows(s, block):
        r = _measured_row(s, label, key, out, header)
        if r is None:
            continue
        one = s["rows"].get(base_key, {}) if base_key else r
        n = r.get("world_size", 1)
        one_gpu = r.get("baseline_tokens_per_s") or (one.get("ok") and one.get("tokens_per_s"))
        efficiency = r["tokens_per_s"] / (n * one_gpu) if one_gpu else None
        lost = r["step_ms"] * (1 - efficiency) if n > 1 and efficiency and r.get("step_ms") else None
        out.append([label, str(n), num(r["tokens_per_s"]), num(r["tokens_per_s"] / n), pct(efficiency),
                    num(lost, "+.2f"), num(r.get("comm_alone_ms"), ".2f"),
                    num(r.get("step_ms"), ".2f"), _phases(r), num(r.get("peak_mb"))])
        if n > 1:
            machines.setdefault(n, []).append(r)
    if not out:
        return PLACEHOLDER
    caption = " ".join(_measured_by_scaling(machines[n]) for n in sorted(machines))
    if len(machines) > 1:
        caption += (" The 1-GPU rows shown are the last published for this page's GPU model; each "
                    "multi-GPU row's efficiency is against the 1-GPU run measured with it, on its machine.")
    return table(header, out) + (f"\n\n{caption}" if caption else "")


def overlap_table(s: dict, block: str) -> str:
    """Per rank of each profiled data-parallel row: the NCCL/RCCL kernel time of a step, the
    part of it that ran beside compute kernels and the part the step paid alone (exposed),
    the GPU's idle time and the host's median step (which of the two sets the pace)."""
    out, measured = [], []
    for label, key in block_rows(s, block):
        r = s["rows"].get(key)
        if r is None:
            continue
        if not r.get("ok") or not r.get("overlap"):
            out.append([label, "-", _failure(r) if not r.get("ok") else "no trace read", *["-"] * 5])
            continue
        for o in r["overlap"]:
            out.append([label, "-" if o["rank"] is None else str(o["rank"]),
                        num(o["comm_ms_per_step"], ".2f"),
                        f"{num(o['overlapped_ms_per_step'], '.2f')} ({pct(o['overlap_fraction'])})",
                        num(o["exposed_ms_per_step"], ".2f"), num(o["compute_ms_per_step"], ".2f"),
                        num(o.get("gpu_idle_ms_per_step"), ".2f"), num(o.get("host_step_ms"), ".2f")])
        measured.append(r)
    if not out:
        return PLACEHOLDER
    caption = (f"{_measured_by_scaling(measured)} Read from each rank's PyTorch profiler trace "
               "(`python -m analysis_tools overlap`)." if measured else "")
    return table(["run", "rank", "communication ms/step", "beside compute ms", "exposed ms",
                  "compute ms/step", "GPU idle ms/step", "host step ms"], out) + (
                      f"\n\n{caption}" if caption else "")


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
    ranged = any(r.get("tokens_per_s_min") != r.get("tokens_per_s_max") for r in c["rows"])
    speed_column = "tokens/s (min..max)" if ranged else "tokens/s"  # one run a row: no range
    text = table(["version", "mode", speed_column, "x V1", "step ms", "fwd / bwd / opt ms",
                  "MFU (datasheet)", "MFU (measured ceiling)", "peak MB"], rows)
    eager = c.get("eager_repeats", c["repeats"])
    every_row = c["repeats"] > 1  # the small preset: the host paces every row, graphs included
    if every_row or (eager > c["repeats"] and (not modes or any(m == "eager" for _, m in modes))):
        widest = max((r["tokens_per_s_max"] / r["tokens_per_s_min"] for r in c["rows"]
                      if (every_row or r["mode"] == "eager") and r.get("tokens_per_s_min")),
                     default=1.0)
        here = (f"here by up to {widest:.2f}x" if widest >= 1.05 else
                f"here by at most {widest:.2f}x: no process's host slowed in this run")
        which = "Each row" if every_row else "Each eager row"
        at_pace = any("counted" in r for r in c["rows"])  # compare_versions' rule since it has one
        text += (f"\n\n{which} is the median of {max(eager, c['repeats'])} interleaved processes"
                 + (" whose host ran at pace (one whose host ran slow is named below and left out, and "
                    "its row runs again, up to twice as many processes)" if at_pace else "")
                 + f", with the range they{' all' if at_pace else ''} spanned: where the host sets the "
                 f"pace (Python and the launches, not the GPU), one process can differ from the next "
                 f"({here}), and a wide range marks such a host-paced row. `regress` judges each row "
                 f"against its range.")
        if not every_row:
            text += " The other rows are one process each."
    return text


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
    text = table(["kernel", "shape", "implementation", "fwd ms", "bwd ms", "fwd+bwd ms (graph replay)",
                  "rate (do_bench)", "rate (graph replay)"], rows)
    ratios = attention_ratios(k.get("attention", []))
    return text + ("\n\n" + ratios if ratios else "")


def attention_ratios(rows: list[dict]) -> str:
    """One line per attention row with a ratio: SDPA's fwd+bwd time over ours (> 1: ours
    is faster), from graphs timed apart and, where measured, in paired rounds."""
    lines = []
    for r in rows:
        apart, paired = r.get("sdpa_graph_time_over_ours"), r.get("sdpa_graph_time_over_ours_paired")
        if apart is None and paired is None:
            continue
        label = r["shape"] + ("" if r.get("impl") == "triton" else f", {r.get('impl')}")
        line = f"{label}: {num(apart, '.2f')} timed apart"
        if paired is not None:
            middle = r.get("paired_middle_half")
            line += f", {paired:.2f} in paired rounds" + (
                f" (middle half {middle[0]:.2f}-{middle[1]:.2f})" if middle else "")
        lines.append(line)
    if not lines:
        return ""
    return ("SDPA's forward + backward time over V3's, both replayed from CUDA graphs; each "
            "paired round replays ours, SDPA, SDPA, ours (the median round counts), so a clock "
            "that drifts over the run moves both alike:\n\n"
            + "\n".join(f"* {line}" for line in lines))


def host_overhead_table(s: dict) -> str:
    h = s.get("host_overhead")
    if not h:
        return PLACEHOLDER

    def ratio(r: dict) -> str:
        if not (r.get("replaces") or r.get("beside")):
            return ""
        middle = r.get("ratio_iqr")
        return num(r.get("ratio"), ".2f") + (f" ({middle[0]:.2f}-{middle[1]:.2f})" if middle else "")

    rows = [[r["call"], num(r["host_us"], ",.1f"), str(r.get("launches", "-")), ratio(r)]
            for r in h["rows"]]
    paired = [r for r in h["rows"] if r.get("replaces")]
    dearer = [r["call"] for r in paired if r.get("ratio", 0) > 1]
    beside = sorted({r["call"].split()[1] for r in h["rows"] if r.get("beside")})
    verdict = (f"\n\n{len(paired) - len(dearer)} of {len(paired)} V3 calls cost the host no more than "
               f"the PyTorch call they replace (the row above each)"
               + (f"; dearer: {', '.join(dearer)}" if dearer else "")
               + (f". Shown beside PyTorch's, not judged on host time (the GPU sets their pace): "
                  f"{', '.join(beside)}" if beside else "") + ".") if paired else ""
    return (table(["call (tiny input: the GPU waits for the host)", "host us per call",
                   "kernels per call", "V3 / PyTorch (middle half of the rounds)"], rows) + verdict
            + f"\n\nMeasured on {h.get('device', '?')} (torch {h.get('torch', '?')}, triton "
              f"{h.get('triton', '?')}), {(h.get('created') or '?')[:10]}, by `bash "
              "benchmarks/reproduce.sh kernels` (`python benchmarks/host_overhead.py`).")


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


def memory_switches_block(s: dict) -> str:
    """V3 at the large preset with each memory switch: speed against the step's own default
    run (rows of one run compare; V4's best comes from another), peak memory against V4 at its
    best (the large comparison: bytes do not move from run to run) and the memory model's
    prediction for the same run."""
    v4 = speed(s, "large", "v4", "reduce-overhead-master")
    default = s["rows"].get("switches/v3_large_best") or {}
    predicted = {m.get("file"): m for m in s.get("memory_switches") or []}
    header = ["run", "tok/s", "x default", "step ms", "peak MB", "x V4 peak", "predicted MiB (model)",
              "model error"]
    out = []
    for label, key, r in _measured_rows(s, "v3-memory-switches", out, header):
        m = predicted.get(key.split("/", 1)[1], {})
        out.append([label, num(r["tokens_per_s"]), ratio(r, default), num(r.get("step_ms"), ".2f"),
                    num(r.get("peak_mb")),
                    num(r["peak_mb"] / v4["peak_memory_mb"], ".3f") + "x"
                    if r.get("peak_mb") and v4.get("peak_memory_mb") else "-",
                    num(m.get("predicted MiB")), num(m.get("error %"), "+.1f") + "%" if m else "-"])
    if not out:
        return PLACEHOLDER
    return table(header, out)


def host_probe_block(s: dict) -> str:
    """Compiled rows with --host-probe (harness/measure.py HostProbe): the step, the GPU's time
    for a step queued whole ahead of it, how long the GPU waited a step (the step less that),
    and the host's time to queue a step while the GPU was held."""
    header = ["run", "tok/s", "step ms", "GPU ms, step queued ahead", "GPU waiting ms a step",
              "host ms to queue a step (GPU held)"]
    out = []
    for label, _, r in _measured_rows(s, "host-probe", out, header):
        p = r.get("host_probe")
        waiting = gpu_waiting_ms(p, r["step_ms"]) if p and r.get("step_ms") else None
        out.append([label, num(r["tokens_per_s"]), num(r.get("step_ms"), ".2f"),
                    num(p["gpu_ms"], ".2f") if waiting is not None else "-",
                    num(waiting, ".2f") if waiting is not None else "-",
                    num(p["host_ms"], ".2f") if waiting is not None else "no reading"])
    if not out:
        return PLACEHOLDER
    return table(header, out)


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


def headroom_block(s: dict) -> str:
    """V3 and V4 at their best against the sum of the step's rooflines (analysis_tools
    headroom), medium and large, from the set's comparisons (each with the matmul ceiling it
    probed beside its runs) and the set's copy bandwidth."""
    from analysis_tools.headroom import matmul_rate, roofline_ops
    from harness.config import ModelConfig
    from harness.flops import attention_shape
    measured = s["ceilings"]["measured"]
    rows, sums = [], []
    for preset in ("medium", "large"):
        c = s["compare"].get(preset)
        if not c:
            continue
        cfg = ModelConfig(**c["config"])
        matmul = matmul_rate(s["ceilings"], c["precision"], c.get("ceiling_tflops"))
        ops = roofline_ops(cfg, c["batch_size"], c["seq_len"], c["precision"], matmul, measured["copy_gbs"])
        at_roofs = ops["roofline ms"].sum()
        for version in ("v3", "v4"):
            r = best(s, preset, version)
            if r:
                rows.append([preset, f"{VERSION_NAMES[version]}, {MODE_NAMES.get(r['mode'], r['mode'])}",
                             num(r["step_ms"], ".2f"), num(at_roofs, ".2f"), pct(at_roofs / r["step_ms"]),
                             num(r["step_ms"] - at_roofs, ".2f")])
        part = ops.groupby(ops["category"].where(ops["category"].isin(["gemm", "attention"]),
                                                 "memory"))["roofline ms"].sum()
        line = (f"- {preset} (matmul {num(matmul, ',.0f')} TFLOP/s): {num(at_roofs, '.2f')} ms = GEMMs "
                f"{num(part['gemm'], '.2f')} + attention {num(part['attention'], '.2f')} + memory-bound "
                f"kernels {num(part['memory'], '.2f')}.")
        # V3's attention at this shape in the kernel table, if it is there
        shape = attention_shape(c["batch_size"], cfg.num_heads, cfg.num_kv_heads, c["seq_len"], cfg.head_dim)
        kernel = next((k for k in (s.get("kernels") or {}).get("attention", [])
                       if k["shape"] == shape and k["impl"] == "triton" and k.get("fwd_bwd_graph_ms")), None)
        if kernel:
            step_ms = kernel["fwd_bwd_graph_ms"] * cfg.num_layers
            line += (f" V3's attention at {shape} (the kernel table, forward + backward replayed from a "
                     f"graph) takes {num(step_ms, '.2f')} ms a step: {num(step_ms - part['attention'], '.2f')} "
                     f"ms above its roofline.")
        sums.append(line)
        precision = c["precision"]
    if not rows:
        return PLACEHOLDER
    return "\n".join([
        table(["preset", "version, mode", "step ms", "at the rooflines, ms", "rooflines / step",
               "ms above them"], rows), "",
        f"The sums: GEMMs and attention at the matmul ceiling each comparison probed beside its runs "
        f"({precision}), the rest at the measured copy bandwidth ({num(measured['copy_gbs'], ',.0f')} GB/s):",
        "", *sums, "",
        "Command: `python -m analysis_tools headroom docs/published/<gpu>/compare_medium.json "
        "docs/published/<gpu>/compare_large.json --ceilings docs/published/<gpu>/ceilings.json`."])


BLOCKS = {
    "readme-table": readme_table,
    "v1-summary": v1_summary,
    "compare-medium": lambda s: compare_table(s, "medium"),
    "compare-small": lambda s: compare_table(s, "small"),
    "compare-large": lambda s: compare_table(s, "large"),
    "v1-profile": lambda s: profile_block(s, "v1"),
    "v3-profile": lambda s: profile_block(s, "v3"),
    "v4-profile": lambda s: profile_block(s, "v4"),
    "memory-vs-shape": lambda s: row_table(s, block_rows(s, "memory-vs-shape"), cols=("tok/s", "step ms", "peak MB")),
    "attention-memory": lambda s: row_table(s, block_rows(s, "attention-memory"), cols=("tok/s", "step ms", "peak MB")),
    "memory-check": memory_check_block,
    "v3-memory-switches": memory_switches_block,
    "headroom": headroom_block,
    "host-probe": host_probe_block,
    "levers": lambda s: row_table(s, block_rows(s, "levers"), cols=("tok/s", "step ms", "fwd / bwd / opt ms", "MFU", "peak MB")),
    "fusion-ablations": lambda s: row_table(s, block_rows(s, "fusion-ablations")),
    "gate-up": lambda s: row_table(s, block_rows(s, "gate-up")),
    "v3-fusions": lambda s: row_table(s, block_rows(s, "v3-fusions")),
    "v2-compile": lambda s: compare_table(s, "medium", modes={("v1", "eager"), ("v2", "eager"), ("v2", "compile")}),
    "v3-v4": lambda s: compare_table(s, "medium", modes={("v1", "eager"), ("v3", "eager"), ("v3", "compile"),
                                                         ("v4", "eager"), ("v4", "compile")}),
    "v4-modes": lambda s: compare_table(s, "medium", modes={("v4", m) for m in MODE_NAMES} | {("hf", "compile")}),
    "kernels": kernels_table,
    "host-overhead": host_overhead_table,
    "block-sizes": lambda s: row_table(s, block_rows(s, "block-sizes"), cols=("tok/s", "step ms", "fwd / bwd / opt ms")),
    "sdpa-backends": lambda s: row_table(s, block_rows(s, "sdpa-backends"), cols=("tok/s", "step ms", "fwd / bwd / opt ms", "SDPA kernel")),
    "sdpa-sweep": sdpa_sweep_block,
    "graphs-small": graphs_block,
    "debug-stages": debug_block,
    "flop-counters": flop_counters_block,
    "scaling": lambda s: scaling_table(s, "scaling"),
    "scaling-overlap": lambda s: overlap_table(s, "scaling-overlap"),
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
