"""Time each operation of a training step alone (forward + backward), at the
exact shapes of a config, to put *measured* points on the roofline.

Two implementations are timed where the workshop contrasts them: attention as
explicit maths (SDPA's math backend materialises the T x T scores like V1)
versus flash (SDPA's fused kernels, as V4), and RMSNorm as V1's pow/mean/rsqrt
versus `F.rms_norm`. Each time is a median of device-event timings after
warm-up (harness.measure.median_ms).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.measure import median_ms
from harness.config import PRECISIONS, ModelConfig
from harness.precision import configure_matmul_precision

from .ops import training_ops


def _fwd_bwd(make_inputs, forward):
    """A closure running forward + backward on fresh-gradient inputs."""
    inputs = make_inputs()

    def work():
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None
        out = forward(*inputs)
        out.backward(torch.ones_like(out) if out.dim() else None)
    return work


def _rand(*shape, dtype, device, grad=True):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


def _attention(explicit: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        if explicit:
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def benchmarks(cfg: ModelConfig, batch: int, seq: int, precision: str, device: torch.device):
    """(op name as in ops.training_ops, implementation, work closure) for every op."""
    from version1_baseline.tiny_llama_v1 import RMSNorm, apply_rope, rope_tables

    dt, n, d, f = PRECISIONS[precision].dtype, batch * seq, cfg.hidden_dim, cfg.ffn_dim
    h, hd, v = cfg.num_heads, cfg.head_dim, cfg.vocab_size
    r = lambda *s, dtype=dt, grad=True: _rand(*s, dtype=dtype, device=device, grad=grad)  # noqa: E731
    gemms = {"q_proj": (d, h * hd), "k_proj": (d, cfg.num_kv_heads * hd),
             "v_proj": (d, cfg.num_kv_heads * hd), "o_proj": (h * hd, d), "gate_proj": (d, f),
             "up_proj": (d, f), "down_proj": (f, d), "lm_head": (d, v)}
    out = [(name, "torch.matmul", _fwd_bwd(lambda k=k, m=m: (r(n, k), r(k, m)), torch.matmul))
           for name, (k, m) in gemms.items()]
    qkv = lambda: (r(batch, h, seq, hd), r(batch, h, seq, hd), r(batch, h, seq, hd))  # noqa: E731
    out.append(("attention (explicit T x T)", "SDPA math backend",
                _fwd_bwd(qkv, _attention(explicit=True))))
    out.append(("attention (flash, causal)", "SDPA fused backend",
                _fwd_bwd(qkv, _attention(explicit=False))))
    norm = RMSNorm(d, cfg.norm_eps).to(device)
    out.append(("rmsnorm", "V1 pow/mean/rsqrt", _fwd_bwd(lambda: (r(n, d, dtype=torch.float32),), norm)))
    weight = torch.ones(d, device=device, requires_grad=True)
    out.append(("rmsnorm", "F.rms_norm", _fwd_bwd(lambda: (r(n, d, dtype=torch.float32),),
                                                  lambda x: F.rms_norm(x, (d,), weight, cfg.norm_eps))))
    out.append(("swiglu silu(g)*u", "F.silu * up", _fwd_bwd(lambda: (r(n, f), r(n, f)),
                                                            lambda g, u: F.silu(g) * u)))
    cos, sin = rope_tables(hd, seq, cfg.rope_theta, device)
    heads = h + cfg.num_kv_heads
    out.append(("rope (q and k)", "V1 apply_rope", _fwd_bwd(lambda: (r(batch, heads, seq, hd),),
                                                           lambda x: apply_rope(x, cos, sin))))
    out.append(("residual add", "fp32 + activation", _fwd_bwd(
        lambda: (r(n, d, dtype=torch.float32), r(n, d)), lambda x, y: x + y)))
    targets = torch.randint(0, v, (n,), device=device)
    out.append(("cross-entropy", "F.cross_entropy(fp32)", _fwd_bwd(
        lambda: (r(n, v),), lambda logits: F.cross_entropy(logits.float(), targets))))
    out.append(("AdamW update", "torch.optim.AdamW", _adamw_work(cfg, device)))
    return out


def _adamw_work(cfg: ModelConfig, device):
    from harness.flops import total_params

    param = torch.zeros(total_params(cfg), device=device, requires_grad=True)
    param.grad = torch.randn_like(param)
    opt = torch.optim.AdamW([param], lr=1e-4, weight_decay=0.1,
                            **({"fused": True} if device.type == "cuda" else {"foreach": True}))
    return opt.step


def measure_ops(cfg: ModelConfig, batch: int, seq: int, precision: str = "bf16",
                device="cpu", warmup: int = 2, repeats: int = 5):
    """DataFrame of measured points: op, implementation, ms per call, FLOPs, bytes,
    intensity (analytic, for that implementation) and achieved TFLOP/s."""
    import pandas as pd

    device = torch.device(device)
    configure_matmul_precision(precision)
    table = pd.concat([training_ops(cfg, batch, seq, precision, "explicit"),
                       training_ops(cfg, batch, seq, precision, "flash")]).drop_duplicates("op")
    table = table.set_index("op")
    rows = []
    for op, impl, work in benchmarks(cfg, batch, seq, precision, device):
        ms = median_ms(device, work, warmup, repeats)
        row = table.loc[op]
        rows.append({"op": op, "implementation": impl, "category": row["category"],
                     "ms_per_call": ms, "flops_per_call": row["flops_per_call"],
                     "bytes_per_call": row["bytes_per_call"], "intensity": row["intensity"],
                     "achieved_tflops": row["flops_per_call"] / (ms / 1000) / 1e12,
                     "achieved_gbs": row["bytes_per_call"] / (ms / 1000) / 1e9})
    return pd.DataFrame(rows)
