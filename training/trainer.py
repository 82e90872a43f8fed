"""The training loop every version shares: build, train, time, check, report."""
from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path

import torch

from harness import data as data_mod
from harness import device as dev
from harness import flops, master_weights, measure, probes, results
from harness.config import PRECISIONS, RunSettings
from harness.errors import NonFiniteLoss, OutOfMemory, UsageError
from harness.precision import autocast_for, choose_precision, configure_matmul_precision
from harness.training_step import enable_grad_checkpointing, host_settings, step_collect

from . import parallel

REPO_ROOT = Path(__file__).resolve().parents[1]
PROGRESS_EVERY_S = 10.0  # slow runs (a CPU, the Triton interpreter) print at least this often
GPU_SIZED_S = 60.0  # a CPU run whose matmuls alone take longer than this says so at start


# ---------------------------------------------------------------- pre-flight
class Preflight:
    """What a version's one-time pre-flight check sees before training starts:
    the run's settings, the device it trains on and the precision it trains in.

    A version hands the harness a `preflight(args, run)` function (a probe of
    which kernel runs, a check of forced launch configurations); the harness
    calls it once, and what it returns joins the model options. Device and
    precision are worked out on first use, so a check that needs neither
    refuses a run before they are.
    """

    def __init__(self, settings: RunSettings):
        self.settings = settings

    @functools.cached_property
    def device(self) -> torch.device:
        return dev.resolve_device(self.settings.device)

    @functools.cached_property
    def precision(self) -> str:
        return choose_precision(self.settings.precision, self.device)

    @property
    def bytes_per_value(self) -> int:
        """Bytes of one activation value in this run's precision."""
        return PRECISIONS[self.precision].bytes


# ---------------------------------------------------------------- start-up notes
def gpu_sized_note(settings: RunSettings, device: torch.device,
                   memory: tuple[float, int | None] | None = None) -> str | None:
    """One line, before anything slow, for a run sized for a GPU that landed on a CPU:
    the time its matrix products alone need at this CPU's measured matmul rate (a floor:
    the step's memory-bound work adds to it, a busy machine more; the first step's line
    gives the measured pace), its predicted peak memory against this machine's where
    `memory` (check_cpu_memory's) is given, and the CPU-sized command."""
    if device.type != "cpu":
        return None
    step_flops = flops.step_flops(settings.model, settings.global_batch_size(), settings.seq_len)
    step_s = step_flops / probes.cpu_matmul_flops()
    if step_s * settings.num_steps < GPU_SIZED_S:
        return None
    script = settings.command.split()[1] if len(settings.command.split()) > 1 else "<script>"
    size = f"preset {settings.preset}" if settings.preset else "this model size"
    memory_text = ""
    if memory is not None:
        peak, available = memory
        memory_text = f", predicted peak memory {_gib(peak)}" + (
            f" of {_gib(available)} available" if available is not None else "")
    return (f"{settings.version}: {size} is sized for a GPU: on this CPU its matrix products "
            f"alone take {results.duration_text(step_s)} a step, {settings.num_steps} steps over "
            f"{results.duration_text(step_s * settings.num_steps)}{memory_text} (the first step's line "
            f"gives the measured pace; Ctrl-C stops it); sized for a CPU: python {script} --preset tiny")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _machine_bytes(step_bytes: float) -> float:
    """What the processes of this run on this machine hold at their peak: each what this
    one holds now (Python, torch) plus a step's bytes, times torchrun's ranks here."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) * (measure.rss_bytes() + step_bytes)


def cpu_memory(settings: RunSettings, precision: str) -> tuple[float, int | None]:
    """(predicted peak bytes, available bytes) of a CPU run on this machine: the memory
    model's steady-state step (analysis_tools.memory), against what the machine has."""
    from analysis_tools import memory  # only a CPU run asks, and the model imports pandas

    impl = memory.implementation_for(settings.version, settings.options,
                                     {"optimizer": settings.optimizer}, "cpu", settings.model)
    step = memory.predict(settings.model, settings.batch_size, settings.seq_len, precision, impl,
                          settings.grad_checkpoint, settings.grad_accum, "cpu").peak_bytes
    return _machine_bytes(step), measure.available_bytes()


def check_cpu_memory(settings: RunSettings, device: torch.device,
                     precision: str) -> tuple[float, int | None] | None:
    """Refuse, before the model exists, a CPU run predicted to need more memory than the
    machine has: it would swap for hours or be killed by the kernel mid-step (exit 137).
    Returns cpu_memory's (peak, available); None on a GPU, which reports its own
    out-of-memory (the loop turns it into exit 3), and for a run far from the limit."""
    if device.type != "cpu":
        return None
    # A step keeps fewer bytes than it does FLOPs, but for the state of 16 B a parameter
    # (weights, gradients, AdamW's two moments) against >= 6 FLOPs a parameter and token:
    # under 4 B a FLOP (the model's largest, at one token, is 3.2) a run fits without
    # asking the memory model, whose import costs a second.
    bound = 4 * flops.step_flops(settings.model, settings.batch_size, settings.seq_len)
    available = measure.available_bytes()
    if available is not None and _machine_bytes(bound) < available:
        return None
    peak, available = cpu_memory(settings, precision)
    if available is not None and peak > available:
        raise OutOfMemory(
            f"predicted peak memory {_gib(peak)} (batch {settings.batch_size} x seq "
            f"{settings.seq_len}, {precision}) is more than the {_gib(available)} this machine has "
            f"available: try a smaller --batch-size or --seq-len, --grad-checkpoint, or --preset tiny")
    return peak, available


def start_notes(settings: RunSettings, device: torch.device) -> list[str]:
    """What a run will not do the way its flags suggest, said before it starts (and
    kept in its results' warnings)."""
    notes = []
    if settings.warmup_steps == 0:
        notes.append("no warm-up step: the timed steps include one-time costs (compilation, "
                     "allocation, autotuning); run 10 steps or more for a timing")
    if settings.compile and settings.compile_mode == "reduce-overhead" and device.type == "cpu":
        notes.append("--compile-mode reduce-overhead: CUDA/HIP graphs need a GPU; on a CPU it "
                     "compiles like the default mode")
    if settings.host_probe and device.type == "cpu":
        notes.append("--host-probe: a CPU runs each step as it is queued, so there is no host "
                     "time apart from it to probe; no probe steps")
    return notes


# ---------------------------------------------------------------- model
def build(settings: RunSettings, build_model, reference_weights=None) -> torch.nn.Module:
    """The model, starting from `reference_weights(config, seed)` when given:
    same model, same parameters as the reference version."""
    torch.manual_seed(settings.seed)
    model = build_model(settings.model, **settings.options)
    if reference_weights is not None:
        model.load_state_dict(reference_weights(settings.model, settings.seed))
    return model


def add_nvtx_ranges(model: torch.nn.Module) -> None:
    """Name each block in profiler timelines (torch.cuda.nvtx is roctx on ROCm)."""
    def push(name):
        def hook(*_):  # must return None: a pre-hook's return value replaces the inputs
            torch.cuda.nvtx.range_push(name)
        return hook

    def pop(*_):
        torch.cuda.nvtx.range_pop()

    for i, block in enumerate(model.layers):
        block.register_forward_pre_hook(push(f"block{i}"))
        block.register_forward_hook(pop)


def check_master_weights(settings: RunSettings, precision: str) -> None:
    """--optimizer master computes exactly what bf16 autocast does, or refuses to run."""
    problem = (f"it needs --precision bf16 (got {precision})" if precision != "bf16" else
               "--grad-accum > 1 would add gradients in bf16" if settings.grad_accum > 1 else
               "FSDP2 shards parameters of one dtype; use DDP" if settings.fsdp else None)
    if problem:
        raise UsageError(f"--optimizer master: {problem}")


@contextlib.contextmanager
def nvtx_range(name: str, enabled: bool):
    if enabled:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if enabled:
            torch.cuda.nvtx.range_pop()


# ---------------------------------------------------------------- loop
def run(settings: RunSettings, build_model, reference_weights=None) -> dict:
    """Train one run. reference_weights(config, seed) -> state dict the model starts
    from (harness.config.reference_weights: V1's), or None for the model's own init."""
    ctx = parallel.setup(settings)
    try:
        with contextlib.ExitStack() as cleanup:  # what _run sets up and must undo, also on failure
            return _run(settings, build_model, reference_weights, ctx, cleanup)
    except torch.cuda.OutOfMemoryError:
        # Outside the training loop (moving the model, --measure-peak): the loop
        # itself reports OOM with the peak it reached.
        raise OutOfMemory(f"out of memory before training started (model of "
                          f"{settings.model.num_layers} layers x hidden {settings.model.hidden_dim}"
                          f"): try a smaller preset or model") from None
    finally:
        ctx.close()


def _run(settings: RunSettings, build_model, reference_weights, ctx, cleanup) -> dict:
    device = ctx.device if ctx.device is not None else dev.resolve_device(settings.device)
    precision = choose_precision(settings.precision, device)
    ctx.check_precision(precision)
    configure_matmul_precision(precision)
    if settings.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    cfg = settings.model
    output = Path(settings.output or REPO_ROOT / "results" /
                  f"{settings.version}_{settings.preset or 'custom'}.json")
    say = print if (not settings.quiet and ctx.is_main) else (lambda *a, **k: None)
    gpu_sized = gpu_sized_note(settings, device, check_cpu_memory(settings, device, precision))
    notes = start_notes(settings, device)
    for line in filter(None, [gpu_sized, *notes]):
        say(line if line.startswith(f"{settings.version}:") else f"{settings.version}: {line}",
            flush=True)

    # Built where it trains: a GPU draws the initial weights in milliseconds where the
    # CPU takes seconds (the same seed gives the same weights on the same kind of device).
    with torch.device(device):
        model = base_model = build(settings, build_model, reference_weights).to(device)
    if settings.grad_checkpoint:
        enable_grad_checkpointing(model)
    masters = None
    if settings.optimizer == "master":
        check_master_weights(settings, precision)
        masters = master_weights.split_master_weights(model, torch.bfloat16)
    use_nvtx = device.type == "cuda"
    if use_nvtx and not settings.compile:
        add_nvtx_ranges(model)
    model = ctx.wrap(model, settings)
    train_model = torch.compile(model, mode=settings.compile_mode) if settings.compile else model
    optimizer = ctx.make_optimizer(model, settings, device, masters)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    batches = data_mod.Batches(settings.data, cfg.vocab_size, settings.batch_size,
                               settings.seq_len, settings.seed, settings.data_path,
                               rank=ctx.rank, world_size=ctx.world_size)
    measured_peak = None
    if settings.measure_peak:
        measured_peak = probes.measure_matmul_tflops(device, precision)

    profiler = None
    if settings.profile:
        from profiling import sessions  # only a profiled run needs it
        profiler = sessions.start(settings, device, model)
        cleanup.callback(profiler.close)

    say(f"{settings.version}: {dev.device_name(device)} ({device.type}), {precision}, "
        f"preset {settings.preset or 'custom'}, batch {settings.batch_size} x seq "
        f"{settings.seq_len}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params"
        + (f", world size {ctx.world_size}" if ctx.world_size > 1 else ""))

    # Tokens of one optimizer step over all ranks: what throughput and MFU count.
    tokens_per_step = settings.global_batch_size(ctx.world_size) * settings.seq_len
    clock_marks = []
    checked_params = 0
    measure.reset_peak_memory(device)

    # A model with loss_in_forward (V3's --fused-linear-ce) takes the targets and returns
    # the mean loss itself, so that its whole logits never need to exist.
    loss_in_forward = getattr(base_model, "loss_in_forward", False)

    def loss_of(inputs, targets):
        with autocast_for(precision, device):
            if loss_in_forward:
                return train_model(inputs, targets)
            logits = train_model(inputs)
        return torch.nn.functional.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def on_arrival(last_step: int) -> None:  # the losses up to last_step are read and checked
        nonlocal last_line_at
        if last_step >= settings.num_steps:  # a --host-probe step: its line is the probe's
            return
        say(_progress_line(last_step, settings, reader.losses, clock_marks, tokens_per_step))
        last_line_at = time.monotonic()

    # --host-probe: steps after the timed ones, each queued behind a GPU wait (HostProbe)
    probe = measure.HostProbe(settings.host_probe if device.type == "cuda" else 0)
    total_steps = settings.num_steps + probe.steps
    reader = LossReader(device, ctx.mean_over_ranks, total_steps, on_arrival,
                        behind=ctx.world_size == 1)
    losses = reader.losses

    if gpu_sized:  # its first line is a step away, which takes minutes here
        say(f"{settings.version}: step 1 running (its line, with the measured pace, follows when "
            f"it ends)", flush=True)
    # One GPU, eager: the backward on this thread, the garbage collector at fixed steps.
    cleanup.enter_context(host_settings(device, ctx.world_size, settings.compile))
    pace_before = None  # the host's pace just before the timed steps and after them
    last_line_at = time.monotonic()
    try:
        for step in range(total_steps):
            probing = step >= settings.num_steps
            if step == settings.warmup_steps:  # a host-paced run moves with it
                pace_before = measure.host_pace_us()
            if probing:
                probe.start(device, clock_marks[settings.warmup_steps:settings.num_steps])
            clock = dev.StepClock(device)
            clock_marks.append(clock)
            clock.mark("start")
            optimizer.zero_grad(set_to_none=True)
            step_loss = torch.zeros((), device=device)
            for micro in range(settings.grad_accum):
                # Tried: batches copied from pinned memory - no faster and no steadier at the
                # small and medium presets: each tensor is 8-64 KiB, and what moves an eager
                # step's time there is how fast the host runs Python.
                inputs, targets = (t.to(device, non_blocking=True) for t in batches.next())
                # DDP decides in forward whether the next backward all-reduces,
                # so the no-sync window (all micro-steps but the last) covers both.
                with ctx.no_sync(model, micro):
                    clock.mark(f"f{micro}")
                    with nvtx_range("forward", use_nvtx):
                        loss = loss_of(inputs, targets) / settings.grad_accum
                    clock.mark(f"b{micro}")
                    with nvtx_range("backward", use_nvtx):
                        scaler.scale(loss).backward()
                    clock.mark(f"e{micro}")
                step_loss += loss.detach()
            clock.mark("opt")
            with nvtx_range("optimizer", use_nvtx):
                scaler.step(optimizer)
                scaler.update()
            step_collect(step)
            clock.mark("end")
            if probing:
                probe.stop(device, clock)
            reader.add(step_loss)
            if step == 0:
                reader.request(0, wait=True)  # the gradient check reads the gradients anyway
                checked_params = ctx.check_gradient_flow(model)
            if profiler is not None:
                profiler.step(step)
            # Progress from the first step, an estimate of the time left from the second
            # (the first pays compilation and allocation), then every --log-every steps,
            # and at least every PROGRESS_EVERY_S seconds (one GPU: with several, every rank
            # must ask at the same steps, for the losses' all-reduce).
            if step > 0 and (step == 1 or (step + 1) % settings.log_every == 0
                             or step + 1 in (settings.num_steps, total_steps)
                             or (ctx.world_size == 1
                                 and time.monotonic() - last_line_at > PROGRESS_EVERY_S)):
                reader.request(step)
            reader.collect()
        reader.collect(wait=True)
        dev.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        peak = measure.peak_memory(device)
        raise OutOfMemory(
            f"out of memory (peak allocated {peak.get('peak_allocated_mb', 0) / 1024:.1f} GiB) "
            f"at batch {settings.batch_size} x seq {settings.seq_len}: try a smaller --batch-size"
            f" or --grad-checkpoint" + (" or --precision bf16" if precision in ("fp32", "tf32")
                                        else "")) from None
    except (RuntimeError, AssertionError) as e:
        if settings.compile and _looks_like_compile_error(e):
            raise UsageError(f"torch.compile failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160]}); run without --compile") from None
        if "No available kernel" in str(e):  # SDPA restricted to a kernel that cannot run this
            raise UsageError(f"no attention kernel can run this configuration "
                             f"({str(e).splitlines()[0][:120]}): use --sdpa-backend auto") from None
        raise

    pace_after = measure.host_pace_us()
    host_pace = {"before_us": pace_before or pace_after, "after_us": pace_after,
                 "items": measure.HOST_PACE_ITEMS}
    timing = _timing(clock_marks[settings.warmup_steps:settings.num_steps], settings.grad_accum)
    timing = ctx.aggregate_timing(timing)
    memory = measure.peak_memory(device)
    result = results.build(
        settings, precision, dev.describe(device), losses, timing, memory,
        checked_params=checked_params, tokens_per_step=tokens_per_step,
        measured_peak=measured_peak, world_size=ctx.world_size, parallel=ctx.kind,
        distributed=ctx.extra, warnings=[*getattr(base_model, "run_warnings", ()), *notes])
    result["host_pace"] = host_pace
    if (reading := probe.result()) is not None:
        result["host_probe"] = reading
    # Fused parameters are checked piece by piece in V1's layout (measure.check_gradient_flow).
    result["gradient_guard"]["layout"] = ("v1" if settings.version == "v1" or hasattr(base_model, "to_v1_layout")
                                          else "model")
    if profiler is not None:
        profiler.finish(result)
    if ctx.is_main:
        results.write_atomic(output, result)
        say(summary_line(result))
        if "host_probe" in result:
            say(host_probe_line(result["host_probe"], results.numbers(result)["step_ms"]))
        print(f"results: {output}", flush=True)  # even with --quiet: where the run's result is
    return result


class LossReader:
    """Reads the losses of a run without emptying the GPU's queue.

    Reading a GPU value makes the host wait until the GPU has run everything queued
    before it; the next step's kernels are then queued onto an idle GPU, which waits for
    the host's launches (milliseconds in a step paced by its launches) - at every read.
    So `request` starts a copy of the losses so far into host memory, behind the queued
    work, and `collect` reads the copies that have arrived: the progress line of step 10
    prints a step or two later, and the GPU never runs dry. A non-finite loss stops the
    run when it arrives (NonFiniteLoss, naming its step). Losses are step means; under
    data parallelism, the mean over ranks (one all-reduce per request, on every rank at
    the same steps). On a CPU, and with several ranks (which must all stop at the same
    step when a loss is not finite), a request is read at once (behind=False).
    """

    def __init__(self, device: torch.device, mean_over_ranks, num_steps: int, on_arrival,
                 behind: bool = True):
        self.device, self.mean_over_ranks = device, mean_over_ranks
        self.num_steps, self.on_arrival = num_steps, on_arrival
        self.behind = behind and device.type == "cuda"
        self.queued: list[torch.Tensor] = []  # one loss per step, on the device
        self.losses: list[float] = []         # read and checked, one per step
        self.pending: list[tuple] = []        # (first step, last step, host copy, its event)
        self.requested = 0                    # the steps before this one are requested

    def add(self, loss: torch.Tensor) -> None:
        self.queued.append(loss)

    def request(self, upto_step: int, wait: bool = False) -> None:
        first = self.requested
        if first <= upto_step:
            values = self.mean_over_ranks(torch.stack(self.queued[first:upto_step + 1]))
            event = None
            if self.behind:  # into pinned host memory, behind the queued work
                values = values.to("cpu", non_blocking=True)
                event = dev.queue_mark(self.device)
            self.pending.append((first, upto_step, values, event))
            self.requested = upto_step + 1
        self.collect(wait or not self.behind)

    def collect(self, wait: bool = False) -> None:
        """Check the losses that have arrived (wait: all requested) and report each read."""
        while self.pending:
            first, last, values, event = self.pending[0]
            if event is not None:
                if not (wait or event.query()):
                    return
                event.synchronize()
            self.pending.pop(0)
            for i, value in enumerate(values.tolist(), start=first):
                if value != value or value in (float("inf"), float("-inf")):
                    # i counts from 0; the progress lines, and so this message, from 1
                    raise NonFiniteLoss(f"loss became {value} at step {i + 1}/{self.num_steps} "
                                        f"(try a lower --learning-rate or --precision bf16/fp32)")
                self.losses.append(value)
            self.on_arrival(last)


def _looks_like_compile_error(e: Exception) -> bool:
    text = f"{type(e).__module__} {type(e).__name__} {e}"
    return any(k in text for k in ("torch._dynamo", "torch._inductor", "BackendCompilerFailed",
                                   "InductorError", "CompilationError"))


def _timing(clocks, grad_accum: int) -> dict:
    """Per-phase milliseconds of each step (the caller has synchronized).
    Micro-step i of a step is marked f{i} (forward), b{i} (backward), e{i} (end)."""
    per = {"forward": [], "backward": [], "optimizer": [], "step": []}
    # A step lasts from its start to the next step's start, so host-side gaps
    # between steps (Python, launches) count: that is what throughput pays.
    for clock, following in zip(clocks, [*clocks[1:], None]):
        micro = range(grad_accum)
        per["forward"].append(sum(clock.elapsed_ms(f"f{i}", f"b{i}") for i in micro))
        per["backward"].append(sum(clock.elapsed_ms(f"b{i}", f"e{i}") for i in micro))
        per["optimizer"].append(clock.elapsed_ms("opt", "end"))
        per["step"].append(clock.elapsed_ms("start", "end") if following is None
                           else clock.elapsed_ms_to(following, "start"))
    return {k: measure.summarize(v) for k, v in per.items()}


def _progress_line(step, settings, losses, clocks, tokens_per_step) -> str:
    recent = clocks[max(settings.warmup_steps, step + 1 - settings.log_every):step + 1]
    ms = measure.summarize([c.elapsed_ms("start", "end") for c in recent])["median"] if recent else None
    speed = f" | {ms:8.2f} ms/step | {tokens_per_step / ms * 1000:10,.0f} tok/s" if ms else " | warm-up"
    left = settings.num_steps - step - 1
    step_ms = ms or clocks[step].elapsed_ms("start", "end")  # in warm-up: this step's own time
    # The first step pays one-time costs (allocation, compilation, autotuning): no estimate
    # from it, unless the step itself is long enough to dwarf them (a GPU-sized step on a
    # CPU), where waiting for step 2 would leave minutes unexplained.
    if step == 0 and left and (step_ms < PROGRESS_EVERY_S * 1000 or settings.compile):
        eta = (f" | first step {results.duration_text(step_ms / 1000)} (one-time set-up "
               f"included; the estimate follows at step 2)")
    else:
        eta = f" | about {results.duration_text(left * step_ms / 1000)} left" if left else ""
    return f"step {step + 1:5d}/{settings.num_steps} | loss {losses[-1]:.4f}{speed}{eta}"


def host_probe_line(p: dict, step_ms: float) -> str:
    """--host-probe's reading and its verdict (results.host_probe_verdict)."""
    if p["host_waited"]:
        return (f"host probe: the host waited for the GPU while queueing a step ({p['host_ms']:.2f}"
                f" of the {p['hold_ms']:.0f} ms the GPU was held): no reading")
    return (f"host probe: with the GPU held, queueing a step takes the host {p['host_ms']:.2f} ms;"
            f" the GPU runs a step queued ahead in {p['gpu_ms']:.2f} ms, the timed steps took "
            f"{step_ms:.2f} ms ({results.host_probe_verdict(p, step_ms)}; median of {p['steps']} "
            f"steps)")


def summary_line(r: dict) -> str:
    m = results.numbers(r)
    mfu = f"{m['mfu'] * 100:.1f}%" if m["mfu"] is not None else "n/a"
    return (f"{r['version']}: {m['tokens_per_s']:,.0f} tok/s | step "
            f"{m['step_ms']:.2f} ms (fwd {m['forward_ms']:.2f} / bwd "
            f"{m['backward_ms']:.2f} / opt {m['optimizer_ms']:.2f}) | MFU {mfu} | "
            f"peak mem {m['peak_memory_mb'] or 0:,.0f} MB | final loss {m['final_loss']:.4f}"
            + (f" | noisy: steps spread {m['p90_over_p10']:.1f}x (p90/p10; the machine was "
               f"busy, the median is not one to quote)" if results.is_noisy(r) else ""))
