"""Which SDPA kernel trains this run? Version 4 asks before its first step.

SDPA is a dispatcher: it checks each fused kernel's constraints (GPU, dtype, head size,
strides, GQA...) and calls the first that fits, as an ATen op whose name says which family
it is. A TorchDispatchMode sees every ATen op that runs. So before training, one block of
the very model - same config, batch, sequence length and autocast precision - runs forward
and backward on the training device, and the SDPA op it called names the kernel.
torch.compile makes the same choice (it keeps SDPA as that ATen call), so this is the
kernel that trains. The model comes in as `build_model` (tiny_llama_v4.py's), so this file
imports nothing of it.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness import ModelConfig, UsageError
from harness.device import device_name
from harness.precision import autocast_for

# enable_gqa arrived in torch 2.5; before that version 4 repeats k/v like V2 does.
NATIVE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)

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


def probe_sdpa_kernel(build_model, cfg: ModelConfig, batch: int, seq_len: int, device,
                      precision: str, backend: str = "auto", gqa: str = "native") -> str:
    """Train one block of the model build_model makes (version 4's) for one step's forward +
    backward; name the SDPA kernel that ran."""
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


def choose_sdpa(build_model, cfg: ModelConfig, batch: int, seq_len: int, device, precision: str,
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
                return probe_sdpa_kernel(build_model, cfg, batch, seq_len, device, precision,
                                         backend, gqa), gqa
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
