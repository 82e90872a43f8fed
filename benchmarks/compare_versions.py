"""Compare every version on one configuration, in one invocation, interleaved.

    python benchmarks/compare_versions.py --preset medium --precision bf16
    python benchmarks/compare_versions.py --preset tiny --modes eager --num-steps 6   # CPU smoke
    python benchmarks/compare_versions.py --preset medium --precision bf16 --resume  # after a cut

Each (version, mode) pair trains through the very same command line an attendee
uses (`version.main([...])`), each run in a fresh Python process of its own:
same data stream, seed, precision, timing (device events, warm-up excluded,
median step), and a peak memory that is this run's alone - nothing an earlier
run left behind (compiled code, CUDA graph pools, cached blocks) is counted.
Pairs run round-robin, `--repeats` times, starting from a different pair each
round, so clock ramps and thermal drift spread over all versions instead of
favouring whichever ran first. Later repeats compile faster: Inductor's caches
on disk keep the generated code.

Modes: eager, compile (torch.compile), reduce-overhead (compile + CUDA/HIP
graphs), max-autotune (compile + GEMM autotuning: slow to compile), and
compile-master / reduce-overhead-master (the same with `--optimizer master`:
bf16 weights, fp32 masters in the optimizer; bf16 only). Each
version runs the modes its spec lists (<version folder>/spec.py) that --modes asks
for; V1 is the plain-PyTorch baseline and always runs eager. When
`transformers` is importable a peer joins: Hugging Face LlamaForCausalLM of the
same shape (SDPA attention, torch.compile), trained by the same loop.

Prints a table (tokens/s, ratio to V1 eager, MFU against the datasheet peak and
against a measured matmul ceiling, probed before and after the runs: a target
on the ceiling is judged only when the two probes agree within 3%) and writes
one JSON, rewritten atomically after every run with "complete": false (so an
interrupted comparison still leaves its results) and with "complete": true by
the last write. Each run times a fixed piece of Python just before and after its timed
steps (harness.measure.host_pace_us): a process whose host ran it more than SLOW_HOST times
slower than the fastest of the comparison's probes, or whose median step took more than
SLOW_SPELL times its fastest tenth (a spell between its probes), ran on a slow host
(host_slowdowns), and a row the host paces (eager, the small preset) is slower with its host, not with its code. Such
a process is named under the table and left out of its row's median wherever the row has a
process at pace (its speed stays in the row's min..max); `--rerun-slow-host MODES` runs the
pairs of those modes again, at most as many more times as their repeats, until as many of
their processes ran at pace as their repeats ask.
`--resume` continues an incomplete one of the same settings:
the runs already in it are kept, only the missing ones run. Each of its rows
keeps the run's complete results dict under "result", so
`python -m analysis_tools compare results/compare_medium.json` draws the plots.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import harness  # noqa: E402
import training  # noqa: E402
from harness import UsageError, WorkshopError  # noqa: E402
from harness import results as run_results  # noqa: E402
from harness.args import OneLineParser  # noqa: E402
from harness.config import PRECISIONS, VERSIONS, load_spec, load_version  # noqa: E402
from harness.results import (at_pace_else_all, comparison_paces, host_slowdowns, run_key,  # noqa: E402
                             slow_keys, slowdown_words)
from harness.spec import MODE_FLAGS  # noqa: E402
PEER = "hf"
WARMUP_STEPS = 8  # the default --warmup-steps, where --num-steps leaves room for it
# The workshop's speed targets (NVIDIA H100/H200, bf16): (preset, claim, measure, threshold).
# A target on the measured ceiling is judged only when the ceiling probes before and
# after the runs agree within harness.probes.STABLE_PERCENT; the datasheet MFU is shown beside it.
CEILING_TARGET = "V4 best >= 55% MFU of the measured matmul ceiling"
TARGETS = [
    ("medium", "V2 best >= 1.3x V1", lambda s: s.ratio(s.best("v2"), s.speed("v1", "eager")), 1.3),
    ("medium", CEILING_TARGET, lambda s: s.mfu_measured(*s.best_key("v4")), 0.55),
    ("medium", "V4 best >= 1.15x HF peer (compiled)",
     lambda s: s.ratio(s.best("v4"), s.speed(PEER, "compile")), 1.15),
    ("small", "V4 best >= 3x HF peer (compiled)",
     lambda s: s.ratio(s.best("v4"), s.speed(PEER, "compile")), 3.0),
    # Our own kernels against the vendor's: V3's fusions across operator boundaries.
    ("medium", "V3 best >= 1.15x V4 best", lambda s: s.ratio(s.best("v3"), s.best("v4")), 1.15),
    ("medium", "V3 best >= 1.35x HF peer (compiled)",
     lambda s: s.ratio(s.best("v3"), s.speed(PEER, "compile")), 1.35),
    ("small", "V3 with graphs >= 0.9x V4 with graphs",
     lambda s: s.ratio(s.speed("v3", "reduce-overhead"), s.speed("v4", "reduce-overhead")), 0.9),
    ("large", "V3 best >= 1.1x V4 best", lambda s: s.ratio(s.best("v3"), s.best("v4")), 1.1),
    ("large", "V3 best >= 60% MFU (datasheet)",
     lambda s: s.median(s.best_key("v3"), "mfu_datasheet"), 0.6),
    ("large", "V3 best's peak memory below V4 best's (V4 peak / V3 peak)",
     lambda s: s.ratio(s.median(s.best_key("v4"), "peak_memory_mb"),
                       s.median(s.best_key("v3"), "peak_memory_mb")), 1.0),
]


# ---- the peer ------------------------------------------------------------------
def build_hf_peer(config):
    """LlamaForCausalLM of the same shape: what an attendee would otherwise pick."""
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_dim,
        intermediate_size=config.ffn_dim, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings, use_cache=False,
        attn_implementation="sdpa"))

    class HFPeer(nn.Module):  # forward(ids) -> logits and .layers, as the harness expects
        def __init__(self):
            super().__init__()
            self.hf, self.layers = hf, hf.model.layers

        def forward(self, ids):
            return self.hf(input_ids=ids).logits

    return HFPeer()


def entry_point(name: str):
    if name == PEER:
        return lambda argv: training.main(PEER, build_hf_peer, argv=argv, init_from_v1=False,
                                          description="Hugging Face LlamaForCausalLM (peer)")
    return load_version(name).main


def available(name: str) -> str | None:
    """None if `name` can run here, else why not (one line)."""
    if name == PEER:
        try:
            import transformers  # noqa: F401
        except ImportError:
            return "transformers is not installed: no HF peer"
        return None
    if not (REPO / VERSIONS[name].script).exists():
        return f"{name} is not written yet"
    return None


# ---- one run ---------------------------------------------------------------------
RUN_PAIR = "--run-pair"  # internal: how run_one starts a run in a process of its own


def run_one(name: str, mode: str, repeat: int, common: list[str], workdir: Path) -> dict:
    """Train one (version, mode) pair in a fresh Python process; one row of the report.

    Its output passes through (stdout and stderr together), and the last line is
    kept as the reason when the run fails.
    """
    out = workdir / f"{name}_{mode}_{repeat}.json"
    counts = workdir / f"{name}_{mode}_{repeat}.counters.json"
    argv = [*common, *MODE_FLAGS[mode], "--output", str(out), "--quiet"]
    command = [sys.executable, str(Path(__file__).resolve()), RUN_PAIR, name, str(counts), *argv]
    started = time.perf_counter()
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as child:
        for line in child.stdout:
            if line.startswith("results: "):  # the run's own file, a temporary: the report is the result
                continue
            sys.stderr.write(line)
            if line.strip():
                lines.append(line.strip())
        code = child.wait()
    skips = json.loads(counts.read_text())["cudagraph_skips"] if counts.exists() else 0
    row = {"version": name, "mode": mode, "repeat": repeat, "exit_code": code,
           "wall_s": round(time.perf_counter() - started, 1), "cudagraph_skips": skips}
    if code == 0:
        try:
            r = run_results.load(out)
        except run_results.SchemaError as e:  # exited 0 without a readable results file
            row["exit_code"], code = 1, 1
            lines.append(f"error: {e}")
    if code != 0:
        errors = [line for line in lines if line.startswith("error")]
        row["error"] = (errors or lines or [f"exit code {code}"])[-1]
    else:
        m = run_results.numbers(r)
        row.update(tokens_per_s=m["tokens_per_s"], step_ms=m["step_ms"],
                   phases_ms={p: m[f"{p}_ms"] for p in ("forward", "backward", "optimizer")},
                   achieved_tflops=m["achieved_tflops"], mfu_datasheet=m["mfu"],
                   peak_tflops_datasheet=r["mfu"]["peak_tflops"],
                   peak_memory_mb=m["peak_memory_mb"],
                   final_loss=m["final_loss"], options=r["options"], device=r["device"],
                   config=r["config"], run=r["run"],
                   # The run's complete results dict (losses, guard, warnings, p10/p90):
                   # `python -m analysis_tools compare` reads it as it reads a results JSON.
                   result=r)
    return row


def run_pair(name: str, counters_path: str, argv: list[str]) -> int:
    """The child process of run_one: train `name` with `argv`, note CUDA graph skips."""
    import torch
    from torch._dynamo.utils import counters

    if "reduce-overhead" in argv and torch.cuda.is_available():
        torch._logging.set_logs(perf_hints=True)  # prints why CUDA graphs were skipped, if ever
    try:
        code = entry_point(name)(argv)
    except Exception as e:  # a bug in one entry must not lose the others' results
        traceback.print_exc()
        code = 1
        print(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
    Path(counters_path).write_text(json.dumps(
        {"cudagraph_skips": counters["inductor"]["cudagraph_skips"]}))
    return code


# ---- summary -------------------------------------------------------------------
class Summary:
    """Medians over repeats per (version, mode), and the comparisons the table needs: each
    over the pair's processes whose host ran at pace (all of them, where none did)."""

    def __init__(self, rows: list[dict], ceiling_tflops: float | None,
                 ceiling_spread_percent: float | None = None):
        self.ceiling, self.ceiling_spread, self.groups = ceiling_tflops, ceiling_spread_percent, {}
        self.slow_hosts = slow_hosts(rows)  # what the report names, and what the medians leave out
        self.slow = slow_keys(self.slow_hosts)
        for row in rows:
            self.groups.setdefault((row["version"], row["mode"]), []).append(row)

    def ok(self, key):
        return [r for r in self.groups.get(key, []) if r["exit_code"] == 0]

    def counted(self, key):
        """The runs a row's medians take: those whose host ran at pace where any did, else all."""
        return at_pace_else_all(self.ok(key), lambda run: run_key(run) in self.slow)

    def median(self, key, field):
        values = [r[field] for r in self.counted(key) if r.get(field) is not None]
        return statistics.median(values) if values else None

    def speed(self, version, mode):
        return self.median((version, mode), "tokens_per_s")

    def best_key(self, version):
        keys = [k for k in self.groups if k[0] == version and self.speed(*k)]
        return max(keys, key=lambda k: self.speed(*k)) if keys else (version, None)

    def best(self, version):
        return self.speed(*self.best_key(version))

    def mfu_measured(self, version, mode):
        achieved = self.median((version, mode), "achieved_tflops")
        return achieved / self.ceiling if achieved and self.ceiling else None

    @staticmethod
    def ratio(a, b):
        return a / b if a and b else None

    def rows(self) -> list[dict]:
        base = self.speed("v1", "eager")
        out = []
        for key, runs in self.groups.items():
            speeds = [r["tokens_per_s"] for r in self.ok(key)]
            first = (self.ok(key) or runs)[0]
            out.append({"version": key[0], "mode": key[1], "runs": len(runs), "ok": len(speeds),
                        "counted": len(self.counted(key)),
                        "tokens_per_s": self.speed(*key),
                        "tokens_per_s_min": min(speeds, default=None),
                        "tokens_per_s_max": max(speeds, default=None),
                        "step_ms": self.median(key, "step_ms"),
                        "x_v1_eager": self.ratio(self.speed(*key), base),
                        "mfu_datasheet": self.median(key, "mfu_datasheet"),
                        "mfu_measured_ceiling": self.mfu_measured(*key),
                        "peak_memory_mb": self.median(key, "peak_memory_mb"),
                        "sdpa_kernel": first.get("options", {}).get("sdpa_kernel"),
                        "cudagraph_skips": sum(r.get("cudagraph_skips", 0) for r in runs),
                        "error": next((r["error"] for r in runs if "error" in r), None)})
        return out

    def targets(self, preset: str) -> list[dict]:
        checks = []
        from harness.probes import STABLE_PERCENT

        for target_preset, claim, measure, threshold in TARGETS:
            if target_preset != preset:
                continue
            value = measure(self)
            check = {"target": claim, "value": value, "threshold": threshold,
                     "met": None if value is None else value >= threshold}
            if claim == CEILING_TARGET:
                check["mfu_datasheet"] = self.median(self.best_key("v4"), "mfu_datasheet")
                if self.ceiling_spread is None or self.ceiling_spread > STABLE_PERCENT:
                    check["met"] = None
                    check["note"] = ("not judged: the ceiling was probed once" if self.ceiling_spread is None
                                     else f"not judged: the two ceiling probes differ by "
                                          f"{self.ceiling_spread:.1f}% (> {STABLE_PERCENT:g}%)")
            checks.append(check)
        return checks


def format_table(summary_rows: list[dict]) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    header = ["version", "mode", "tokens/s", "min..max", "step ms", "x V1", "MFU",
              "MFU/ceil", "peak MB", "notes"]
    lines = []
    for r in summary_rows:
        notes = [f"sdpa={r['sdpa_kernel']}"] if r["sdpa_kernel"] else []
        notes += [f"cudagraph skips={r['cudagraph_skips']}"] if r["cudagraph_skips"] else []
        notes += [f"FAILED {r['ok']}/{r['runs']}: {r['error']}"] if r["error"] else []
        notes += ([f"median of the {r['counted']} of {r['ok']} at pace"]
                  if r.get("counted", r["ok"]) < r["ok"] else [])
        spread = (f"{fmt(r['tokens_per_s_min'], ',.0f')}..{fmt(r['tokens_per_s_max'], ',.0f')}"
                  if r["ok"] > 1 else "")
        lines.append([r["version"], r["mode"], fmt(r["tokens_per_s"], ",.0f"), spread,
                      fmt(r["step_ms"], ".2f"), fmt(r["x_v1_eager"], ".2f"),
                      fmt(r["mfu_datasheet"] and r["mfu_datasheet"] * 100, ".1f"),
                      fmt(r["mfu_measured_ceiling"] and r["mfu_measured_ceiling"] * 100, ".1f"),
                      fmt(r["peak_memory_mb"], ",.0f"), "; ".join(notes)])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header[:-1])]
    join = lambda cells: "  ".join(  # noqa: E731
        [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))] + cells[len(widths):])
    return "\n".join([join(header), join(["-" * w for w in widths] + ["-----"]), *map(join, lines)])


# ---- SDPA kernels side by side ----------------------------------------------------
def sdpa_sweep(config, batch: int, seq_len: int, device, dtype, calls: int = 20) -> list[dict]:
    """Forward+backward device time of causal SDPA per backend on this preset's attention shapes.

    `calls` forward+backward passes run back to back between two device events
    (replayed from one CUDA graph where capture works, so not even the host's
    launches sit between them: harness.measure's graph_ms, else median_ms), and the
    time is the median of 7 such totals divided by `calls`.
    Timing one call at a time, with a synchronise after each, would add the
    host's launch latency to every call: a 0.2 ms kernel would read 0.5 ms.
    """
    import torch
    from harness.flops import attention_flops
    from harness.measure import graph_ms, median_ms
    from version4_sdpa.tiny_llama_v4 import BACKENDS, causal_sdpa

    def tensor(heads):
        return torch.randn(batch, seq_len, heads, config.head_dim, device=device,
                           dtype=dtype).transpose(1, 2).requires_grad_()

    q, k, v = tensor(config.num_heads), tensor(config.num_kv_heads), tensor(config.num_kv_heads)
    grad_out = torch.randn_like(q)
    flop = attention_flops(batch, config.num_heads, seq_len, config.head_dim)
    rows = []
    for backend in ("auto", *BACKENDS):
        def fwd_bwd(backend=backend):
            out = causal_sdpa(q, k, v, backend)
            torch.autograd.grad(out, (q, k, v), grad_out)  # new tensors: nothing accumulates

        try:
            for _ in range(3):  # warm-up: kernel selection, workspaces
                fwd_bwd()
            ms, method = graph_ms(fwd_bwd, calls, repeats=7)[0] if device.type == "cuda" else None, "cuda graph"
            if ms is None:  # no GPU, or capture failed
                ms, method = median_ms(device, fwd_bwd, warmup=0, repeats=7, calls_per_sample=calls), "back-to-back"
            rows.append({"backend": backend, "fwd_bwd_ms": ms, "timing": method, "calls": calls,
                         "tflops_causal": (flop["forward"] + flop["backward"]) / ms / 1e9})
        except RuntimeError as e:
            rows.append({"backend": backend, "error": str(e).splitlines()[0][:120]})
    return rows


# ---- main ----------------------------------------------------------------------
def parse_args(argv):
    p = OneLineParser(prog="compare_versions.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(harness.PRESETS), default=None,
                   help="default: tiny on CPU, small on a GPU")
    p.add_argument("--versions", default="v1,v2,v3,v4,hf",
                   help="comma-separated; missing ones are skipped with a note")
    p.add_argument("--modes", default=None,
                   help="comma-separated from eager,compile,reduce-overhead,max-autotune,"
                        "compile-master,reduce-overhead-master (default: eager,compile,reduce-overhead on a GPU, eager on CPU)")
    p.add_argument("--peer-modes", default="compile", help="modes for the HF peer")
    p.add_argument("--repeats", type=int, default=2, help="rounds over all (version, mode) pairs")
    p.add_argument("--eager-repeats", type=int, default=None,
                   help="rounds of the eager pairs (default: --repeats); more where the host sets "
                        "the pace and one process differs from the next by a fifth")
    p.add_argument("--rerun-slow-host", metavar="MODES", default="",
                   help="comma-separated modes whose pairs run again where a process ran on a "
                        "slow host, until as many ran at pace as their repeats (at most twice "
                        "as many processes): the modes the host paces")
    p.add_argument("--num-steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=None,
                   help=f"steps excluded from timing (default: {WARMUP_STEPS}, at most half of "
                        f"--num-steps)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=None)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--data", choices=("synthetic", "text"), default="synthetic")
    p.add_argument("--sdpa-backend", default="auto", help="passed to V4")
    p.add_argument("--sdpa-sweep", action="store_true",
                   help="also time every SDPA backend on this preset's attention shapes")
    p.add_argument("--output", help="JSON path (default: results/compare_<preset>.json)")
    p.add_argument("--resume", action="store_true",
                   help="continue an incomplete --output of the same settings: run only the missing runs")
    p.add_argument("--report", metavar="JSON", help="only print the table of a saved comparison")
    args = p.parse_args(argv)
    if args.eager_repeats is None:
        args.eager_repeats = args.repeats
    for flag, value in (("--repeats", args.repeats), ("--eager-repeats", args.eager_repeats),
                        ("--num-steps", args.num_steps)):
        if value <= 0:
            raise UsageError(f"{flag} must be > 0 (got {value})")
    if args.warmup_steps is None:
        args.warmup_steps = min(WARMUP_STEPS, args.num_steps // 2)
    if not 0 <= args.warmup_steps < args.num_steps:
        raise UsageError(f"--warmup-steps must be >= 0 and below --num-steps "
                         f"({args.warmup_steps} vs {args.num_steps})")
    return args


def split_list(text: str, allowed, flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if s not in allowed]
    if unknown or not items:
        raise UsageError(f"{flag}: unknown {', '.join(unknown) if unknown else 'empty list'} "
                         f"(choose from {', '.join(allowed)})")
    return items


def compare(args) -> dict:
    import torch
    from harness import probes
    from training import trainer
    from harness.device import describe, resolve_device

    device = resolve_device(args.device)
    preset = args.preset or ("small" if device.type == "cuda" else "tiny")
    precision = trainer.choose_precision(args.precision, device)
    default_modes = "eager,compile,reduce-overhead" if device.type == "cuda" else "eager"
    modes = split_list(args.modes or default_modes, MODE_FLAGS, "--modes")
    rerun = split_list(args.rerun_slow_host, MODE_FLAGS, "--rerun-slow-host") if args.rerun_slow_host else []
    peer_modes = split_list(args.peer_modes, MODE_FLAGS, "--peer-modes")
    pairs = []
    for name in split_list(args.versions, [*VERSIONS, PEER], "--versions"):
        why_not = available(name)
        if why_not:
            print(f"note: {why_not}")
            continue
        if name == PEER:
            pairs += [(name, m) for m in peer_modes]
            continue
        own = load_spec(name).modes  # its plain mode first
        pairs += [(name, m) for m in ([m for m in own if m in modes] or own[:1])]
    if not pairs:
        raise UsageError("nothing to run: none of --versions is available here")
    output = Path(args.output or REPO / "results" / f"compare_{preset}.json")
    if output.suffix != ".json":
        raise UsageError("--output must end in .json")

    settings = {"preset": preset, "precision": precision, "device": device.type,
                "pairs": [list(pair) for pair in pairs], "num_steps": args.num_steps,
                "warmup_steps": args.warmup_steps, "data": args.data, "sdpa_backend": args.sdpa_backend}
    previous = load_resumable(output, settings) if args.resume else None
    if previous and previous.get("complete"):
        print(f"compare: {output} is complete: nothing to resume (without --resume it runs again)")
        print_report(previous, output)
        return previous

    common = ["--preset", preset, "--precision", precision, "--device", device.type,
              "--num-steps", str(args.num_steps), "--warmup-steps", str(args.warmup_steps),
              "--data", args.data]
    p = harness.PRESETS[preset]
    if previous:  # its first ceiling probe stands; the one after the runs is compared with it
        report = previous
        probe = report["ceiling"]["probes"][0]
        report["repeats"] = args.repeats
        report["ceiling"].update(matmul_tflops=probe["tflops"], probes=[probe], spread_percent=None)
    else:
        probe = probes.matmul_probe(device, precision)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's matrices: give their memory back to the runs
    ceiling = probe["tflops"]
    if not previous:
        report = {"schema": "compare_versions/1",
                  "created": run_results.now(),
                  "command": " ".join(["python", "benchmarks/compare_versions.py", *sys.argv[1:]]),
                  "git_commit": run_results.git_commit(), "device": describe(device),
                  "preset": preset, "precision": precision, "config": p.model.to_dict(),
                  "batch_size": p.batch_size, "seq_len": p.seq_len, "num_steps": args.num_steps,
                  "warmup_steps": args.warmup_steps, "repeats": args.repeats,
                  "eager_repeats": args.eager_repeats,
                  "ceiling": {"matmul_tflops": ceiling, "probes": [probe], "spread_percent": None,
                              "source": f"measured: benchmarks.probes.matmul_probe({precision}), "
                                        "before and after the runs; the higher of the two"},
                  "settings": settings, "complete": False,
                  "runs": [], "summary": [], "targets": []}
    print(f"compare: preset {preset}, {precision}, {report['device']['name']}, torch "
          f"{torch.__version__}; {len(pairs)} (version, mode) pairs x {args.repeats} repeats; "
          f"matmul ceiling {ceiling:.3g} TFLOP/s (measured)", flush=True)
    done = {(r["version"], r["mode"], r["repeat"]) for r in report["runs"]}
    rounds = max(args.repeats, args.eager_repeats)

    def repeats_of(mode: str) -> int:  # eager pairs run --eager-repeats rounds
        return args.eager_repeats if mode == "eager" else args.repeats

    def due(mode: str, repeat: int) -> bool:
        return repeat < repeats_of(mode)
    if previous:
        todo = sum((*pair, rep) not in done and due(pair[1], rep)
                   for pair in pairs for rep in range(rounds))
        print(f"compare: resuming {output}: {len(report['runs'])} runs kept, {todo} to run", flush=True)
    with tempfile.TemporaryDirectory(prefix="compare_") as workdir:
        def run(name: str, mode: str, repeat: int, label: str) -> None:
            extra = ["--sdpa-backend", args.sdpa_backend] if name == "v4" else []
            row = run_one(name, mode, repeat, common + extra, Path(workdir))
            speed = f"{row['tokens_per_s']:,.0f} tok/s" if row["exit_code"] == 0 else row["error"]
            print(f"  [{label}] {name:3s} {mode:16s} {speed} ({row['wall_s']} s)", flush=True)
            report["runs"].append(row)
            summary = Summary(report["runs"], ceiling)
            report["summary"], report["targets"] = summary.rows(), summary.targets(preset)
            report["slow_hosts"] = summary.slow_hosts
            run_results.write_json(output, report, indent=1)

        for repeat in range(rounds):
            for i in range(len(pairs)):
                name, mode = pairs[(i + repeat) % len(pairs)]  # rotate the starting pair
                if (name, mode, repeat) in done or not due(mode, repeat):
                    continue
                run(name, mode, repeat, f"{repeat + 1}/{rounds}")
        # Again, where a host-paced pair has fewer processes at pace than its repeats: a
        # slow spell of a shared host can last minutes, so the runs again come a round at a time.
        while short := short_of_pace(report["runs"], pairs, rerun, repeats_of):
            for name, mode, repeat in short:
                run(name, mode, repeat, f"again {repeat + 1}")
    # The ceiling again, after the runs: a target is judged on it only if it held still.
    again = probes.matmul_probe(device, precision)
    spread = probes.spread_percent(ceiling, again["tflops"])
    report["ceiling"].update(matmul_tflops=max(ceiling, again["tflops"]), spread_percent=spread)
    report["ceiling"]["probes"].append(again)
    summary = Summary(report["runs"], report["ceiling"]["matmul_tflops"], spread)
    report["summary"], report["targets"] = summary.rows(), summary.targets(preset)
    if args.sdpa_sweep and (available("v4") is None):
        run_results.write_json(output, report, indent=1)  # still incomplete: the sweep is to come
        dtype = PRECISIONS[precision].dtype
        report["sdpa_sweep"] = sdpa_sweep(p.model, p.batch_size, p.seq_len, device, dtype)
    report["slow_hosts"] = summary.slow_hosts
    report["complete"] = True
    run_results.write_json(output, report, indent=1)
    print_report(report, output)
    return report


def slow_hosts(runs: list[dict]) -> list[dict]:
    """The processes whose host ran slow (harness.results.host_slowdowns over all the
    comparison's runs: each one's slower probe over the fastest of them all, pace_x, and its
    median step over its fastest tenth, steps_x). None among fewer than 3 runs."""
    return [{"version": version, "mode": mode, "repeat": repeat, **reading}
            for (version, mode, repeat), reading in host_slowdowns(comparison_paces(runs)).items()]


def at_pace(runs: list[dict], slow: set) -> list[dict]:
    """The runs whose host ran at pace, of `slow`'s (version, mode, repeat) keys."""
    return [r for r in runs if run_key(r) not in slow]


def short_of_pace(runs: list[dict], pairs: list, modes: list[str], repeats_of) -> list[tuple]:
    """(version, mode, next repeat) of each pair of `modes` that has fewer finished processes
    at pace than its repeats (`repeats_of(mode)`) and has not yet run twice that many."""
    slow = slow_keys(slow_hosts(runs))
    short = []
    for name, mode in pairs:
        if mode not in modes:
            continue
        mine = [r for r in runs if (r["version"], r["mode"]) == (name, mode)]
        wanted = repeats_of(mode)
        fine = at_pace([r for r in mine if r["exit_code"] == 0], slow)
        if len(fine) < wanted and len(mine) < 2 * wanted:
            short.append((name, mode, max(r["repeat"] for r in mine) + 1 if mine else 0))
    return short


def print_report(report: dict, output: Path) -> None:
    print(f"\n{report['preset']} preset, {report['precision']}, {report['device']['name']} "
          f"(torch {report['device']['torch']}), batch {report['batch_size']} x seq "
          f"{report['seq_len']}; median of {report['repeats']} repeats x "
          f"{report['num_steps'] - report['warmup_steps']} timed steps; MFU vs datasheet, "
          f"MFU/ceil vs measured matmul {report['ceiling']['matmul_tflops']:.3g} TFLOP/s"
          + (f" (probes {report['ceiling']['spread_percent']:.1f}% apart)"
             if report["ceiling"].get("spread_percent") is not None else ""))
    print(format_table(report["summary"]))
    counted = {(r["version"], r["mode"]): r.get("counted", r["ok"]) < r["ok"] for r in report["summary"]}
    for s in report.get("slow_hosts", []):
        left_out = counted.get((s["version"], s["mode"]))
        print(f"host slow: {s['version']} {s['mode']} repeat {s['repeat'] + 1} {slowdown_words(s)} "
              "(harness.results.host_slowdowns): "
              + ("left out of its row's median, which its processes at pace make" if left_out else
                 "counted, since none of its row's processes ran at pace; where the host sets the "
                 "pace, that row is slower with its host, not its code"))
    for row in report.get("sdpa_sweep", []):
        timing = (f"{row['fwd_bwd_ms']:.3f} ms fwd+bwd, {row['tflops_causal']:.3g} TFLOP/s (causal; "
                  f"{row.get('timing', 'one call per sync: host latency included')})"
                  if "error" not in row else row["error"])
        print(f"sdpa {row['backend']:9s} {timing}")
    for t in report["targets"]:
        verdict = "n/a   " if t["met"] is None else ("met   " if t["met"] else "MISSED")
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        sheet = (f"; datasheet MFU {t['mfu_datasheet']:.3f}" if t.get("mfu_datasheet") is not None
                 else "")
        note = f" - {t['note']}" if t.get("note") else ""
        print(f"target {verdict} {t['target']}: {value} (need {t['threshold']}{sheet}){note}")
    print(f"results: {output}")


def load_resumable(path: Path, settings: dict) -> dict | None:
    """The comparison saved at `path` if --resume may continue it, None if there is none."""
    if not path.exists():
        return None
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: cannot read {path} ({type(e).__name__}: {e})") from None
    if not isinstance(report, dict) or report.get("schema") != "compare_versions/1" \
            or not isinstance(report.get("settings"), dict):
        raise UsageError(f"--resume: {path} is not a resumable compare_versions JSON "
                         "(remove it, or write to another --output)")
    saved = report["settings"]
    differ = [f"{key} {saved.get(key)!r}, not {value!r}" for key, value in settings.items()
              if saved.get(key) != value]
    if differ:
        raise UsageError(f"--resume: {path} has other settings ({'; '.join(differ)}): "
                         "remove it, or write to another --output")
    return report


def show_saved(path: str) -> None:
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--report {path}: cannot read it ({type(e).__name__}: {e})") from None
    if not isinstance(report, dict) or report.get("schema") != "compare_versions/1":
        raise UsageError(f"--report {path}: not a compare_versions JSON")
    print_report(report, Path(path))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [RUN_PAIR]:  # a child process of run_one
        return run_pair(argv[1], argv[2], argv[3:])
    try:
        args = parse_args(argv)
        if args.report:
            show_saved(args.report)
        else:
            compare(args)
    except WorkshopError as e:  # bad input: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
