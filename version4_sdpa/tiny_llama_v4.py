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
(options.sdpa_kernel); probe_sdpa_kernel explains how that is found out.

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
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.nn.attention import sdpa_kernel as restrict_sdpa_to
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
import training  # noqa: E402
from harness import ModelConfig, UsageError  # noqa: E402
from harness.device import device_name  # noqa: E402
from version2_fused import tiny_llama_v2 as v2  # noqa: E402
from version4_sdpa.spec import BACKENDS, SPEC  # noqa: E402

# enable_gqa arrived in torch 2.5; before that we repeat k/v like V2 does.
NATIVE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


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


# ---- which kernel runs? ------------------------------------------------------
# SDPA is a dispatcher: it checks each fused kernel's constraints (GPU, dtype,
# head size, strides, GQA...) and calls the first that fits, as an ATen op whose
# name says which family it is. A TorchDispatchMode sees every ATen op that
# runs. So before training we run one block of this very model - same config,
# batch, sequence length and autocast precision - forward and backward on the
# training device, and read off the SDPA op. torch.compile makes the same
# choice (it keeps SDPA as that ATen call), so this is the kernel that trains.
KERNEL_OPS = {"_scaled_dot_product_flash_attention": "flash",
              "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
              "_scaled_dot_product_efficient_attention": "efficient",
              "_scaled_dot_product_cudnn_attention": "cudnn",
              "_scaled_dot_product_fused_attention_overrideable": "fused (device-specific)"}


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def probe_sdpa_kernel(cfg: ModelConfig, batch: int, seq_len: int, device, precision: str,
                      backend: str = "auto", gqa: str = "native") -> str:
    """Train one block of the model for one step's forward+backward; name the SDPA kernel that ran."""
    from harness.precision import autocast_for

    model = build_model(cfg.replace(num_layers=1), sdpa_backend=backend, gqa=gqa).to(device)
    x = torch.randn(batch, seq_len, cfg.hidden_dim, device=device)
    cos, sin = model.rope_cos[:seq_len], model.rope_sin[:seq_len]
    with _OpRecorder() as recorder:
        with autocast_for(precision, device):
            out = model.layers[0](x, cos, sin)
        out.float().sum().backward()
    kernel = next((KERNEL_OPS[n] for n in recorder.names if n in KERNEL_OPS), "math")
    if getattr(torch.version, "hip", None) and kernel in ("flash", "efficient"):
        library = "AOTriton"  # ROCm's default; Composable Kernel when preferred
        preferred = getattr(torch.backends.cuda, "preferred_rocm_fa_library", None)
        if preferred is not None and "ck" in str(preferred()).lower():
            library = "CK"
        kernel = f"{kernel} ({library})"
    return kernel


def choose_sdpa(cfg: ModelConfig, batch: int, seq_len: int, device, precision: str,
                backend: str) -> tuple[str, str]:
    """(kernel that runs, gqa mode) for this run, or UsageError if `backend` cannot run."""
    if backend == "efficient" and cfg.num_kv_heads != cfg.num_heads:
        # Its dispatch check rejects grouped k/v heads, and training would stop inside SDPA.
        raise UsageError(f"--sdpa-backend efficient cannot run grouped kv heads (--num-kv-heads "
                         f"{cfg.num_kv_heads} < --num-heads {cfg.num_heads}): the memory-efficient "
                         f"kernel has no grouped-query support - use --sdpa-backend auto, flash or "
                         f"math, or --num-kv-heads {cfg.num_heads}")
    if cfg.num_kv_heads == cfg.num_heads:
        candidates = ["n/a (MHA)"]
    else:  # a kernel without enable_gqa support may still run on repeated k/v
        candidates = ["native", "repeat"] if NATIVE_GQA else ["repeat"]
    reason = "no kernel"
    for gqa in candidates:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return probe_sdpa_kernel(cfg, batch, seq_len, device, precision, backend, gqa), gqa
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as e:
            reason = _why_not(caught, e)
    raise UsageError(f"--sdpa-backend {backend} cannot run on {device_name(device)} with torch "
                     f"{torch.__version__} ({precision}, head_dim {cfg.head_dim}): {reason} "
                     f"- use --sdpa-backend auto")


def _why_not(caught_warnings, error) -> str:
    """PyTorch explains in warnings why it skipped each kernel; keep the informative lines."""
    lines = [str(w.message).split("(Triggered internally")[0].strip() for w in caught_warnings]
    lines = [s for s in lines if s and "not used because" not in s]
    return "; ".join(lines[:2])[:240] or str(error).splitlines()[0][:240]


# ---- command line (the switches' flags come from SPEC) ----------------------------
def preflight(args, run) -> dict:
    """Once, before training: the SDPA kernel that runs this very run, and the GQA mode."""
    s = run.settings
    kernel, gqa = choose_sdpa(s.model, s.batch_size, s.seq_len, run.device, run.precision,
                              args.sdpa_backend)
    return {"sdpa_kernel": kernel, "gqa": gqa}


def main(argv=None) -> int:
    return training.main(SPEC, build_model, argv=argv, preflight=preflight,
                         description="Version 4: V2's fusions with PyTorch SDPA (flash) attention.")


if __name__ == "__main__":
    sys.exit(main())
