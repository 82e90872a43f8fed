"""Empirical ceilings: how fast can this device multiply matrices and move bytes?

    python -m benchmarks.ceilings                # results/analysis/ceilings.json + a table
    python -m benchmarks.ceilings --sweep        # also bandwidth vs working-set size + plot
    python -m benchmarks.ceilings --gemm-shapes  # GPU: square and model-shaped GEMMs side by side

Datasheet peaks are promises; no real code reaches them (the H100 SXM's 989
TFLOP/s bf16 measures ~800 with a large cuBLAS GEMM). MFU and the roofline are
more honest against a *measured* ceiling, in the spirit of the Empirical
Roofline Toolkit: big GEMMs for the matrix peak, one big copy for the memory
bandwidth. The probes themselves live in harness/probes.py (the trainer's
`--measure-peak` uses them too); this command writes what they measure beside
the datasheet peaks, and analysis_tools/ceilings.py reads the JSON it writes.

A ceiling must be at least what the model's own GEMMs reach: `--gemm-shapes`
(gemm_shapes below) times square sizes and the medium preset's GEMM shapes
(M = 16 x 512 tokens) side by side, on four kinds of inputs: randn, randn * 0.02
(the model's weights' scale), randn with half its entries zeroed, and zeros. A
product's speed depends on its numbers: the probes multiply randn, slower than
zeros or half zeros, and a model's GEMMs on its own activations and gradients can
run above the ceiling (docs/ANALYSIS.md, headroom).
"""
from __future__ import annotations

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
from harness.results import git_commit, now, write_json  # noqa: E402
from harness.probes import (CALLS_PER_SAMPLE, MATMUL_SHAPES, STABLE_PERCENT,  # noqa: E402,F401
                            matmul_probe, measure_copy_gbs, measure_matmul_tflops, spread_percent)


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
        "created": now(), "git_commit": git_commit(),
        "device": desc,
        "method": "median of device-event timings after warm-up: the best of several GEMM shapes "
                  "(harness.probes.MATMUL_SHAPES, 2*m*k*n FLOPs; compare MFU against the "
                  "datasheet beside it), copy of 1 GiB GPU / 64 MiB CPU counting read + write",
        "measured": measured,
        "datasheet": {"key": found[0], **found[1]} if found else None,
        "datasheet_table": flops.PEAK_TFLOPS,
    }


def write_ceilings(data: dict, path) -> Path:
    return write_json(path, data)  # never a half-written file


# ---------------------------------------------------------------- GEMM shapes
GEMM_SHAPES = {"square 4096": (4096, 4096, 4096), "square 8192": (8192, 8192, 8192),
               "square 16384": (16384, 16384, 16384),
               "qkv   8192x1024 @ 1024x3072": (8192, 1024, 3072),
               "gate+up 8192x1024 @ 1024x5632": (8192, 1024, 5632),
               "down  8192x2816 @ 2816x1024": (8192, 2816, 1024),
               "o     8192x1024 @ 1024x1024": (8192, 1024, 1024)}


# The inputs --gemm-shapes multiplies: name -> a (rows, cols) bf16 matrix on `device`
GEMM_INPUTS = {
    "randn": lambda shape, device: torch.randn(shape, device=device, dtype=torch.bfloat16),
    "x0.02": lambda shape, device: torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02,
    "half zeros": lambda shape, device: (torch.randn(shape, device=device, dtype=torch.bfloat16)
                                         * (torch.rand(shape, device=device) < 0.5)),
    "zeros": lambda shape, device: torch.zeros(shape, device=device, dtype=torch.bfloat16),
}


def gemm_shapes(device, shapes: dict = GEMM_SHAPES, inputs: dict = GEMM_INPUTS) -> dict:
    """{name: [TFLOP/s per kind of input]}: bf16, timed as the matmul probe times its products
    (CALLS_PER_SAMPLE back to back per sample, the device never idle), median of 20."""
    device = torch.device(device)
    gpu = device.type == "cuda"  # a GPU's clocks need the warm-up, a CPU's do not
    rows = {}
    for name, (m, k, n) in shapes.items():
        rows[name] = []
        for make in inputs.values():
            a, b = make((m, k), device), make((k, n), device)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            ms = median_ms(device, lambda: torch.mm(a, b, out=out), 3, 20,
                           warmup_s=0.3 if gpu else 0.0, calls_per_sample=CALLS_PER_SAMPLE if gpu else 1)
            rows[name].append(2 * m * k * n / ms / 1e9)
            del a, b, out
    return rows


# ---------------------------------------------------------------- command line
def build_parser():
    from analysis_tools.common import out_dir_default
    from harness.args import OneLineParser

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
    print(f"{'shape (M x K @ K x N)':34s}" + "".join(f" {kind:>10s}" for kind in GEMM_INPUTS)
          + "  TFLOP/s, bf16, median of 20")
    for name, speeds in gemm_shapes("cuda").items():
        print(f"{name:34s}" + "".join(f" {tflops:10.0f}" for tflops in speeds))
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
