"""Which device are we on, and what can it do?

ROCm builds of PyTorch reuse the `torch.cuda` namespace (HIP is exposed as
"cuda"), so one code path serves AMD and NVIDIA; `torch.version.hip` tells
them apart.
"""
from __future__ import annotations

import os
import platform
import re
import time

import torch

from .errors import UsageError


def backend() -> str:
    """'rocm', 'cuda' or 'cpu' for the GPU this torch build would use."""
    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def resolve_device(requested: str = "auto") -> torch.device:
    if requested not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device must be auto, cuda or cpu (got {requested!r})")
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        return torch.device("cuda", index)
    if requested == "cuda":
        raise UsageError("--device cuda was requested but no GPU is visible to PyTorch "
                         "(torch.cuda.is_available() is False)")
    return torch.device("cpu")


def supports_bf16(device: torch.device) -> bool:
    if device.type == "cpu":
        return True  # works (emulated, slow); we still default to fp32 on CPU
    if backend() == "rocm":
        # bf16 matrix instructions arrived with CDNA (MI100, gfx908); MI50 (gfx906) lacks them.
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")
        return not arch.startswith("gfx906")
    return torch.cuda.is_bf16_supported()


def gpu_slug(name: str | None = None) -> str:
    """The short name of a GPU model, for folders of its results: 'NVIDIA H200' -> 'h200',
    'AMD Instinct MI300X' -> 'mi300x'; no GPU -> 'cpu'."""
    if name is None:
        if not torch.cuda.is_available():
            return "cpu"
        name = torch.cuda.get_device_name(0)
    words = [w for w in re.split(r"[\s_]+", name.lower())
             if w not in ("nvidia", "amd", "instinct", "radeon", "geforce", "tesla", "pro")]
    for w in words:
        if re.search(r"\d", w) and re.match(r"^[a-z0-9-]+$", w):
            return w
    return re.sub(r"[^a-z0-9]+", "-", " ".join(words)).strip("-") or "gpu"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def gpu_arch(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    if backend() == "rocm":
        return getattr(props, "gcnArchName", None)
    return f"sm_{props.major}{props.minor}"


def triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # not installed, or broken install: both mean "no triton"
        return None


def describe(device: torch.device) -> dict:
    """Everything about the software and hardware a reader needs to reproduce a run."""
    return {
        "type": device.type,
        "name": device_name(device),
        "backend": backend() if device.type == "cuda" else "cpu",
        "arch": gpu_arch(device),
        "torch": torch.__version__,
        "triton": triton_version(),
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def queue_mark(device: torch.device):
    """An event behind the work queued on the device so far (None on a CPU, whose work is
    done when the call returns): its query() says, without waiting, whether that work ran."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def hold(device: torch.device, ms: float) -> None:
    """Queue `ms` of busy-waiting on the GPU's current stream (torch.cuda._sleep spins for a
    number of clock cycles, measured once per GPU): what the host queues next waits behind
    it, so the host's time to queue that work reads on the host clock, the host never
    waiting for the GPU."""
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _SLEEP_CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # the clock ramps up first
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS[index] = 20_000_000 / start.elapsed_time(end)
    torch.cuda._sleep(int(ms * _SLEEP_CYCLES_PER_MS[index]))


class StepClock:
    """Times regions of one training step.

    On a GPU the host only *enqueues* work, so host clocks measure launch time,
    not compute. We record device events instead, and read them once per step
    after a single synchronize. On the CPU work is synchronous and a wall clock
    is exact.
    """

    def __init__(self, device: torch.device):
        self.use_events = device.type == "cuda"
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        if self.use_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def elapsed_ms(self, start: str, end: str) -> float:
        return self._between(self.marks[start], self.marks[end])

    def elapsed_ms_to(self, later: "StepClock", name: str, start: str = "start") -> float:
        """From this clock's `start` mark to mark `name` of a later clock."""
        return self._between(self.marks[start], later.marks[name])

    def _between(self, a, b) -> float:
        if self.use_events:
            return a.elapsed_time(b)  # the caller synchronized already
        return (b - a) * 1000.0
