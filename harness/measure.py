"""Statistics of step timings, the one timer of device work, memory readings and the
gradient-flow guard.

Every benchmark times work with the three functions here (the Timer below bundles them
for the kernel benchmark):
  median_ms  device time between two events, median of samples after warm-up
             (a wall clock on the CPU, where work is synchronous)
  graph_ms   the same for calls replayed from one CUDA/HIP graph: the GPU's time alone,
             without Python or launch costs between the calls
  host_ms    what a call costs the host (Python + launch), with the GPU running behind
and, to compare two calls on the GPU alone, paired_graph_ratio: both graph replays in each
of several rounds, the median of the rounds' ratios. For a whole training step, HostProbe
(the trainer's --host-probe) reads the GPU's time to run it with nothing to wait for, and the
host's time to queue it behind a held GPU.
"""
from __future__ import annotations

import resource
import statistics
import sys
import time

import torch

from . import device as dev
from .errors import GradientFlowError


def summarize(samples_ms: list[float]) -> dict:
    """Median and 10th/90th percentiles: robust to the odd slow step."""
    if not samples_ms:
        return {"median": None, "p10": None, "p90": None, "mean": None, "n": 0}
    t = torch.tensor(samples_ms, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"median": q[1], "p10": q[0], "p90": q[2], "mean": t.mean().item(), "n": len(samples_ms)}


def median_ms(device: torch.device, work, warmup: int = 3, repeats: int = 10,
              warmup_s: float = 0.0, calls_per_sample: int = 1) -> float:
    """Median device time of one `work()` in ms, after `warmup` untimed calls and
    at least `warmup_s` seconds of them. Each of the `repeats` samples times
    `calls_per_sample` back-to-back calls between two events: no host sync between
    them, so the device stays busy as it is in training (and its clocks with it)."""
    started = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - started < warmup_s:
        work()
        done += 1
        if done >= warmup:
            dev.synchronize(device)  # count finished work, not queued launches
    samples = []
    for _ in range(repeats):
        clock = dev.StepClock(device)
        clock.mark("start")
        for _ in range(calls_per_sample):
            work()
        clock.mark("end")
        dev.synchronize(device)
        samples.append(clock.elapsed_ms("start", "end") / calls_per_sample)
    return summarize(samples)["median"]


def capture_graph(fn, calls: int, warmup_calls: int = 1):
    """`calls` calls of fn captured as one CUDA/HIP graph; returns its replay.

    fn first runs `warmup_calls` times on the side stream that captures (capture
    needs the caching allocator, every kernel and any autotuning warmed up).
    Raises what capture raises (a kernel that synchronizes, an old driver): the
    caller decides how to say so."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def graph_ms(fn, calls: int, repeats: int = 5, warmup_calls: int = 3) -> tuple[float | None, str | None]:
    """(median ms per call of `calls` calls replayed from one graph, None), or
    (None, why) where capture fails (a kernel that synchronizes, an old driver)."""
    try:
        replay = capture_graph(fn, calls, warmup_calls)
    except Exception as e:  # capture raises many types: say which and why
        return None, _capture_failed(e)
    ms = median_ms(torch.device("cuda"), replay, warmup=1, repeats=repeats)
    return ms / calls, None


def _capture_failed(error: Exception) -> str:
    """Why a graph capture failed, in one line (after the GPU has drained what it began)."""
    torch.cuda.synchronize()
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"


def paired_graph_ratio(fn, other, calls: int, rounds: int = 9
                       ) -> tuple[float | None, list | None, str | None]:
    """(other's time over fn's, the middle half of the rounds' ratios, None), both replayed
    from graphs of `calls` calls: each round replays fn, other, other, fn and takes the ratio
    of the two sums, and the result is the median of the rounds'. A GPU whose clock drifts
    with its power and heat over a run moves both sums of a round alike, where two medians
    taken a second apart can differ by a few percent. (None, None, why) where capture fails."""
    try:
        replays = [capture_graph(f, calls, warmup_calls=3) for f in (fn, other)]
    except Exception as e:  # capture raises many types: say which and why
        return None, None, _capture_failed(e)
    gpu = torch.device("cuda")
    ratios = []
    for _ in range(rounds):
        ms = [0.0, 0.0]
        for i in (0, 1, 1, 0):
            ms[i] += median_ms(gpu, replays[i], warmup=1, repeats=1)
        ratios.append(ms[1] / ms[0])
    quartiles = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), [quartiles[0], quartiles[2]], None


def host_ms(fn, calls: int = 20, repeats: int = 1, warmup: int = 1) -> float:
    """Wall-clock ms per call while the GPU runs behind, median of `repeats` samples of
    `calls` calls with no synchronize among them (fewer launches than the driver's queue
    holds, so the host never waits for the GPU); the GPU is drained between samples."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1000 / calls)
        torch.cuda.synchronize()
    return statistics.median(samples)


HOST_PACE_ITEMS = 20_000  # one round: ~1-3 ms of Python on a current server core


def _host_work(items: int) -> int:
    """Dictionary stores and tuple builds: the kind of Python an eager step runs per launch."""
    seen = {}
    for i in range(items):
        seen[i & 255] = (i, i & 7)
    return len(seen)


def host_pace_us(rounds: int = 5, items: int = HOST_PACE_ITEMS) -> float:
    """Median microseconds of `rounds` rounds of the same Python work on this thread.

    A run whose pace the host sets (eager V3, the small preset) moves with this number:
    the same code can run half as fast when its process lands on a slower or busier core.
    Measured just before and after a run's timed steps (the trainer does), it tells such a
    process from a slower commit (harness.results.host_slowdowns). Compare it between
    processes of one machine only."""
    _host_work(items)  # the first round pays for allocation
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        _host_work(items)
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


class HostProbe:
    """--host-probe N: is a training step paced by the host or by the GPU?

    After the timed steps, N more steps run, each queued behind a GPU busy-wait of a few
    step times (device.hold): the host queues the whole step while the GPU is still
    waiting, so the step's events read what the GPU needs to run it with nothing to wait
    for, and the host clock what queueing the step costs (Python, dispatch, launches) - into
    a queue hundreds of launches deep, which can read more than queueing the same step
    behind a running GPU (docs/PROFILING.md). The timed steps less the GPU's time is what
    the GPU waited for the host (results.host_probe_verdict): where it waits, a faster
    kernel changes nothing, and any hiccup of the host shows in the step.
    If queueing takes most of the busy-wait, the host waited for the GPU (a synchronize in
    the step, or more launches than the driver's queue holds): `host_waited` says so."""

    def __init__(self, steps: int):
        self.steps = steps
        self.samples: list[tuple[float, float]] = []  # (ms to queue a step, its GPU ms)
        self.hold_ms = 0.0
        self._queued_from = 0.0  # when the probed step's queueing began (host clock)

    def start(self, device: torch.device, timed_clocks: list) -> None:
        """Before a probed step: hold the GPU for three timed steps (at least 50 ms)."""
        dev.synchronize(device)
        if not self.hold_ms:
            timed = [c.elapsed_ms("start", "end") for c in timed_clocks]
            self.hold_ms = max(50.0, 3 * statistics.median(timed)) if timed else 200.0
        dev.hold(device, self.hold_ms)
        self._queued_from = time.perf_counter()

    def stop(self, device: torch.device, clock) -> None:
        """After the probed step's last mark: the host's time, then (synchronized) the GPU's."""
        queued_ms = (time.perf_counter() - self._queued_from) * 1000.0
        dev.synchronize(device)
        self.samples.append((queued_ms, clock.elapsed_ms("start", "end")))

    def result(self) -> dict | None:
        if not self.samples:
            return None
        host = statistics.median(s[0] for s in self.samples)
        return {"steps": len(self.samples), "hold_ms": self.hold_ms, "host_ms": host,
                "gpu_ms": statistics.median(s[1] for s in self.samples),
                "host_waited": host > 0.8 * self.hold_ms}


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: what follows is measured, not what came before it."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets this process's peak RSS (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # elsewhere the peak is the whole process's


def peak_memory(device: torch.device) -> dict:
    mb = 1024 * 1024
    if device.type == "cuda":
        return {"peak_allocated_mb": torch.cuda.max_memory_allocated(device) / mb,
                "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / mb}
    # VmHWM is this process's own peak RSS since reset_peak_memory. ru_maxrss is
    # not: a child process inherits its parent's, and it is never reset.
    hwm_kb = _proc_status_kb("VmHWM")
    if hwm_kb is not None:
        return {"peak_rss_mb": hwm_kb / 1024}
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_mb": rss / (mb if sys.platform == "darwin" else 1024)}


def rss_bytes() -> int:
    """What this process holds in memory now (its resident set), 0 where not known."""
    return (_proc_status_kb("VmRSS") or 0) * 1024


def available_bytes() -> int | None:
    """Bytes this machine can give a new allocation now without swapping (Linux's
    MemAvailable: free memory plus caches it can drop), or None where not known."""
    kb = _proc_status_kb("MemAvailable", "/proc/meminfo")
    return kb * 1024 if kb is not None else None


def _proc_status_kb(field: str, path: str = "/proc/self/status") -> int | None:
    """A 'kB' field of /proc/self/status or another such file (Linux), or None elsewhere."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_gradient_flow(model: torch.nn.Module) -> int:
    """Every trainable parameter must have a finite, non-zero gradient.

    A custom kernel that writes its output into a fresh tensor without an
    autograd.Function silently cuts the graph: everything before it gets no
    gradient, backward becomes nearly free, and the 'speed-up' is fake. This
    check, run after the first step, makes that impossible to miss.

    A fused parameter (V2-V4's qkv_proj stacks V1's q, k and v weights) is
    checked piece by piece in V1's layout (the model's `to_v1_layout`), so a
    zero gradient for the whole k slice fails here exactly as it does in V1.
    Returns the number of gradients checked (in V1's layout where there is one).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [name for name, p in params if p.grad is None]
    grads = {name: p.grad for name, p in params if p.grad is not None}
    if hasattr(model, "to_v1_layout"):
        grads = model.to_v1_layout(grads)
    bad = [name for name, g in grads.items()
           if not bool(torch.isfinite(g).all()) or not bool(g.abs().sum() > 0)]
    checked = len(missing) + len(grads)
    if missing or bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(params)} parameters got no gradient "
                         f"({_some(missing)})")
        if bad:
            parts.append(f"{len(bad)} have zero or non-finite gradients ({_some(bad)})")
        raise GradientFlowError("gradient-flow guard: " + "; ".join(parts) +
                                " - is the autograd graph cut by a kernel without backward?")
    return checked


def _some(names: list[str], shown: int = 4) -> str:
    more = f", ... +{len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


class Timer:
    """Three views of one call: do_bench (what a training step sees), CUDA/HIP
    graph replay (GPU time alone: no Python, no launch cost) and host time (the
    Python + launch cost of a call, measured without waiting for the GPU). On a CPU
    (Triton's interpreter) only the wall clock, after one warm-up call.
    quick: fewer samples and a shorter budget (a smoke test)."""

    def __init__(self, device: torch.device, quick: bool):
        self.gpu = device.type != "cpu"
        self.repeats = 1 if quick else 5        # CPU samples
        self.rep_ms = 20 if quick else 100      # do_bench budget per measurement

    def bench(self, fn) -> float:
        if not self.gpu:  # the interpreter: wall clock, after one warm-up call
            return median_ms(torch.device("cpu"), fn, warmup=1, repeats=self.repeats)
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=self.rep_ms, return_mode="median")

    def host(self, fn, calls: int = 20) -> float | None:
        """Host ms per call (host_ms); None on a CPU."""
        return host_ms(fn, calls) if self.gpu else None

    def graph(self, fn, estimate_ms: float) -> tuple[float | None, str | None]:
        """(median ms per call replayed from a graph, None) or (None, why not):
        ~20 ms worth of calls captured into one graph, replayed 5 times (graph_ms)."""
        if not self.gpu:
            return None, "no GPU"
        ms, why = graph_ms(fn, calls=self.graph_calls(estimate_ms))
        if why:
            print(f"  (no graph timing: {why})")
        return ms, why

    @staticmethod
    def graph_calls(estimate_ms: float) -> int:
        """Calls in one graph: ~20 ms worth."""
        return max(1, min(200, int(20 / max(estimate_ms, 1e-3))))

    def paired(self, fn, other, estimate_ms: float) -> tuple[float | None, list | None, str | None]:
        """other's graph-replay time over fn's in paired rounds (paired_graph_ratio)."""
        if not self.gpu:
            return None, None, "no GPU"
        return paired_graph_ratio(fn, other, self.graph_calls(estimate_ms))
