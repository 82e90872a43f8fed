"""Version 4: V2's fused model with PyTorch's fused attention (SDPA).

One method changes from V2: the attention core. V2 writes the T x T score
matrix to memory, masks it, softmaxes it and reads it back - memory traffic
that grows with T^2. `F.scaled_dot_product_attention(q, k, v, is_causal=True)`
dispatches to a flash-attention-style kernel instead: scores are computed tile
by tile in on-chip memory with an online softmax and never reach HBM, and
backward recomputes them. Attention memory goes from O(T^2) to O(T).

Which kernel runs depends on the GPU, dtype, head size and torch version:
    flash      FlashAttention-2 (NVIDIA); AOTriton or Composable Kernel (AMD ROCm)
    efficient  memory-efficient attention (xFormers-style; AOTriton on ROCm)
    cudnn      NVIDIA cuDNN's fused attention
    math       the explicit maths, like V2: the fallback that always works
`--sdpa-backend` forces one. The results JSON records which one ran
(options.sdpa_kernel); sdpa_probe.py explains how that is found out.

Grouped-query attention without copies: with enable_gqa=True (torch >= 2.5)
the kernel reads each k/v head for its whole group of query heads, where V1
and V2 materialise repeated k/v tensors.

The small preset is launch-bound (microseconds of work per kernel): add
`--compile --compile-mode reduce-overhead` to capture forward and backward as
CUDA/HIP graphs - one launch replays hundreds of kernels.

Run:  python version4_sdpa/tiny_llama_v4.py --preset tiny
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.nn.attention import sdpa_kernel as restrict_sdpa_to

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
import training  # noqa: E402
from harness import ModelConfig, UsageError  # noqa: E402
from version2_fused import tiny_llama_v2 as v2  # noqa: E402
from version4_sdpa.sdpa_probe import NATIVE_GQA, choose_sdpa  # noqa: E402
from version4_sdpa.spec import BACKENDS, SPEC  # noqa: E402


def allow_only(backend: str):
    """Context in which SDPA may use only `backend` ("auto": PyTorch chooses)."""
    if backend == "auto":
        return contextlib.nullcontext()
    member = getattr(SDPBackend, BACKENDS[backend], None)
    if member is None:
        raise UsageError(f"--sdpa-backend {backend} does not exist in torch {torch.__version__}")
    return restrict_sdpa_to([member])


def causal_sdpa(q, k, v, backend: str = "auto", gqa: str = "native"):
    """Causal attention. q: (B, heads, T, d); k, v: (B, kv_heads, T, d)."""
    grouped = k.shape[1] != q.shape[1]
    if grouped and gqa == "repeat":
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        grouped = False
    with allow_only(backend):
        if grouped:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SDPAAttention(v2.Attention):
    """V2's attention (one QKV GEMM, RoPE) with SDPA as its core."""

    def __init__(self, cfg: ModelConfig, fusions: v2.Fusions = v2.ALL_FUSIONS,
                 backend: str = "auto", gqa: str = "native"):
        super().__init__(cfg, fusions)
        self.backend, self.gqa = backend, gqa

    def attend(self, q, k, v):
        return causal_sdpa(q, k, v, self.backend, self.gqa)


def build_model(config: ModelConfig, gqa: str | None = None, sdpa_kernel: str | None = None,
                **switches) -> nn.Module:
    """switches: V2's fusions and sdpa_backend by name (spec.py: their defaults).
    sdpa_kernel is only recorded (what the probe saw run); it changes nothing."""
    settled = SPEC.settle(switches)
    backend = settled.pop("sdpa_backend")
    gqa = gqa or ("native" if NATIVE_GQA else "repeat")

    def attention(cfg, fusions):
        return SDPAAttention(cfg, fusions, backend=backend, gqa=gqa)

    return v2.TinyLlama(config, v2.Fusions(**settled), attention=attention)


# ---- command line (the switches' flags come from SPEC) ----------------------------
def preflight(args, run) -> dict:
    """Once, before training: the SDPA kernel that runs this very run, and the GQA mode."""
    s = run.settings
    kernel, gqa = choose_sdpa(build_model, s.model, s.batch_size, s.seq_len, run.device,
                              run.precision, args.sdpa_backend)
    return {"sdpa_kernel": kernel, "gqa": gqa}


def main(argv=None) -> int:
    return training.main(SPEC, build_model, argv=argv, preflight=preflight,
                         description="Version 4: V2's fusions with PyTorch SDPA (flash) attention.")


if __name__ == "__main__":
    sys.exit(main())
