"""How fast does this GPU multiply matrices of each shape? (the ceiling's sanity check)

    python benchmarks/gemm_shapes.py            # bf16, a table on stdout

The matmul ceiling (harness.ceilings) is one square 8192^3 product. A ceiling
must be at least what the model's own GEMMs reach, so this times square sizes
and the medium preset's GEMM shapes (M = 16 x 512 tokens) side by side, with
inputs of two scales (randn, and randn * 0.02 like the model's weights).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from harness.ceilings import median_ms  # noqa: E402
from harness.cli import OneLineParser  # noqa: E402

SHAPES = {"square 4096": (4096, 4096, 4096), "square 8192": (8192, 8192, 8192),
          "square 16384": (16384, 16384, 16384),
          "qkv   8192x1024 @ 1024x3072": (8192, 1024, 3072),
          "gate+up 8192x1024 @ 1024x5632": (8192, 1024, 5632),
          "down  8192x2816 @ 2816x1024": (8192, 2816, 1024),
          "o     8192x1024 @ 1024x1024": (8192, 1024, 1024)}


def main(argv=None) -> int:
    OneLineParser(prog="gemm_shapes.py", description=__doc__.split("\n\n")[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print("error: gemm_shapes.py times GPU matrix products and needs a CUDA or ROCm GPU",
              file=sys.stderr)
        return 2
    device = torch.device("cuda")
    print(f"{'shape (M x K @ K x N)':34s} {'randn':>8s} {'x0.02':>8s}  TFLOP/s, bf16, median of 20")
    for name, (m, k, n) in SHAPES.items():
        row = []
        for scale in (1.0, 0.02):
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16) * scale
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16) * scale
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            ms = median_ms(device, lambda: torch.mm(a, b, out=out), 3, 20, warmup_s=0.3)
            row.append(2 * m * k * n / ms / 1e9)
        print(f"{name:34s} {row[0]:8.0f} {row[1]:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
