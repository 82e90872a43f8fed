"""Empirical ceilings: how fast can this device multiply matrices and move bytes?

Datasheet peaks are promises; no real code reaches them (the H100 SXM's 989
TFLOP/s bf16 measures ~800 with a large cuBLAS GEMM). MFU and the roofline are
more honest against a *measured* ceiling, in the spirit of the Empirical
Roofline Toolkit: one big GEMM for the matrix peak, one big copy for the
memory bandwidth.

Both probes warm up first - on a GPU for at least half a second of device
work (GPU_WARMUP_S), so the clocks have ramped and cuBLAS/hipBLASLt have
picked their kernels - then time with device events and report the median.
(On H200s, 3 warm-up calls and 0.5 s gave the same matmul ceiling within run
to run noise; the ceiling itself varied 651-779 TFLOP/s between machines of the
same type: compare MFU only within one run - docs/PERFORMANCE.md.) Inputs are random normals,
never zeros: GPUs draw less power multiplying zeros and can clock higher, which
would flatter the result. On a CPU the sizes shrink so each probe takes well
under a second.
"""
from __future__ import annotations

import contextlib
import time

import torch

from . import device as dev
from .measure import summarize

GPU_WARMUP_S = 0.5  # seconds of untimed work before a GPU probe

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


@contextlib.contextmanager
def _matmul_precision(precision: str):
    """tf32 only for the tf32 probe; restore the caller's settings afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def _warmup_s(device: torch.device) -> float:
    return GPU_WARMUP_S if device.type == "cuda" else 0.0


def median_ms(device: torch.device, work, warmup: int = 3, repeats: int = 10,
              warmup_s: float = 0.0) -> float:
    """Median device time of `work()` in ms, after `warmup` untimed calls and
    at least `warmup_s` seconds of them."""
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
        work()
        clock.mark("end")
        dev.synchronize(device)
        samples.append(clock.elapsed_ms("start", "end"))
    return summarize(samples)["median"]


def measure_matmul_tflops(device, precision: str = "bf16", size: int | None = None,
                          warmup: int = 3, repeats: int = 20) -> float:
    """Median TFLOP/s of a square `size`^3 matrix product (2*size^3 FLOPs).

    8192^3 on a GPU (about 1 ms of work at bf16: long enough that launch cost
    vanishes, big enough to fill every compute unit); 1024^3 on a CPU.
    """
    device = torch.device(device)
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)} (got {precision!r})")
    n = size or (8192 if device.type == "cuda" else 1024)
    if device.type == "cpu":
        repeats = min(repeats, 5)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=DTYPES[precision], generator=gen)
    b = torch.randn(n, n, device=device, dtype=DTYPES[precision], generator=gen)
    out = torch.empty(n, n, device=device, dtype=DTYPES[precision])
    with _matmul_precision(precision):
        ms = median_ms(device, lambda: torch.mm(a, b, out=out), warmup, repeats,
                       warmup_s=_warmup_s(device))
    return 2 * n ** 3 / (ms / 1000) / 1e12


def measure_copy_gbs(device, nbytes: int | None = None, warmup: int = 3,
                     repeats: int = 10) -> float:
    """Median GB/s of a device-to-device copy, counting bytes read + written.

    1 GiB on a GPU (far beyond every cache, so this is HBM), 64 MiB on a CPU.
    Small sizes (to see caches) repeat the copy inside one timed region so that
    the launch latency of a single copy does not dominate.
    """
    device = torch.device(device)
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.randn(max(1, nbytes // 4), device=device)
    dst = torch.empty_like(src)
    per_region = (256 << 20) if device.type == "cuda" else (16 << 20)
    copies = max(1, min(1000, per_region // src.nbytes))

    def work():
        for _ in range(copies):
            dst.copy_(src)

    ms = median_ms(device, work, warmup, repeats if device.type == "cuda" else min(repeats, 5),
                   warmup_s=_warmup_s(device))
    return 2 * src.nbytes * copies / (ms / 1000) / 1e9
