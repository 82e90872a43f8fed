"""The one command line shared by every version.

Each version file calls `training.main(...)` with its `build_model`; the flags,
validation, training loop, timing and results are identical for all of them,
so differences in the numbers come from the model code alone.
"""
from __future__ import annotations

import argparse
import os
import sys

from harness.args import HelpFormatter, OneLineParser
from harness.config import PRECISIONS, PRESETS, REFERENCE_VERSION, RunSettings, reference_weights
from harness.errors import UsageError, WorkshopError
from harness.results import check_writable
from harness.spec import VersionSpec


# Steps of a run when --num-steps is not given. Kernels running in Triton's CPU
# interpreter take seconds a step: their default run lasts about a minute.
DEFAULT_NUM_STEPS = 50
INTERPRETER_NUM_STEPS = 12
DEFAULT_WARMUP_STEPS = 5


def default_warmup(num_steps: int) -> int:
    """Warm-up steps excluded from timing: 5, or fewer so that half the steps are timed."""
    return min(DEFAULT_WARMUP_STEPS, num_steps // 2)


def build_parser(version: str, description: str, add_arguments=None,
                 default_optimizer: str = "default") -> argparse.ArgumentParser:
    p = OneLineParser(prog=os.path.basename(sys.argv[0]) or version, description=description,
                      formatter_class=HelpFormatter)
    m = p.add_argument_group("model size (override the preset)")
    m.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="size preset: tiny (CPU seconds), small, medium, large; "
                        "default: tiny on CPU, small on a GPU")
    m.add_argument("--hidden-dim", type=int)
    m.add_argument("--num-layers", type=int)
    m.add_argument("--num-heads", type=int)
    m.add_argument("--num-kv-heads", type=int, help="fewer than heads = grouped-query attention")
    m.add_argument("--ffn-dim", type=int, help="SwiGLU inner size (default: LLaMA's 8/3*hidden, "
                                                "rounded up to a multiple of 64)")
    m.add_argument("--vocab-size", type=int)
    m.add_argument("--max-seq-len", type=int, help="longest sequence the model accepts")
    m.add_argument("--tie-embeddings", action="store_true", help="share embedding and output head")

    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, help="sequences per step (default from preset)")
    t.add_argument("--seq-len", type=int, help="tokens per sequence (default from preset)")
    t.add_argument("--num-steps", type=int, default=None,
                   help=f"total steps, warm-up included (default: {DEFAULT_NUM_STEPS}; "
                        f"{INTERPRETER_NUM_STEPS} where Triton runs in its CPU interpreter)")
    t.add_argument("--warmup-steps", type=int, default=None,
                   help=f"steps excluded from timing (default: {DEFAULT_WARMUP_STEPS}, "
                        f"at most half of --num-steps)")
    t.add_argument("--learning-rate", type=float, default=3e-4)
    t.add_argument("--precision", choices=tuple(PRECISIONS), default=None,
                   help="default: bf16 on GPUs that support it (fp16 otherwise), fp32 on CPU")
    t.add_argument("--grad-checkpoint", action="store_true",
                   help="recompute each block's activations in backward to save memory")
    t.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    t.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    t.add_argument("--compile-mode", default="default",
                   choices=("default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"),
                   help="torch.compile mode; reduce-overhead adds CUDA/HIP graphs")
    t.add_argument("--optimizer", choices=("default", "foreach", "fused", "master"),
                   default=default_optimizer,
                   help="AdamW implementation, the same default in every version: torch's "
                        "default, foreach (multi-tensor), "
                        "fused (one kernel) or master (bf16 only: linear layers' weights stored "
                        "in bf16, fp32 master copies in the optimizer - same maths as autocast "
                        "without its per-step weight casts; harness/master_weights.py)")
    t.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard with FSDP2 instead of DDP")
    t.add_argument("--ddp-bucket-mb", type=float, default=None, metavar="MB",
                   help="DDP gradient bucket size in MiB (DDP's bucket_cap_mb): one all-reduce "
                        "per bucket; bigger = fewer calls and, with --compile, fewer graph "
                        "splits (default: 200 with --compile without CUDA graphs, else "
                        "DDP's 25)")
    t.add_argument("--ddp-comm-hook", choices=("none", "bf16", "fp16"), default="none",
                   help="DDP: all-reduce gradients in 16 bits (half the bytes on the wire); they "
                        "are averaged in bf16/fp16 and written back to fp32, which changes the "
                        "numerics slightly; bf16 needs NCCL/RCCL (a GPU)")
    t.add_argument("--compile-ddp", choices=("split", "whole"), default="split",
                   help="--compile with DDP: split = one graph per gradient bucket so all-reduce "
                        "overlaps backward (torch._dynamo.config.optimize_ddp); whole = one "
                        "graph, all-reduce after backward")
    t.add_argument("--ddp-static-graph", action="store_true",
                   help="DDP: the same parameters get gradients in the same order every step, "
                        "so DDP records the order once (static_graph=True) and skips its "
                        "per-step bookkeeping")
    t.add_argument("--shard-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="in place of DDP: reduce-scatter the gradients after backward, each "
                        "GPU updates its 1/N of the weights with AdamW state for that 1/N only "
                        "(with --optimizer master: of the fp32 masters), all-gather the weights "
                        "(ZeRO stage 1); not with --optimizer foreach/fused. Default: on under "
                        "torchrun with --optimizer master (where it scales better than DDP), "
                        "unless DDP's knobs, --fsdp, fp16 or --reduce-after-backward are asked "
                        "for; --no-shard-optimizer keeps DDP")
    t.add_argument("--reduce-after-backward", action=argparse.BooleanOptionalAction, default=None,
                   help="in place of DDP: all-reduce the gradients after backward (in bf16 under "
                        "bf16 autocast), a piece at a time, each piece's AdamW update running "
                        "while the next piece is reduced; every GPU updates all the weights; "
                        "not with --optimizer foreach/fused. Default: on under torchrun with "
                        "--compile without CUDA graphs, fp32 weights and bf16 (where DDP cuts "
                        "the compiled model into graph pieces the host launches), unless DDP's "
                        "knobs, --fsdp or --shard-optimizer are asked for; "
                        "--no-reduce-after-backward keeps DDP")
    t.add_argument("--fsdp-reshard-after-forward", choices=("true", "false"), default="true",
                   help="FSDP2: free each block's gathered weights after forward (true, less "
                        "memory) or keep them for backward (false, one all-gather fewer)")
    t.add_argument("--fsdp-param-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="FSDP2: the dtype blocks' weights are gathered and computed in (bf16: "
                        "MixedPrecisionPolicy, half the all-gather bytes; gradients still "
                        "reduced in fp32 into fp32 shards; every weight, norms' included, "
                        "rounded to bf16, which changes the numerics slightly)")
    t.add_argument("--comm-priority", choices=("normal", "high"), default="high",
                   help="under torchrun on a GPU: the priority of the stream NCCL/RCCL "
                        "communicates on; high = its kernels get SMs ahead of the backward "
                        "they overlap, normal = they queue behind it")

    r = p.add_argument_group("run")
    r.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda also means an AMD GPU under ROCm")
    r.add_argument("--seed", type=int, default=1234)
    r.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (slower); same seed gives the same losses")
    r.add_argument("--data", choices=("synthetic", "text"), default="synthetic",
                   help="random tokens, or real text as bytes (the loss visibly falls)")
    r.add_argument("--data-path", help="file or folder of text for --data text "
                                       "(default: the Python standard library's sources)")
    r.add_argument("--measure-peak", action="store_true",
                   help="measure this device's matmul peak and compute MFU against it")
    r.add_argument("--output", help="results JSON path (default: results/<version>_<preset>"
                                     "[_<mode and switches>].json, or <profile-dir>/results.json "
                                     "with --profile)")
    r.add_argument("--quiet", action="store_true",
                   help="no progress lines (the results: line, naming the file, stays)")
    r.add_argument("--log-every", type=int, default=10, help="progress line every N steps")
    r.add_argument("--host-probe", type=int, default=0, metavar="N",
                   help="after the timed steps, N more, each queued while the GPU is held "
                        "busy: the GPU's time for a step queued ahead of it against the timed "
                        "steps (how long the GPU waits for the host), and the host's time to "
                        "queue a step; GPU only")
    r.add_argument("--profile", choices=("pytorch", "deepspeed", "flopcounter", "window"),
                   default=None,
                   help="profile a few steps after warm-up; window = only mark them for "
                        "ncu/nsys (cudaProfilerStart/Stop); see docs/PROFILING.md")
    r.add_argument("--profile-dir", default=None,
                   help="where profiler outputs go (default: profiles/<version>/)")

    if add_arguments is not None:
        add_arguments(p.add_argument_group(f"{version} options"))
    return p


def settings_from_args(version: str, args: argparse.Namespace, argv: list[str],
                       interpreted: bool = False) -> RunSettings:
    """interpreted: this version's kernels run in Triton's CPU interpreter (seconds a
    step), so the default run is shorter."""
    import torch  # late: `--help` must not pay for importing torch

    num_steps = args.num_steps if args.num_steps is not None else (
        INTERPRETER_NUM_STEPS if interpreted else DEFAULT_NUM_STEPS)
    warmup_steps = args.warmup_steps if args.warmup_steps is not None else default_warmup(num_steps)

    preset_name = args.preset or ("small" if torch.cuda.is_available() and args.device != "cpu"
                                  else "tiny")
    preset = PRESETS[preset_name]
    overrides = {k: v for k, v in {
        "hidden_dim": args.hidden_dim, "num_layers": args.num_layers,
        "num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads,
        "ffn_dim": args.ffn_dim, "vocab_size": args.vocab_size,
        "max_seq_len": args.max_seq_len}.items() if v is not None}
    if args.tie_embeddings:
        overrides["tie_embeddings"] = True
    if "num_heads" in overrides and "num_kv_heads" not in overrides:
        overrides["num_kv_heads"] = overrides["num_heads"]  # plain multi-head unless asked
    if "hidden_dim" in overrides and "ffn_dim" not in overrides:
        overrides["ffn_dim"] = 0  # re-derive LLaMA's default from the new hidden size
    seq_len = args.seq_len if args.seq_len is not None else preset.seq_len
    model = preset.model.replace(**overrides)

    batch_size = args.batch_size if args.batch_size is not None else preset.batch_size
    checks = [
        (batch_size > 0, f"--batch-size must be > 0 (got {batch_size})"),
        (seq_len > 0, f"--seq-len must be > 0 (got {seq_len})"),
        (seq_len <= model.max_seq_len,
         f"--seq-len {seq_len} is above the model's max_seq_len {model.max_seq_len} "
         f"(raise --max-seq-len)"),
        (num_steps > 0, f"--num-steps must be > 0 (got {num_steps})"),
        (0 <= warmup_steps < num_steps,
         f"--warmup-steps must be >= 0 and below --num-steps ({warmup_steps} vs {num_steps})"),
        (args.learning_rate > 0, f"--learning-rate must be > 0 (got {args.learning_rate})"),
        (args.grad_accum > 0, f"--grad-accum must be > 0 (got {args.grad_accum})"),
        (args.log_every > 0, f"--log-every must be > 0 (got {args.log_every})"),
        (args.host_probe >= 0, f"--host-probe must be >= 0 (got {args.host_probe})"),
        (args.ddp_bucket_mb is None or 0 < args.ddp_bucket_mb < float("inf"),
         f"--ddp-bucket-mb must be a positive number (got {args.ddp_bucket_mb})"),
        (not args.output or args.output.endswith(".json"), "--output must end in .json"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)

    settings = RunSettings(
        version=version, model=model, preset=preset_name if not overrides else None,
        batch_size=batch_size, seq_len=seq_len, num_steps=num_steps,
        warmup_steps=warmup_steps, learning_rate=args.learning_rate,
        precision=args.precision, device=args.device, seed=args.seed,
        deterministic=args.deterministic, data=args.data, data_path=args.data_path,
        grad_checkpoint=args.grad_checkpoint, grad_accum=args.grad_accum,
        compile=args.compile, compile_mode=args.compile_mode, optimizer=args.optimizer,
        measure_peak=args.measure_peak, output=args.output, quiet=args.quiet,
        log_every=args.log_every, profile=args.profile, profile_dir=args.profile_dir,
        fsdp=args.fsdp, ddp_bucket_mb=args.ddp_bucket_mb, ddp_comm_hook=args.ddp_comm_hook,
        compile_ddp=args.compile_ddp, ddp_static_graph=args.ddp_static_graph,
        shard_optimizer=bool(args.shard_optimizer),
        reduce_after_backward=bool(args.reduce_after_backward),
        fsdp_reshard_after_forward=args.fsdp_reshard_after_forward == "true",
        comm_priority=args.comm_priority, fsdp_param_dtype=args.fsdp_param_dtype,
        host_probe=args.host_probe, command=" ".join(["python", sys.argv[0], *argv]))
    if args.shard_optimizer is None:  # its default depends on the launch and the optimizer
        from .parallel import sharded_by_default

        settings.shard_optimizer = sharded_by_default(settings)
    if args.reduce_after_backward is None:  # and so does this one's, on the sharding's too
        from .parallel import reduced_after_backward_by_default

        settings.reduce_after_backward = reduced_after_backward_by_default(settings)
    return settings


# Run-control flags that never change what a run measures: left out of result names.
NAME_IGNORES = {"preset", "output", "quiet", "log_every", "profile", "profile_dir", "device",
                "num_steps", "warmup_steps", "seed", "data_path", "measure_peak"}


def default_output(settings: RunSettings, parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> str:
    """Where a run's results go when --output is not given.

    A profiled run writes into its profiler's folder (profiles/<version>/<tool>/),
    so a slowed-down run never replaces a benchmark result. Any other run writes
    results/<version>_<preset>[_<flag>...].json: each flag that differs from its
    default (compile mode, precision, version switches, ...) is part of the name,
    so an ablation does not overwrite the baseline run, and so is a torchrun
    launch's kind and world size (_ddp2, _fsdp4), so a data-parallel run does not
    overwrite the single-process one. The same command run twice writes the same
    file: the newer run replaces the older one.
    """
    from pathlib import Path

    from .parallel import launched_by_torchrun

    repo = Path(__file__).resolve().parents[1]
    if settings.profile:
        base = Path(settings.profile_dir) if settings.profile_dir else repo / "profiles" / settings.version
        return str(base / settings.profile / "results.json")
    parts = [settings.version, settings.preset or "custom"]
    for action in parser._actions:
        dest = action.dest
        if dest in NAME_IGNORES or not action.option_strings or dest in ("help", "fsdp"):
            continue  # --fsdp is named with the world size, below
        value = getattr(args, dest, None)
        if value is None or value == action.default:
            continue
        # the first long form: of --x/--no-x (BooleanOptionalAction), the one that says on
        flag = next(o for o in action.option_strings if o.startswith("--")).lstrip("-")
        if value is True:
            parts.append(flag)
        elif value is False:
            parts.append(f"no-{flag}" if not flag.startswith("no-") else flag)
        else:
            parts.append(f"{flag}-{value}")
    if launched_by_torchrun():
        parts.append(f"{'fsdp' if settings.fsdp else 'ddp'}{os.environ['WORLD_SIZE']}")
    name = "_".join(parts).replace("/", "-").replace(" ", "")
    return str(repo / "results" / f"{name}.json")


INTERPRETER_NOTE = ("{version}: no GPU: the Triton kernels run in Triton's CPU interpreter, a "
                    "correctness demo taking seconds a step ({steps} steps; the first progress "
                    "line estimates the time left; --num-steps to change)")


def main(version, build_model, *, description: str = "", add_arguments=None,
         model_options=None, preflight=None, init_from_v1: bool = True,
         default_optimizer: str = "default", interpreted: bool = False,
         argv: list[str] | None = None) -> int:
    """Parse flags, train, write results. Returns the process exit code.

    version: a version's SPEC (harness/spec.py: its flags and settled switches come
    from it), or a name with add_arguments/model_options of its own.
    build_model(config, **options) -> nn.Module whose forward(ids) returns logits.
    model_options(args) -> dict of version switches passed to build_model and
    recorded in the results. preflight(args, run) -> dict: the version's one-time
    checks before training (run is a training.trainer.Preflight: settings, device,
    precision); its dict joins the options (with a SPEC: switches it declares with
    flag=False). init_from_v1: start from V1's weights
    (same seed), so every version trains the very same model. interpreted: the
    version's kernels run in Triton's CPU interpreter here (a shorter default
    run, and a notice at start).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = version if isinstance(version, VersionSpec) else None
    if spec is not None:
        version, add_arguments, model_options = spec.name, spec.add_arguments, spec.options
    try:
        parser = build_parser(version, description, add_arguments, default_optimizer)
        args = parser.parse_args(argv)
        settings = settings_from_args(version, args, argv, interpreted=interpreted)
        # a spec settles its switches for the model (a default may depend on its size)
        settings.options = (spec.options(args, settings.model) if spec is not None
                            else dict(model_options(args)) if model_options else {})
        if preflight is not None:
            from .trainer import Preflight  # late import keeps --help fast
            chosen = preflight(args, Preflight(settings))
            undeclared = set(chosen) - {s.name for s in spec.switches if not s.flag} if spec else ()
            assert not undeclared, f"{version}'s preflight records undeclared {undeclared}"
            settings.options.update(chosen)
        settings.output = settings.output or default_output(settings, parser, args)
        # Checked before the model exists: a run that finds out when it writes has lost its work.
        check_writable(settings.output, "--output" if args.output else "results file")
        if interpreted and not settings.quiet:
            print(INTERPRETER_NOTE.format(version=version, steps=settings.num_steps), flush=True)
        from .trainer import run  # late import keeps --help fast
        start_from_reference = init_from_v1 and version != REFERENCE_VERSION
        run(settings, build_model, reference_weights if start_from_reference else None)
        return 0
    except WorkshopError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
