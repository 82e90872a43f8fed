"""Every published row that is one training run, named once.

benchmarks/reproduce.sh runs these rows (`python -m benchmarks.experiments rows STEP` lists a
step's rows for it), and tools/published_blocks.py fills the docs' tables from them (the
block, the label and the JSON a row writes). A new row is one line here; a block of the docs
shows it. Every row runs at its step's preset (medium; tiny under reproduce --quick) with the
timed-run flags reproduce gives every row, plus its own flags.

    python -m benchmarks.experiments list          # every row: step/name, block, command
    python -m benchmarks.experiments rows fusion   # one step's rows, tab-separated, for reproduce.sh
    python -m benchmarks.experiments manifest OUT  # the rows' blocks and labels, as JSON
    python -m benchmarks.experiments compare-row REPORT VERSION MODE OUT
    python -m benchmarks.experiments step-rows SOURCE STEP OUT
    python -m benchmarks.experiments host-pace WORK OUT

The manifest travels with the measurements (reproduce writes it into its work folder), so
publishing reads which block shows which row from JSON, like every number it publishes.
compare-row copies a comparison's own run into a row's JSON (a row that would repeat it);
step-rows writes one step's finished rows, one record each, for regress. host-pace says
whether a row's host ran slow (exit 1, with how), against every process in
reproduce's work folder: a host-paced row that did runs again.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.config import VERSIONS  # noqa: E402
from harness.results import (at_pace_else_all, comparison_paces, host_slowdowns, records_in,  # noqa: E402
                             run_key, run_pace, slow_keys, slowdown_words, write_atomic, write_json)


@dataclass(frozen=True)
class Row:
    step: str             # the reproduce step that runs it; its JSON is <step>/<name>.json
    name: str
    block: str            # the docs block that shows it (tools/published_blocks.py)
    label: str            # its label there
    version: str
    flags: tuple = ()
    same_as: str = ""     # the mode of the medium comparison this row repeats: copied from it
    env: tuple = ()       # VAR=value settings of the run
    answers: tuple = ()   # exit codes that are an answer, not a failure (2: no such kernel here)
    quick: bool = False   # reproduce --quick runs a step's quick rows (all, where none is)
    gpus: int = 1         # processes under torchrun, one per GPU (1: plain python)
    baseline: str = ""    # the 1-GPU row of the same step whose work per GPU this row scales
    preset: str = "medium"  # its size (reproduce --quick runs every preset at tiny)

    @property
    def key(self) -> str:
        return f"{self.step}/{self.name}"


BF16 = ("--precision", "bf16")
GRAPHS = ("--compile", "--compile-mode", "reduce-overhead", "--optimizer", "master")
BLOCK_CONFIGS = ((32, 32, 4, 2), (64, 64, 4, 3), (128, 64, 8, 3))  # BLOCK_M, BLOCK_N, warps, stages
V3_FUSIONS_OFF = ("fused_residual_norm", "fused_qkv_grad", "triton_swiglu")
V2_FUSIONS = {"fused_qkv": "fused QKV", "fused_gate_up": "fused gate/up",
              "fused_rmsnorm": "fused RMSNorm", "fused_swiglu": "fused SiLU*mul"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _memory() -> list[Row]:
    rows = [Row("memory", f"v1_b{b}_s512", "memory-vs-shape", f"V1 batch {b} x seq 512", "v1",
                (*BF16, "--batch-size", str(b)) if b != 16 else BF16, same_as="eager" if b == 16 else "")
            for b in (4, 8, 16, 32)]
    # the medium preset's table length, said: the tiny preset of reproduce --quick has 64
    rows += [Row("memory", f"v1_b16_s{t}", "memory-vs-shape", f"V1 batch 16 x seq {t}", "v1",
                 (*BF16, "--seq-len", str(t), "--max-seq-len", "512")) for t in (128, 256)]
    # the T x T scores: V1 against V4 as the sequence grows
    rows += [Row("memory", f"attn_{v}_s{t}", "attention-memory", f"{v.upper()} batch 8 x seq {t}", v,
                 (*BF16, "--batch-size", "8", "--seq-len", str(t), "--max-seq-len", "1024"))
             for t in (256, 512, 1024) for v in ("v1", "v4")]
    return rows


def _levers() -> list[Row]:
    lever = [("prec_fp32", "fp32", ("--precision", "fp32")), ("prec_tf32", "tf32", ("--precision", "tf32")),
             ("prec_bf16", "bf16", BF16),
             ("batch8_accum2", "bf16, batch 8 x 2 accumulated", (*BF16, "--batch-size", "8", "--grad-accum", "2")),
             ("ckpt_on", "bf16, checkpointing", (*BF16, "--grad-checkpoint")),
             ("ckpt_on_b32", "bf16, checkpointing, batch 32", (*BF16, "--grad-checkpoint", "--batch-size", "32")),
             ("data_text", "bf16, text data (vocab 1000)", (*BF16, "--data", "text", "--vocab-size", "1000")),
             ("opt_fused", "bf16, fused AdamW", (*BF16, "--optimizer", "fused"))]
    return [Row("levers", name, "levers", label, "v1", flags, same_as="eager" if name == "prec_bf16" else "",
                quick=name == "prec_fp32") for name, label, flags in lever]


def _fusion() -> list[Row]:
    rows = [Row("fusion", "v3_graphs_master", "v3-fusions", "V3 graphs + master weights", "v3", (*BF16, *GRAPHS),
                same_as="reduce-overhead-master")]
    rows += [Row("fusion", f"v3_graphs_master_no_{s}", "v3-fusions", f"the same, `--no-{_flag(s)[2:]}`", "v3",
                 (*BF16, *GRAPHS, f"--no-{_flag(s)[2:]}")) for s in V3_FUSIONS_OFF]
    rows.append(Row("fusion", "v3_graphs_master_fused_linear_ce", "v3-fusions", "the same, `--fused-linear-ce`",
                    "v3", (*BF16, *GRAPHS, "--fused-linear-ce")))
    rows += [Row("fusion", "v3_eager", "v3-fusions", "V3 eager", "v3", BF16, same_as="eager"),
             Row("fusion", "v3_eager_rope_in_attention", "v3-fusions", "the same, `--rope-in-attention`", "v3",
                 (*BF16, "--rope-in-attention")),
             Row("fusion", "v2_all_on", "fusion-ablations", "V2, every fusion on", "v2", BF16, same_as="eager")]
    rows += [Row("fusion", f"v2_no_{s}", "fusion-ablations", f"V2 without {what}", "v2",
                 (*BF16, f"--no-{_flag(s)[2:]}")) for s, what in V2_FUSIONS.items()]
    rows += [Row("fusion", "v4_graphs_master", "gate-up", "V4 graphs + master weights", "v4", (*BF16, *GRAPHS),
                 same_as="reduce-overhead-master"),
             Row("fusion", "v4_graphs_master_no_fused_gate_up", "gate-up", "the same, `--no-fused-gate-up`", "v4",
                 (*BF16, *GRAPHS, "--no-fused-gate-up"))]
    return rows


def _blocks() -> list[Row]:
    rows = [Row("blocks", "autotuned", "block-sizes", "autotuned", "v3", BF16, same_as="eager")]
    for m, n, warps, stages in BLOCK_CONFIGS:
        rows.append(Row("blocks", f"fwd_M_{m}_N_{n}_warps_{warps}_stages_{stages}", "block-sizes",
                        f"BLOCK_M={m}, BLOCK_N={n}, {warps} warps, {stages} stages", "v3", BF16,
                        env=(f"V3_ATTN_FWD_CONFIG=BLOCK_M={m},BLOCK_N={n},num_warps={warps},num_stages={stages}",)))
    return rows


SCALING_MODES = {"compile": ("compiled", ("--compile",)), "best": ("graphs + master weights", GRAPHS)}


def _ddp(flags: tuple) -> tuple:
    """A DDP row's flags. With master weights, data parallelism shards the optimizer unless
    told not to (training/parallel.py, sharded_by_default), and compiled with fp32 weights it
    all-reduces after the backward (reduced_after_backward_by_default): their DDP rows are
    lever rows."""
    if "master" in flags:
        return (*flags, "--no-shard-optimizer")
    compiled_ddp = "--compile" in flags and "--fsdp" not in flags
    return (*flags, "--no-reduce-after-backward") if compiled_ddp else flags


def _flat_rows(version: str, mode: str, words: str, flags: tuple, flag: str) -> list[Row]:
    """A flat optimizer's rows (training/sharded_optimizer.py, `flag` names it) on 1, 2 and 4
    GPUs; the 1-GPU row runs the same flat AdamW update with nothing to send, so that the
    efficiency is the data parallelism's alone."""
    name, chosen = flag[2:].replace("-", "_"), (*BF16, *flags, flag)
    one = f"{version}_{mode}_1gpu_{name}"
    return [Row("scaling", one, "scaling", f"{version.upper()} {words}, 1 GPU, `{flag}`", version, chosen,
                env=("OMP_NUM_THREADS=1",)),
            *(Row("scaling", f"{version}_{mode}_ddp{n}_{name}", "scaling", f"{version.upper()} {words}, x{n}, `{flag}`",
                  version, chosen, gpus=n, baseline=one) for n in (2, 4))]


def _scaling() -> list[Row]:
    """Every version in the two modes the workshop publishes, on 1, 2 and 4 GPUs (the
    medium preset's batch per GPU, so N GPUs do N times the work), FSDP2 beside DDP, the
    levers the defaults include (the communication stream's priority; compiled without
    graphs, 200 MiB buckets) switched back, and DDP's other levers on V4 compiled
    (docs/MULTI_GPU.md, "Tuning DDP and FSDP2")."""
    rows = []
    for version in ("v1", "v2", "v3", "v4"):
        for mode, (words, flags) in SCALING_MODES.items():
            one = f"{version}_{mode}_1gpu"
            # torchrun gives each of its processes one OpenMP thread; so does the baseline,
            # so that the two runs differ in the number of GPUs only
            rows.append(Row("scaling", one, "scaling", f"{version.upper()} {words}, 1 GPU", version,
                            (*BF16, *flags), env=("OMP_NUM_THREADS=1",)))
            rows += [Row("scaling", f"{version}_{mode}_ddp{n}", "scaling",
                         f"{version.upper()} {words}, DDP x{n}", version, _ddp((*BF16, *flags)),
                         gpus=n, baseline=one) for n in (2, 4)]
    rows += [Row("scaling", "v4_compile_fsdp2", "scaling", "V4 compiled, FSDP2 x2", "v4",
                 (*BF16, "--compile", "--fsdp"), gpus=2, baseline="v4_compile_1gpu"),
             Row("scaling", "v4_best_ddp2_normal_priority", "scaling",
                 "V4 graphs + master weights, DDP x2, `--comm-priority normal`", "v4",
                 _ddp((*BF16, *GRAPHS, "--comm-priority", "normal")), gpus=2, baseline="v4_best_1gpu"),
             # the graphed rows' backward runs ~1.5 ms longer beside NCCL's kernels: with fewer
             # channels NCCL holds fewer SMs, and their bf16 all-reduce still fits in the backward
             Row("scaling", "v4_best_ddp2_nccl8", "scaling",
                 "V4 graphs + master weights, DDP x2, `NCCL_MAX_NCHANNELS=8`", "v4",
                 _ddp((*BF16, *GRAPHS)), gpus=2, baseline="v4_best_1gpu", env=("NCCL_MAX_NCHANNELS=8",))]
    # the medium rows' all-reduce takes about what a step loses, overlap or not: the same
    # bytes as a reduce-scatter and an all-gather after the backward buy 1/N of the optimizer
    # (and, compiled without graphs, one graph instead of a piece per bucket). Its baseline
    # runs the same flat AdamW update on one GPU, so the efficiency is the sharding's alone.
    # Compiled with master weights but no graphs, beside DDP in the same mode: the bf16
    # gradients of the best mode with the host launching every kernel, which tells apart
    # what the sharding's gain at its best owes to each.
    master = ("--compile", "--optimizer", "master")
    rows += [Row("scaling", "v4_compile_master_1gpu", "scaling", "V4 compiled + master weights, 1 GPU", "v4",
                 (*BF16, *master), env=("OMP_NUM_THREADS=1",)),
             Row("scaling", "v4_compile_master_ddp2", "scaling", "V4 compiled + master weights, DDP x2", "v4",
                 _ddp((*BF16, *master)), gpus=2, baseline="v4_compile_master_1gpu")]
    # V4 sharded in each mode; the other versions at their best, the mode with master weights
    v4_modes = {**SCALING_MODES, "compile_master": ("compiled + master weights", master)}
    for version in ("v1", "v2", "v3", "v4"):
        modes = v4_modes if version == "v4" else {"best": SCALING_MODES["best"]}
        for mode, (words, flags) in modes.items():
            rows += _flat_rows(version, mode, words, flags, "--shard-optimizer")
    # Compiled with fp32 weights, the default over several GPUs: no DDP, the gradients
    # all-reduced in bf16 after the backward and each piece updated as it lands, in one
    # compiled graph
    for version in ("v1", "v2", "v3", "v4"):
        rows += _flat_rows(version, "compile", *SCALING_MODES["compile"], "--reduce-after-backward")
    levers = {  # name: (label, flags), each on V4 compiled x2
        "ddp2_bucket25": ("DDP x2, `--ddp-bucket-mb 25`", ("--ddp-bucket-mb", "25")),
        "ddp2_whole": ("DDP x2, `--compile-ddp whole`", ("--compile-ddp", "whole")),
        "ddp2_bf16_allreduce": ("DDP x2, `--ddp-comm-hook bf16`", ("--ddp-comm-hook", "bf16")),
        "ddp2_static": ("DDP x2, `--ddp-static-graph`", ("--ddp-static-graph",)),
        "fsdp2_keep": ("FSDP2 x2, `--fsdp-reshard-after-forward false`",
                       ("--fsdp", "--fsdp-reshard-after-forward", "false")),
        "fsdp2_bf16": ("FSDP2 x2, `--fsdp-param-dtype bf16`", ("--fsdp", "--fsdp-param-dtype", "bf16"))}
    rows += [Row("scaling", f"v4_compile_{name}", "scaling", f"V4 compiled, {label}", "v4",
                 (*BF16, "--compile", *flags), gpus=2, baseline="v4_compile_1gpu")
             for name, (label, flags) in levers.items()]
    # What FSDP2 is for: at the large preset (~1 B parameters, ~16 GB of fp32 weights,
    # gradients and AdamW state) each GPU keeps half of that state, and its blocks are big
    # enough for their compute to hide the gathers
    rows.append(Row("scaling", "v4_compile_large_1gpu", "scaling", "V4 compiled, large preset, 1 GPU",
                    "v4", (*BF16, "--compile"), env=("OMP_NUM_THREADS=1",), preset="large"))
    rows += [Row("scaling", f"v4_compile_large_{kind}2", "scaling", f"V4 compiled, large preset, {words} x2",
                 "v4", _ddp((*BF16, "--compile", *flags)), gpus=2, baseline="v4_compile_large_1gpu",
                 preset="large")
             for kind, words, flags in (("ddp", "DDP", ()), ("fsdp", "FSDP2", ("--fsdp",)))]
    # Overlap, read from the profiler: V4's DDP x2 rows again under the PyTorch profiler
    # (reproduce gives a profiled row its own --profile-dir and reads each rank's trace),
    # each after its 1-GPU run profiled alike (its baseline): the compute kernels' time with no
    # NCCL beside them
    for mode, (words, flags) in SCALING_MODES.items():
        profiled = (*BF16, *flags, "--profile", "pytorch")
        rows += [Row("scaling", f"v4_{mode}_1gpu_profiled", "scaling-overlap", f"V4 {words}, 1 GPU",
                     "v4", profiled, env=("OMP_NUM_THREADS=1",)),
                 Row("scaling", f"v4_{mode}_ddp2_profiled", "scaling-overlap", f"V4 {words}, DDP x2",
                     "v4", _ddp(profiled), gpus=2, baseline=f"v4_{mode}_1gpu_profiled")]
    # and FSDP2's: how much of its gathering and scattering the step pays in full
    rows.append(Row("scaling", "v4_compile_fsdp2_profiled", "scaling-overlap", "V4 compiled, FSDP2 x2", "v4",
                    (*BF16, "--compile", "--fsdp", "--profile", "pytorch"), gpus=2, baseline="v4_compile_1gpu"))
    # and the compiled default's: its all-reduce after the backward, beside the update
    after = (*BF16, "--compile", "--reduce-after-backward", "--profile", "pytorch")
    one = "v4_compile_1gpu_reduce_after_backward_profiled"
    rows += [Row("scaling", one, "scaling-overlap", "V4 compiled, 1 GPU, `--reduce-after-backward`", "v4", after,
                 env=("OMP_NUM_THREADS=1",)),
             Row("scaling", "v4_compile_ddp2_reduce_after_backward_profiled", "scaling-overlap",
                 "V4 compiled, x2, `--reduce-after-backward`", "v4", after, gpus=2, baseline=one)]
    return rows


RECOMPUTATIONS = ("recompute_rope", "recompute_swiglu", "recompute_norm")


def _switches() -> list[Row]:
    """V3 at its best at the large preset (the fused loss on, its default at a 32k vocabulary),
    with the fused loss off, then each recomputation on, then all three: what each saves in
    peak memory and costs in speed (the memory model predicts each)."""
    rows = [Row("switches", "v3_large_best", "v3-memory-switches", "V3 graphs + master weights", "v3",
                (*BF16, *GRAPHS), preset="large"),
            Row("switches", "v3_large_best_no_fused_linear_ce", "v3-memory-switches",
                "the same, `--no-fused-linear-ce`", "v3", (*BF16, *GRAPHS, "--no-fused-linear-ce"), preset="large")]
    rows += [Row("switches", f"v3_large_best_{s}", "v3-memory-switches", f"the same, `{_flag(s)}`", "v3",
                 (*BF16, *GRAPHS, _flag(s)), preset="large") for s in RECOMPUTATIONS]
    rows.append(Row("switches", "v3_large_best_all", "v3-memory-switches", "the same, all three recomputations",
                    "v3", (*BF16, *GRAPHS, *map(_flag, RECOMPUTATIONS)), preset="large"))
    return rows


def _sdpa() -> list[Row]:
    return [Row("sdpa", f"backend_{b}", "sdpa-backends", f"`--sdpa-backend {b}`", "v4", (*BF16, "--sdpa-backend", b),
                same_as="eager" if b == "auto" else "", answers=() if b == "auto" else (2,))
            for b in ("auto", "flash", "efficient", "cudnn", "math")]


# Torch's own switch: 0 overrides what V3's kernels/operators.py sets
TRITON_LAUNCHER = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=0"


def _host() -> list[Row]:
    """Who paces a compiled step without graphs (docs/PROFILING.md): V3 and V4 compiled on one
    GPU with --host-probe (how long the GPU waits for the host a step, and the host's time to
    queue a step), and V3 with its kernels launched through Triton's launcher instead of
    Inductor's static one. GPU rows only: reproduce --quick skips the step."""
    probe = (*BF16, "--compile", "--host-probe", "8")
    return [Row("host", "v3_compile", "host-probe", "V3 compiled", "v3", probe),
            Row("host", "v3_compile_triton_launcher", "host-probe",
                f"the same, `{TRITON_LAUNCHER}` (Triton's launcher)", "v3", probe, env=(TRITON_LAUNCHER,)),
            Row("host", "v4_compile", "host-probe", "V4 compiled", "v4", probe)]


ROWS: tuple[Row, ...] = (*_memory(), *_levers(), *_fusion(), *_blocks(), *_sdpa(), *_switches(), *_host(),
                         *_scaling())
assert len({r.key for r in ROWS}) == len(ROWS), "two rows write one JSON"


def manifest() -> dict:
    """What publishing needs of the rows: for each, its block, label and 1-GPU baseline."""
    return {"rows": [{"key": r.key, "block": r.block, "label": r.label,
                      "baseline": f"{r.step}/{r.baseline}" if r.baseline else ""} for r in ROWS]}


def compare_row(report: Path, version: str, mode: str, out: Path) -> int:
    """A comparison's own run of (version, mode) as one row's JSON: the rows that would
    repeat a comparison's run (a step's baseline) are copied from it, not run again. The
    median run of those whose host ran at pace (all, where none did), as its table counts."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        data = {}
    runs = [r for r in data.get("runs", []) if (r["version"], r["mode"]) == (version, mode)
            and r.get("exit_code") == 0 and r.get("result")]
    if not runs:
        print(f"no finished {version} {mode} run in {report}", file=sys.stderr)
        return 1
    slow = slow_keys(data.get("slow_hosts") or [])
    runs = at_pace_else_all(runs, lambda run: run_key(run) in slow)
    median = sorted(runs, key=lambda r: r["tokens_per_s"])[(len(runs) - 1) // 2]
    write_atomic(out, median["result"])
    return 0


def host_pace(work: Path, out: Path) -> int:
    """Exit 1, printing how it ran slow, where the run in `out` (a row in reproduce's work
    folder `work`) ran on a slow host by harness.results.host_slowdowns over every process
    there: each row's, each comparison's runs'. Exit 0 where it ran at pace, or where it or
    the folder has too few readings to tell."""
    paces = {key: pace for key, data in records_in(work).items() if (pace := run_pace(data))}
    for path in sorted(work.glob("compare_*.json")):
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (OSError, ValueError):
            continue
        paces.update({(path.name, *key): pace for key, pace in comparison_paces(runs).items()})
    slowdown = host_slowdowns(paces).get(f"{out.parent.name}/{out.stem}")
    if slowdown is not None:
        print(slowdown_words(slowdown, "this machine's fastest"))
        return 1
    return 0


def step_rows(source: Path, step: str, out: Path) -> int:
    """The finished rows of one reproduce step, one results JSON each, into `out`: from a
    published set's rows.json or from reproduce's work folder. What regress compares."""
    found = {key: data for key, data in records_in(source).items()
             if key.startswith(f"{step}/") and "schema_version" in data}
    if not found:
        print(f"no finished {step} rows in {source}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for key, data in found.items():
        write_json(out / f"{key.split('/', 1)[1]}.json", data, indent=None)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for r in ROWS:
            env = " ".join(r.env) + " " if r.env else ""
            launch = f"torchrun --standalone --nproc-per-node {r.gpus}" if r.gpus > 1 else "python"
            print(f"{r.key:45s} {r.block:17s} {env}{launch} {VERSIONS[r.version].script} "
                  f"--preset {r.preset} {' '.join(r.flags)}")
        return 0
    if argv[:1] == ["rows"] and len(argv) in (2, 3) and argv[2:] in ([], ["--quick"]):
        rows = [r for r in ROWS if r.step == argv[1]]
        if argv[2:] and any(r.quick for r in rows):
            rows = [r for r in rows if r.quick]
        if not rows:
            print(f"error: no rows for step {argv[1]!r}", file=sys.stderr)
            return 2
        for r in rows:  # name, version, script, same_as, answers, env, GPUs, preset, each flag
            print("\t".join([r.name, r.version, VERSIONS[r.version].script, r.same_as or "-",
                             " ".join(map(str, r.answers)) or "-", " ".join(r.env) or "-",
                             str(r.gpus), r.preset, *r.flags]))
        return 0
    if argv[:1] == ["manifest"] and len(argv) == 2:
        write_json(argv[1], manifest())
        return 0
    if argv[:1] == ["compare-row"] and len(argv) == 5:
        return compare_row(Path(argv[1]), argv[2], argv[3], Path(argv[4]))
    if argv[:1] == ["step-rows"] and len(argv) == 4:
        return step_rows(Path(argv[1]), argv[2], Path(argv[3]))
    if argv[:1] == ["host-pace"] and len(argv) == 3:
        return host_pace(Path(argv[1]), Path(argv[2]))
    print("usage: python -m benchmarks.experiments list | rows STEP [--quick] | manifest OUT | "
          "compare-row REPORT VERSION MODE OUT | step-rows SOURCE STEP OUT | host-pace WORK OUT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
