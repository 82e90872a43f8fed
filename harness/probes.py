"""The device probes: how fast this device multiplies matrices, copies bytes and (on a
CPU) runs a small matrix product. The one home of the measuring code: the ceilings
command (benchmarks/ceilings.py) writes what they measure beside the datasheet peaks,
the trainer's --measure-peak and the GPU-sized notice call them, and
benchmarks/compare_versions.py probes before and after its runs.

A ceiling is only useful if it is stable. The matmul probe therefore warms up
for GPU_WARMUP_S seconds of GEMMs first (clocks ramp up and cuBLAS/hipBLASLt
pick their kernels), then times several shapes (MATMUL_SHAPES) with device
events, takes each shape's median (each sample: CALLS_PER_SAMPLE products back to back,
the sustained load training puts on the chip) and reports the best: one shape that
happens to get a poor kernel or a clock dip cannot drag the ceiling down.
Judge nothing on a probe that moves by more than STABLE_PERCENT between two
measurements. Inputs are random normals, never zeros: GPUs draw less power
multiplying zeros and can clock higher, which would flatter the result. On a CPU
the sizes shrink so each probe takes well under a second.
"""
from __future__ import annotations

import contextlib

import torch

from .config import PRECISIONS
from .measure import median_ms

GPU_WARMUP_S = 2.0  # seconds of untimed GEMMs before a GPU probe: clocks ramp up
STABLE_PERCENT = 3.0  # two probes further apart than this: the ceiling is not trusted
# GEMMs per timed sample (~15 ms of sustained work): a GPU at its power limit moves its
# clock from one ~1 ms product to the next, and a sync after each lets it idle.
CALLS_PER_SAMPLE = 10
# (m, k, n) of the products the matmul probe times; it reports the best median.
MATMUL_SHAPES = {"cuda": ((8192, 8192, 8192), (16384, 8192, 4096), (4096, 8192, 16384)),
                 "cpu": ((1024, 1024, 1024),)}


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


def measure_matmul_tflops(device, precision: str = "bf16", size: int | None = None,
                          warmup: int = 3, repeats: int = 20) -> float:
    """The matmul ceiling in TFLOP/s: the best median of MATMUL_SHAPES (see matmul_probe)."""
    return matmul_probe(device, precision, size, warmup, repeats)["tflops"]


def matmul_probe(device, precision: str = "bf16", size: int | None = None, warmup: int = 3,
                 repeats: int = 20) -> dict:
    """{"tflops": best median over the shapes, "shapes": {"MxKxN": median TFLOP/s}}.

    Each shape is an (m x k) @ (k x n) product, 2*m*k*n FLOPs, about 1-2 ms of
    work at bf16 on a GPU: long enough that launch cost vanishes, big enough to
    fill every compute unit. `size` times one square size^3 product instead.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    shapes = ((size, size, size),) if size else MATMUL_SHAPES["cuda" if device.type == "cuda" else "cpu"]
    if device.type == "cpu":
        repeats = min(repeats, 5)
    dtype, gen = PRECISIONS[precision].dtype, torch.Generator(device=device).manual_seed(0)
    results = {}
    with _matmul_precision(precision):
        for i, (m, k, n) in enumerate(shapes):
            a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
            b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
            out = torch.empty(m, n, device=device, dtype=dtype)
            # The first shape carries the long warm-up (clocks); later ones a short one (kernels).
            ms = median_ms(device, lambda: torch.mm(a, b, out=out), warmup, repeats,
                           warmup_s=_warmup_s(device) if i == 0 else _warmup_s(device) / 8,
                           calls_per_sample=CALLS_PER_SAMPLE if device.type == "cuda" else 1)
            results[f"{m}x{k}x{n}"] = 2 * m * k * n / (ms / 1000) / 1e12
            del a, b, out
    return {"tflops": max(results.values()), "shapes": results}


def spread_percent(first: float | None, second: float | None) -> float | None:
    """How far apart two probes of the same ceiling are, in % of the larger."""
    if not first or not second:
        return None
    return abs(first - second) / max(first, second) * 100


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


def cpu_matmul_flops(n: int = 1024, repeats: int = 3) -> float:
    """FLOP/s of an n x n fp32 matrix product on this CPU, with this process's threads:
    a probe of a few tenths of a second, about the rate a GPU-sized model's matrix
    products reach here."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    # the warm-up product pays for thread start-up and the BLAS's set-up
    ms = median_ms(torch.device("cpu"), lambda: a @ b, warmup=1, repeats=repeats)
    return 2 * n ** 3 / max(ms / 1000, 1e-12)
