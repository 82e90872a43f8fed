"""FLOPs and minimum bytes of every operation in one training step.

For the roofline each operation is a point at arithmetic intensity
I = FLOPs / bytes. *Minimum* bytes means each input is read once and each
output written once per kernel (a perfect cache would do no better); real
kernels move more, so real points sit at or left of these. Counts are per
training step (forward + backward), summed over all layers; `per_call` columns
give one instance (one layer).

Conventions (all stated in docs/ANALYSIS.md):
- GEMM Y = X W with X (M, K), W (K, N): forward 2MKN, backward 4MKN (dX and dW);
  three matmuls each reading two operands and writing one.
- Explicit attention computes the full T x T square (the mask is applied
  afterwards): 4 B H T^2 hd forward + 8 backward, and moves the score matrix
  11 times (forward: write S, read S, write P, read P; backward: read P, write
  dP, read P and dP, write dS, read dS twice).
- Flash attention uses the FlashAttention papers' convention (the harness's
  `attention_flops`): causal halves the work, backward is 2.5x forward;
  it moves only q, k, v, the output and their gradients.
- Elementwise FLOP counts are approximate (silu ~ 4 FLOPs per element, ...):
  what matters on a roofline is that they are a few FLOPs per byte.
"""
from __future__ import annotations

import pandas as pd

from harness import flops
from harness.config import PRECISIONS, ModelConfig


def _gemm(name, m, k, n, a, count):
    return {"op": name, "category": "gemm", "count": count, "shape": f"{m}x{k} @ {k}x{n}",
            "flops_per_call": 6 * m * k * n, "bytes_per_call": 3 * a * (m * k + k * n + m * n)}


def _attention(cfg: ModelConfig, batch: int, seq: int, a: int, kind: str):
    b, h, hkv, t, hd = batch, cfg.num_heads, cfg.num_kv_heads, seq, cfg.head_dim
    # q, k, v in; output out (forward); q, k, v, out, d_out in, dq, dk, dv out (backward)
    qkvo = b * t * hd * (h + 2 * hkv + h)
    linear = a * (qkvo + qkvo + b * t * hd * (h + 2 * hkv))
    shape = f"B{b} H{h} T{t} hd{hd}"
    if kind == "explicit":
        return {"op": "attention (explicit T x T)", "category": "attention", "count": cfg.num_layers,
                "shape": shape, "flops_per_call": 12 * b * h * t * t * hd,
                "bytes_per_call": linear + 11 * a * b * h * t * t}
    f = flops.attention_flops(batch, cfg.num_heads, seq, cfg.head_dim, causal=True)
    return {"op": "attention (flash, causal)", "category": "attention", "count": cfg.num_layers,
            "shape": shape, "flops_per_call": f["forward"] + f["backward"],
            "bytes_per_call": linear + 2 * 4 * b * h * t}  # + log-sum-exp written and read


def _elementwise(name, category, elements, flops_per_element, bytes_per_element, count, shape):
    return {"op": name, "category": category, "count": count, "shape": shape,
            "flops_per_call": flops_per_element * elements,
            "bytes_per_call": bytes_per_element * elements}


def training_ops(cfg: ModelConfig, batch: int, seq: int, precision: str = "bf16",
                 attention: str = "explicit", fused_qkv: bool = False,
                 fused_gate_up: bool = False, residual_in_norm: bool = False) -> pd.DataFrame:
    """One row per operation of a training step; FLOPs/bytes per call and per step.

    residual_in_norm: each residual add rides in the next norm's kernel (V3's add + RMSNorm):
    the sum h is written once beside the norm's output, and the backward adds the residual
    path's gradient as it goes, so the add's own reads and writes disappear."""
    if attention not in ("explicit", "flash"):
        raise ValueError(f"attention must be explicit or flash (got {attention!r})")
    a, n, d, f, L = PRECISIONS[precision].bytes, batch * seq, cfg.hidden_dim, cfg.ffn_dim, cfg.num_layers
    hd, h, hkv, v = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size
    rows = []
    if fused_qkv:
        rows.append(_gemm("qkv_proj", n, d, (h + 2 * hkv) * hd, a, L))
    else:
        rows += [_gemm("q_proj", n, d, h * hd, a, L), _gemm("k_proj", n, d, hkv * hd, a, L),
                 _gemm("v_proj", n, d, hkv * hd, a, L)]
    rows.append(_gemm("o_proj", n, h * hd, d, a, L))
    rows += ([_gemm("gate_up_proj", n, d, 2 * f, a, L)] if fused_gate_up else
             [_gemm("gate_proj", n, d, f, a, L), _gemm("up_proj", n, d, f, a, L)])
    rows += [_gemm("down_proj", n, f, d, a, L), _gemm("lm_head", n, d, v, a, 1),
             _attention(cfg, batch, seq, a, attention)]
    # RMSNorm: fp32 residual in, activation out; backward reads x and dy, writes dx.
    # Fused with the residual add before it (2L of the 2L + 1 norms; the first has no add):
    # forward reads x and delta, writes h and y; backward reads dy, the residual path's
    # gradient and h, writes the summed gradient (fp32) and the branch's copy of it (a).
    norm_bytes = (4 + a) + (4 + a + 4)
    if residual_in_norm:
        rows.append(_elementwise("residual add + rmsnorm", "norm", n * d, 4 + 8 + 2,
                                 (8 + 2 * a) + (12 + 2 * a), 2 * L, f"{n}x{d}"))
    rows.append(_elementwise("rmsnorm", "norm", n * d, 4 + 8, norm_bytes,
                             1 if residual_in_norm else 2 * L + 1, f"{n}x{d}"))
    rows.append(_elementwise("swiglu silu(g)*u", "elementwise", n * f, 6 + 10, 3 * a + 5 * a, L,
                             f"{n}x{f}"))
    rows.append(_elementwise("rope (q and k)", "elementwise", n * (h + hkv) * hd, 3 + 3, 2 * a + 2 * a,
                             L, f"{n}x{(h + hkv) * hd}"))
    if not residual_in_norm:
        rows.append(_elementwise("residual add", "elementwise", n * d, 1 + 1, (4 + a + 4) + 3 * 4,
                                 2 * L, f"{n}x{d}"))
    rows.append(_elementwise("cross-entropy", "elementwise", n * v, 5 + 3, 3 * a, 1, f"{n}x{v}"))
    p = flops.total_params(cfg)
    rows.append(_elementwise("AdamW update", "optimizer", p, 14, 7 * 4, 1, f"{p:,} params"))
    df = pd.DataFrame(rows)
    df["flops"] = df["flops_per_call"] * df["count"]
    df["bytes"] = df["bytes_per_call"] * df["count"]
    df["intensity"] = df["flops_per_call"] / df["bytes_per_call"]
    return df
