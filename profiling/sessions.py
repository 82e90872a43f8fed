"""Profile a few training steps from inside the loop: `--profile KIND`.

    pytorch      torch.profiler on a window of steps right after warm-up: a
                 Chrome/Perfetto trace (also TensorBoard's format), an operator
                 table (CSV + top-N printed) and the kernel table
    flopcounter  torch.utils.flop_counter.FlopCounterMode over ONE step,
                 compared with the harness's analytic FLOPs (harness/flops.py)
    deepspeed    DeepSpeed's FLOPS profiler over ONE step's forward pass
                 (optional package), compared with the analytic forward FLOPs
    window       marks the same window for external profilers:
                 cudaProfilerStart/Stop (ncu --profile-from-start off, nsys
                 --capture-range=cudaProfilerApi) and an NVTX/ROCTx range

The trainer calls start() before step 0, .step(i) after every step (warm-up
included) and .finish(result) before the results JSON is written. Outputs go
to --profile-dir (default profiles/<version>/) in a folder named after KIND.

Why one step for the FLOP counters: FLOPs do not change from step to step,
and summing a running total every step (as AMD's TinyTransformer workshop did) reports
N steps' worth of FLOPs as if they were one. Why the LAST warm-up step: the
counters slow the step they watch, and warm-up steps are not timed.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from harness import flops
from harness.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE_STEPS = 3  # length of the pytorch/window profile: a few steps are plenty
TOP_N = 15


# Lines the profiler's C++ side writes straight to the terminal that say nothing to
# the reader: Kineto's trace start/stop markers and the CPU allocator's note that
# memory allocated before the window has no allocation event in it.
NATIVE_NOISE = ("USDT:", "Memory block of unknown size was allocated before the profiling started")


@contextlib.contextmanager
def native_stderr_filtered(noise=NATIVE_NOISE):
    """Hold what native code writes to stderr (file descriptor 2) while the block runs,
    then pass on every line that is not known noise: nothing real is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(n in line for n in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def start(settings, device: torch.device, model: torch.nn.Module):
    sessions = {"pytorch": TorchProfilerSession, "flopcounter": FlopCounterSession,
                "deepspeed": DeepSpeedSession, "window": MarkedWindow}
    if settings.profile not in sessions:
        raise UsageError(f"--profile must be one of {', '.join(sessions)} (got {settings.profile!r})")
    return sessions[settings.profile](settings, device, model)


def profiled_window(settings) -> tuple[int, int]:
    """First and last step profiled: the first PROFILE_STEPS steps after warm-up."""
    first = settings.warmup_steps
    return first, min(first + PROFILE_STEPS, settings.num_steps) - 1


def counted_step(settings) -> int:
    """The step the FLOP counters watch: the last warm-up step (step 0 if none)."""
    return max(settings.warmup_steps - 1, 0)


class Session:
    """Calls _begin() just before step `first` and _end() right after step `last`."""

    kind = "base"

    def __init__(self, settings, device, model, first: int, last: int):
        self.settings, self.device, self.model = settings, device, model
        self.first, self.last = first, last
        base = Path(settings.profile_dir or REPO_ROOT / "profiles" / settings.version)
        rank = os.environ.get("RANK")
        if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1":
            base = base / f"rank{rank}"  # one folder per process under torchrun
        self.out = (base / self.kind).resolve()
        self.verbose = not settings.quiet and rank in (None, "0")
        self.files: dict[str, str] = {}
        self.notes: list[str] = []
        if first == 0:
            self._begin()

    @property
    def steps_text(self) -> str:
        """The profiled steps as the progress lines count them (from 1): 'steps 6-8'."""
        first, last = self.first + 1, self.last + 1
        return f"step {first}" if first == last else f"steps {first}-{last}"

    def say(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)

    def step(self, index: int) -> None:
        if index == self.last:
            self._end()
        elif index + 1 == self.first:
            self._begin()

    def _begin(self) -> None:
        pass

    def _end(self) -> None:
        pass

    def finish(self, result: dict) -> None:
        summary = self.summary(result)  # first: it may write files into self.out
        result["profile"] = {"kind": self.kind, "steps": [self.first + 1, self.last + 1],  # from 1
                             "dir": str(self.out) if self.out.exists() else None,
                             "files": self.files, "notes": self.notes, **summary}

    def summary(self, result: dict) -> dict:
        return {}

    def close(self) -> None:
        """Called by the trainer when the run ends, also when it fails: undo what the
        session changed in the process (a no-op unless a session overrides it)."""

    def write_json(self, name: str, data: dict) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / name
        path.write_text(json.dumps(data, indent=2) + "\n")
        self.files[name.rsplit(".", 1)[0]] = str(path)
        return path


# ----------------------------------------------------------------- PyTorch profiler
class TorchProfilerSession(Session):
    kind = "pytorch"

    def __init__(self, settings, device, model):
        from torch.profiler import ProfilerActivity, profile, schedule

        first, last = profiled_window(settings)
        self.memory = os.environ.get("PROFILE_MEMORY", "0") == "1" and device.type == "cuda"
        self.trace: Path | None = None
        self._quiet_native = contextlib.ExitStack()  # holds native noise back while entered
        self._holding_native = False
        super().__init__(settings, device, model, first, last)
        self.out.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)  # also HIP kernels on a ROCm build
        # The schedule skips `wait` steps, traces one step it throws away
        # (warm-up of the profiler itself), then records `active` steps.
        warm = 1 if first >= 1 else 0
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=first - warm, warmup=warm, active=last - first + 1, repeat=1),
            on_trace_ready=self._save_trace, record_shapes=True, profile_memory=True,
            with_flops=True)
        self.profiler.start()

    def _save_trace(self, prof) -> None:
        from torch.profiler import tensorboard_trace_handler

        before = set(self.out.glob("*.pt.trace.json"))
        tensorboard_trace_handler(str(self.out), worker_name=self.settings.version)(prof)
        new = set(self.out.glob("*.pt.trace.json")) - before
        self.trace = max(new, key=lambda p: p.stat().st_mtime) if new else None

    def step(self, index: int) -> None:
        # From the profiler's own warm-up step to its stop, native noise is held back
        # (the allocator's note comes from inside a training step, not from step()).
        if index + 2 >= self.first and not self._holding_native:
            self._quiet_native.enter_context(native_stderr_filtered())
            self._holding_native = True
        self.profiler.step()
        super().step(index)

    def close(self) -> None:
        self._quiet_native.close()

    # The allocator snapshot (PROFILE_MEMORY=1, GPU only) records every
    # allocation with its stack during the window; open the pickle at
    # https://pytorch.org/memory_viz. It sees PyTorch's caching allocator only.
    def _begin(self) -> None:
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def _end(self) -> None:
        if self.memory:
            path = self.out / "memory_snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.files["memory_snapshot"] = str(path)

    def finish(self, result: dict) -> None:
        from .parsers import kernel_table, torch_profiler

        self.profiler.stop()
        self.close()
        operators = torch_profiler.operator_records(self.profiler.key_averages())
        self.files["operators"] = str(torch_profiler.write_operator_csv(
            operators, self.out / "operators.csv"))
        table = torch_profiler.read_trace(self.trace) if self.trace else None
        if table is None or not table.rows:  # CPU run: operators are the "kernels"
            table = torch_profiler.read_operator_csv(self.out / "operators.csv")
        self.table = table
        self.files["kernel_table"] = str(kernel_table.write_csv(table, self.out / "kernel_table.csv"))
        if self.trace:
            self.files["trace"] = str(self.trace)
            for old in torch_profiler.find_traces(self.out):  # the run finished: its trace
                if old != self.trace:                           # replaces the earlier ones
                    old.unlink()
        if self.device.type == "cpu":
            self.notes.append("CPU run: times are operator self CPU times (no GPU kernels)")
        if os.environ.get("PROFILE_MEMORY") == "1" and not self.memory:
            self.notes.append("PROFILE_MEMORY=1 needs a GPU: the allocator snapshot is CUDA/HIP "
                              "only (operators.csv still has CPU memory columns)")
        result["warnings"].append(
            f"{self.steps_text} ran under the PyTorch profiler: "
            f"their timings include its overhead (profile and benchmark in separate runs)")
        super().finish(result)
        self.say(f"\nPyTorch profiler, {self.steps_text} "
                 f"({'device' if self.device.type == 'cuda' else 'CPU'} time):")
        self.say(torch_profiler.format_operators(operators, TOP_N))
        self.say(kernel_table.format_table(table, top=10))
        self.say(f"trace (open in https://ui.perfetto.dev): {self.files.get('trace', 'none')}")
        self.say(f"operator table: {self.files['operators']}")
        if importlib.util.find_spec("tensorboard") is not None:
            self.say(f"TensorBoard: tensorboard --logdir {self.out}")

    def summary(self, result: dict) -> dict:
        return {"by_category": {c: round(s, 4) for c, s in self.table.by_category().items() if s}}


# ----------------------------------------------------------------- FLOP counters
class FlopCountingSession(Session):
    """Shared by FlopCounterMode and DeepSpeed: count one step, compare, report."""

    counts = "training step"  # what the tool counts, in words
    scope = "step"  # the same, as a stable key: "step" (forward + backward) or "forward"
    fraction = 1.0  # of a training step the tool counts (DeepSpeed: the forward, 1/3)

    def __init__(self, settings, device, model):
        step = counted_step(settings)
        self.counted: int | None = None
        self.by_op: dict[str, int] = {}  # FLOPs per aten op, where the tool gives them
        self.extra: dict[str, int] = {}  # other totals the tool reports
        super().__init__(settings, device, model, step, step)

    def analytic(self) -> int:
        """harness.flops for the counted step: 6*N_matmul + 12*L*d*T per token."""
        s = self.settings
        return int(flops.step_flops(s.model, s.batch_size, s.seq_len) * s.grad_accum * self.fraction)

    def attention_share(self) -> int:
        """The part of analytic() that is attention's QK^T and PV products (12*L*d*T per token)."""
        s, cfg = self.settings, self.settings.model
        tokens = s.batch_size * s.seq_len * s.grad_accum
        return int(12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * s.seq_len * tokens
                   * self.fraction)

    def explain(self, counted: int, analytic: int) -> list[str]:
        notes = []
        ops = " ".join(self.by_op)
        if "attention" in ops:
            notes.append("SDPA is counted as full (non-causal) attention, the same convention as "
                         "the analytic model; the useful causal work is half of it")
        if counted < analytic * 0.99:
            missing, attention = analytic - counted, self.attention_share()
            if "attention" not in ops and abs(missing - attention) <= 0.02 * attention:
                notes.append(
                    f"the missing {missing / 1e9:.3f} GFLOP are exactly attention's QK^T and PV "
                    "products: FlopCounterMode counts 0 for SDPA on the CPU "
                    "(aten._scaled_dot_product_flash_attention_for_cpu has no FLOP formula; on a "
                    "GPU SDPA is counted) and for Triton kernels launched directly")
            else:
                notes.append("counted less than the analytic model: kernels outside PyTorch's "
                             "dispatcher (raw Triton launches, custom ops without "
                             "register_flop_formula) are invisible to the counter")
        elif counted > analytic * 1.01:
            extra, recompute = counted - analytic, self.attention_share() // 6
            if "attention" in ops and abs(extra - recompute) <= 0.02 * recompute:
                notes.append(
                    f"the extra {extra / 1e9:.3f} GFLOP are attention's backward: PyTorch's FLOP "
                    "formula (SDPA's, which V3's attention operators reuse) counts it as 2.5 "
                    "forward passes (the scores are recomputed), the analytic model as 2")
            else:
                notes.append("counted more than the analytic model"
                             + (": --grad-checkpoint recomputes the forward pass in backward"
                                if self.settings.grad_checkpoint else ""))
        return notes

    def summary(self, result: dict) -> dict:
        analytic = self.analytic()
        counted = self.counted or 0
        ratio = counted / analytic if analytic else None
        self.notes.extend(self.explain(counted, analytic))
        data = {"tool": self.kind, "counted_step": self.first + 1, "counts": self.counts,
                "scope": self.scope, "counted_flops": counted, "analytic_flops": analytic,
                "ratio": ratio, "by_op": self.by_op, **self.extra,
                "analytic_convention": result["flops"]["convention"], "notes": self.notes}
        self.write_json("flops.json", data)
        self.say(f"\n{self.kind}: {self.steps_text}, {self.counts}: counted "
                 f"{counted / 1e9:.4f} GFLOP vs analytic {analytic / 1e9:.4f} GFLOP "
                 f"(ratio {ratio:.3f})")
        for op, n in sorted(self.by_op.items(), key=lambda kv: -kv[1])[:8]:
            self.say(f"  {op:<50} {n / 1e9:10.3f} GFLOP")
        for note in self.notes:
            self.say(f"  note: {note}")
        self.say(f"  -> {self.files['flops']}")
        return {"tool": self.kind, "scope": self.scope, "counted_flops": counted,
                "analytic_flops": analytic, "ratio": ratio}


class FlopCounterSession(FlopCountingSession):
    kind = "flopcounter"
    counts = "forward + backward (matmuls and attention only)"

    def _begin(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        # A model whose kernels bypass PyTorch's dispatcher in eager runs offers a
        # context manager that routes them through operators the counter sees
        # (V3: `model.flop_counting`); DDP keeps the model in `.module`.
        hook = getattr(getattr(self.model, "module", self.model), "flop_counting", None)
        self.counting = contextlib.ExitStack()  # entered here, left in _end: one step counted
        if hook is not None:
            self.counting.enter_context(hook())
        self.mode = self.counting.enter_context(FlopCounterMode(display=False))

    def _end(self) -> None:
        self.counting.close()
        self.counted = int(self.mode.get_total_flops())
        self.by_op = {str(op): int(n) for op, n in self.mode.get_flop_counts()["Global"].items()}


def import_flops_profiler(device: torch.device):
    """DeepSpeed's FlopsProfiler class, and what DeepSpeed printed while it was imported.

    Importing DeepSpeed picks an "accelerator" and logs it; where it finds no GPU it
    warns "Setting accelerator to CPU ..." into the attendee's output. Naming the
    accelerator in DS_ACCELERATOR (DeepSpeed calls ROCm "cuda" too) skips that
    detection, and whatever DeepSpeed still prints or warns during the import is
    returned, to be kept in flops.json, instead of shown.
    """
    accelerator = {"cpu": "cpu", "cuda": "cuda", "mps": "mps"}.get(device.type)
    if accelerator:
        os.environ.setdefault("DS_ACCELERATOR", accelerator)
    held = io.StringIO()
    with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from deepspeed.profiling.flops_profiler import FlopsProfiler
    # DeepSpeed's logger got its handler during the import, writing to `held`: point it
    # back at the console, so that warnings during the run are seen.
    for handler in logging.getLogger("DeepSpeed").handlers:
        if getattr(handler, "stream", None) is held:
            handler.setStream(sys.stdout)
    said = held.getvalue().splitlines() + [f"{w.category.__name__}: {w.message}" for w in caught]
    return FlopsProfiler, [line for line in said if line.strip()]


class DeepSpeedSession(FlopCountingSession):
    """DeepSpeed's FLOPS profiler over one step.

    How it counts: while profiling, it replaces torch.nn.functional's functions
    (linear, softmax, silu, scaled_dot_product_attention, ...) and torch.matmul,
    mm, bmm, add, mul, ... with Python wrappers that compute each call's FLOPs and
    MACs from its arguments. Forward hooks on every module open a tally when the
    module's forward starts and add it to that module when it ends; a call made
    outside any module's forward (the loss, backward in autograd's engine, the
    optimizer) is not counted. So the hooks see every module, but the FLOPs come
    only from the wrapped functions: a custom kernel - V3's Triton flash
    attention, RMSNorm and RoPE, launched from an autograd.Function - runs inside
    a hooked module yet calls none of them, and counts 0.
    """

    kind = "deepspeed"
    counts = "forward only (DeepSpeed counts inside module forwards; training is ~3x forward)"
    scope = "forward"
    fraction = 1 / 3

    def __init__(self, settings, device, model):
        try:
            self.profiler_class, self.startup = import_flops_profiler(device)
        except Exception as e:  # not installed, or a broken install
            reason = "not installed" if isinstance(e, ModuleNotFoundError) else \
                f"failed to import ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
            raise UsageError(f"--profile deepspeed needs DeepSpeed, which is {reason}: "
                             f"pip install 'deepspeed==0.19.*' (its FLOPS profiler needs no compiled "
                             f"ops), or use --profile flopcounter, built into PyTorch") from None
        super().__init__(settings, device, model)

    def _begin(self) -> None:
        self.profiler = self.profiler_class(self.model)
        self.profiler.start_profile()

    def _end(self) -> None:
        self.counted = int(self.profiler.get_total_flops())
        self.out.mkdir(parents=True, exist_ok=True)
        report = self.out / "deepspeed_profile.txt"
        self.profiler.print_model_profile(profile_step=self.first, module_depth=2, top_modules=3,
                                          detailed=True, output_file=str(report))
        self.extra = {"macs": int(self.profiler.get_total_macs()),
                      "params": int(self.profiler.get_total_params()),
                      "startup_messages": self.startup}
        self.profiler.end_profile()
        self.files["report"] = str(report)
        self.notes.append("DeepSpeed's module latencies (deepspeed_profile.txt) are inflated by a "
                          "synchronize around every module")
        if self.startup:
            self.say(f"DeepSpeed printed {len(self.startup)} line(s) while importing: "
                     f"kept in flops.json, 'startup_messages'")

    def explain(self, counted: int, analytic: int) -> list[str]:
        """Split the count into matrix products (2 FLOPs per MAC) and the rest."""
        matmul = 2 * self.extra["macs"]
        notes = [f"matrix products: {matmul:,} FLOPs (2 x MACs) vs analytic {analytic:,}; "
                 f"the other {counted - matmul:,} counted FLOPs are elementwise calls DeepSpeed "
                 "wraps (F.silu, F.softmax, torch.add, ...; not the * and + operators), which the "
                 "formula leaves out"]
        missing, attention = analytic - matmul, self.attention_share()
        if missing > 0.01 * analytic and abs(missing - attention) <= 0.01 * attention:
            notes.append(
                f"the missing {missing / 1e9:.4f} GFLOP are exactly attention's QK^T and PV "
                "products: DeepSpeed counts only calls to the torch functions it wraps; a Triton "
                "kernel launched from an autograd.Function calls none of them, so its module is "
                "hooked but counts 0 (V3's flash attention; its Triton RMSNorm and RoPE count 0 "
                "too, which only removes elementwise FLOPs)")
        elif missing > 0.01 * analytic:
            notes.append("counted less than the analytic model: custom kernels (Triton launches, "
                         "C++ extensions) bypass the torch functions DeepSpeed wraps and count 0")
        elif matmul > analytic * 1.01:
            notes.append("counted more than the analytic model"
                         + (": --grad-checkpoint recomputes the forward pass in backward"
                            if self.settings.grad_checkpoint else ""))
        return notes


# ----------------------------------------------------------------- external profilers
class MarkedWindow(Session):
    """Mark the profiled window for tools outside the process.

    ncu --profile-from-start off and nsys --capture-range=cudaProfilerApi only
    record between cudaProfilerStart and cudaProfilerStop (NVIDIA only: the
    ROCm tools do not use hipProfilerStart). The NVTX range "profiled_window"
    - a ROCTx range on ROCm, where rocprofv3 --marker-trace records it - shows
    the window on every timeline and lets the parsers cut the warm-up out.
    """

    kind = "window"

    def __init__(self, settings, device, model):
        self.gpu = device.type == "cuda"
        self.capture = self.gpu and not getattr(torch.version, "hip", None)
        first, last = profiled_window(settings)
        super().__init__(settings, device, model, first, last)
        if not self.gpu:
            self.notes.append("no GPU: nothing to mark")

    def _begin(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()  # warm-up work must not leak into the capture
            if self.capture:
                torch.cuda.profiler.start()
            torch.cuda.nvtx.range_push("profiled_window")

    def _end(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()  # the window's kernels finish inside the capture
            torch.cuda.nvtx.range_pop()
            if self.capture:
                torch.cuda.profiler.stop()
