"""Empirical ceilings: how fast can this device multiply matrices and move bytes?

    python -m benchmarks.ceilings                # results/analysis/ceilings.json + a table
    python -m benchmarks.ceilings --sweep        # also bandwidth vs working-set size + plot
    python -m benchmarks.ceilings --gemm-shapes  # GPU: square and model-shaped GEMMs side by side

Datasheet peaks are promises; no real code reaches them (the H100 SXM's 989
TFLOP/s bf16 measures ~800 with a large cuBLAS GEMM). MFU and the roofline are
more honest against a *measured* ceiling, in the spirit of the Empirical
Roofline Toolkit: big GEMMs for the matrix peak, one big copy for the memory
bandwidth. This module is the one home of those probes: the command above
writes them beside the datasheet peaks, the trainer's `--measure-peak` and
benchmarks/compare_versions.py call them, and analysis_tools/ceilings.py
reads the JSON they write.

A ceiling is only useful if it is stable. The matmul probe therefore warms up
for GPU_WARMUP_S seconds of GEMMs first (clocks ramp up and cuBLAS/hipBLASLt
pick their kernels), then times several shapes (MATMUL_SHAPES) with device
events, takes each shape's median (each sample: CALLS_PER_SAMPLE products back to back,
the sustained load training puts on the chip) and reports the best: one shape that
happens to get a poor kernel or a clock dip cannot drag the ceiling down.
Even so, report MFU against the datasheet peak beside it, and judge nothing on
a probe that moves by more than STABLE_PERCENT between two measurements
(benchmarks/compare_versions.py probes before and after its runs).
Inputs are random normals, never zeros: GPUs draw less power multiplying zeros
and can clock higher, which would flatter the result. On a CPU the sizes
shrink so each probe takes well under a second.

A ceiling must be at least what the model's own GEMMs reach: `--gemm-shapes`
(gemm_shapes below) times square sizes and the medium preset's GEMM shapes
(M = 16 x 512 tokens) side by side, with inputs of two scales (randn, and
randn * 0.02 like the model's weights).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/ceilings.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from harness import device as dev  # noqa: E402
from harness import flops  # noqa: E402
from harness.config import PRECISIONS, parse_precisions  # noqa: E402
from harness.errors import UsageError, WorkshopError  # noqa: E402
from harness.measure import median_ms  # noqa: E402

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


# ---------------------------------------------------------------- the ceilings file
def default_precisions(device: torch.device) -> list[str]:
    if device.type == "cpu":
        return ["fp32", "bf16"]
    return list(PRECISIONS) if dev.supports_bf16(device) else ["fp32", "fp16"]


def measure_ceilings(device="auto", precisions=None, sweep: bool = False) -> dict:
    """Measured peaks plus the datasheet row of this device (if it is in the table)."""
    device = dev.resolve_device(device) if isinstance(device, str) else torch.device(device)
    precisions = precisions or default_precisions(device)
    matmul = {}
    for p in precisions:
        if p not in PRECISIONS:
            raise UsageError(f"unknown precision {p!r} ({', '.join(PRECISIONS)})")
        if p == "tf32" and device.type == "cpu":
            continue  # no TF32 on CPUs
        matmul[p] = measure_matmul_tflops(device, p)
    measured = {"matmul_tflops": matmul, "copy_gbs": measure_copy_gbs(device)}
    if sweep:
        top = 30 if device.type == "cuda" else 26   # 1 GiB on a GPU, 64 MiB on a CPU
        measured["copy_sweep"] = [{"bytes": 1 << e, "gbs": measure_copy_gbs(device, 1 << e)}
                                  for e in range(16, top + 1, 2)]
    desc = dev.describe(device)
    found = flops.lookup_peak(desc["name"], desc["arch"])
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": desc,
        "method": "median of device-event timings after warm-up: the best of several GEMM shapes "
                  "(benchmarks.ceilings.MATMUL_SHAPES, 2*m*k*n FLOPs; compare MFU against the "
                  "datasheet beside it), copy of 1 GiB GPU / 64 MiB CPU counting read + write",
        "measured": measured,
        "datasheet": {"key": found[0], **found[1]} if found else None,
        "datasheet_table": flops.PEAK_TFLOPS,
    }


def write_ceilings(data: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


# ---------------------------------------------------------------- GEMM shapes
GEMM_SHAPES = {"square 4096": (4096, 4096, 4096), "square 8192": (8192, 8192, 8192),
               "square 16384": (16384, 16384, 16384),
               "qkv   8192x1024 @ 1024x3072": (8192, 1024, 3072),
               "gate+up 8192x1024 @ 1024x5632": (8192, 1024, 5632),
               "down  8192x2816 @ 2816x1024": (8192, 2816, 1024),
               "o     8192x1024 @ 1024x1024": (8192, 1024, 1024)}


def gemm_shapes(device, shapes: dict = GEMM_SHAPES, scales=(1.0, 0.02)) -> dict:
    """{name: [TFLOP/s per input scale]}: bf16, median of 20 after a short warm-up."""
    device = torch.device(device)
    rows = {}
    for name, (m, k, n) in shapes.items():
        rows[name] = []
        for scale in scales:
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16) * scale
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16) * scale
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            ms = median_ms(device, lambda: torch.mm(a, b, out=out), 3, 20, warmup_s=0.3)
            rows[name].append(2 * m * k * n / ms / 1e9)
            del a, b, out
    return rows


# ---------------------------------------------------------------- command line
def build_parser():
    from analysis_tools.common import out_dir_default
    from harness.cli import OneLineParser

    p = OneLineParser(prog="python -m benchmarks.ceilings",
                      description="Measure this device's matmul peak per precision and its "
                                  "copy bandwidth into a ceilings JSON.")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--precisions", help="comma-separated, default: all this device supports")
    p.add_argument("--sweep", action="store_true", help="also bandwidth vs size (cache levels) + plot")
    p.add_argument("--gemm-shapes", action="store_true",
                   help="instead: time square and model-shaped bf16 GEMMs (GPU only), a table")
    p.add_argument("--output", help="JSON path (default <out-dir>/ceilings.json)")
    p.add_argument("--out-dir", default=str(out_dir_default()),
                   help=f"folder for the JSON and plot (default {out_dir_default()})")
    return p


def print_gemm_shapes() -> int:
    if not torch.cuda.is_available():
        raise UsageError("--gemm-shapes times GPU matrix products and needs a CUDA or ROCm GPU")
    print(f"{'shape (M x K @ K x N)':34s} {'randn':>8s} {'x0.02':>8s}  TFLOP/s, bf16, median of 20")
    for name, (plain, small) in gemm_shapes("cuda").items():
        print(f"{name:34s} {plain:8.0f} {small:8.0f}")
    return 0


def main(argv=None) -> int:
    from analysis_tools.ceilings import format_ceilings, plot_copy_sweep
    from analysis_tools.common import AnalysisError

    try:
        args = build_parser().parse_args(argv)
        if args.gemm_shapes:
            return print_gemm_shapes()
        precisions = parse_precisions(args.precisions) if args.precisions else None
        data = measure_ceilings(args.device, precisions, sweep=args.sweep)
        path = write_ceilings(data, args.output or Path(args.out_dir) / "ceilings.json")
        print(format_ceilings(data))
        if args.sweep:
            print(f"plot: {plot_copy_sweep(data, args.out_dir)}")
        print(f"ceilings: {path}")
        return 0
    except (AnalysisError, WorkshopError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
