"""Attention on the QKV GEMM's output, with that output's gradient written in one piece.

No new kernel: RoPE's and flash attention's kernels, launched so that the backward
needs no gathering. The model computes qkv = x @ W_qkv^T, (B, T, H + 2*H_kv, D),
and takes q, k, v as slices of it. Handed to autograd piece by piece (a RoPE, an
attention, slices and transposes), the backward then *assembles* the QKV gradient:
attention writes dq, dk, dv as tensors of their own, and autograd zero-fills a
QKV-shaped buffer per slice, copies each gradient into its place (transposing it
back to the (B, T, heads, D) layout) and adds the buffers up - several passes over
the largest activation gradient of the layer, every layer (torch.compile merges
them into about one, which still reads and writes it all).

Here one autograd step covers the three: the backward allocates the QKV gradient
once, the attention kernels store dv straight into its v slots (the kernels take
any strides), and the inverse RoPE kernel writes dq and dk into its q and k slots.
Nothing is gathered afterwards.

    qkv_attention(qkv, cos, sin, n_heads)  ==  attention(rope(q), rope(k), v)
        with q, k, v = qkv.split([H, H_kv, H_kv], dim=2), each seen as (B, heads, T, D)

The backward needs the rotated q and k. Kept from the forward they cost a copy of q and k
per layer until the backward; with recompute_rope the backward rotates them again from
qkv (kept anyway, for v): memory for one more RoPE kernel per layer (--recompute-rope).
Under torch.compile that rotation must stay in the backward, which takes some doing: the
compiler splits one training step into a forward and a backward graph, and a computation
that needs nothing of the backward (the rotation needs only qkv and the tables) it is free
to run in the forward and keep its output - here, the very copy recompute_rope exists to
drop. A RoPE operator of its own in the backward is even merged with the forward's identical
call. So the recomputing backward is one operator, `qkv_attention_backward_rotating`, that
takes the output's gradient and rotates q and k inside, and it is opaque to the compiler (a
custom_op, not a triton_op: the compiler would trace into a triton_op and find the rotation
standing alone again). Under CUDA graphs its launches are captured like the rest.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.utils.flop_counter

from . import common
from .flash_attention import _backward_flops, attention_forward, forward_operator, traced_operator
from .flash_attention_backward import attention_backward_into
from .rope import _rope_op, rope_forward, rope_into


def _split(qkv: torch.Tensor, qk: torch.Tensor, n_heads: int):
    """q and k (rotated, from qk) and v (from qkv), each a (B, heads, T, D) view."""
    H, H_kv = n_heads, qk.shape[2] - n_heads
    return (qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2),
            qkv[:, :, H + H_kv:].transpose(1, 2))


def qkv_attention_backward(grad_o: torch.Tensor, qkv: torch.Tensor, qk: torch.Tensor,
                           o: torch.Tensor, lse: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, n_heads: int, sm_scale: float) -> torch.Tensor:
    """The gradient of qkv (B, T, H + 2*H_kv, D), written in place by the kernels:
    dv by attention's dK/dV kernel, dq and dk by the inverse rotation of theirs."""
    return _backward(grad_o, qkv, qk, o, lse, cos, sin, n_heads, sm_scale,
                     _split(qkv, qk, n_heads))


def qkv_attention_backward_rotating(grad_o: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor,
                                    lse: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                    n_heads: int, sm_scale: float) -> torch.Tensor:
    """qkv_attention_backward with q and k rotated again from qkv first (recompute_rope)."""
    return qkv_attention_backward(grad_o, qkv, _rotate(qkv, cos, sin, n_heads), o, lse, cos,
                                  sin, n_heads, sm_scale)


def _backward(grad_o, qkv, qk, o, lse, cos, sin, n_heads: int, sm_scale: float, views: tuple):
    """qkv_attention_backward given the q, k, v views (the forward keeps its own: each new
    view is one more dispatch the host pays)."""
    H, H_kv = n_heads, qk.shape[2] - n_heads
    d_qkv = common.empty(qkv.shape, qkv.dtype, qkv.device)
    d_qk = common.empty(qk.shape, qk.dtype, qk.device)  # the rotated q's and k's gradient
    # Each kernel gets a whole tensor and the first head of its slot in it.
    attention_backward_into(grad_o, *views, o, lse, sm_scale, (d_qk, 0), (d_qk, H),
                            (d_qkv, H + H_kv))
    rope_into(d_qk, cos, sin, d_qkv, inverse=True)  # into d_qkv's first H + H_kv heads
    return d_qkv


_backward_op = common.define_op(
    "qkv_attention_backward", qkv_attention_backward,
    lambda grad_o, qkv, qk, o, lse, cos, sin, n_heads, sm_scale: common.empty(
        qkv.shape, qkv.dtype, qkv.device))
_hopper_backward_op = common.define_op(  # opaque: flash_attention.py says why
    "qkv_attention_backward_hopper", qkv_attention_backward,
    lambda grad_o, qkv, qk, o, lse, cos, sin, n_heads, sm_scale: common.empty(
        qkv.shape, qkv.dtype, qkv.device), opaque=True)
_rotating_backward_op = common.define_op(  # opaque: see the top of this file
    "qkv_attention_backward_rotating", qkv_attention_backward_rotating,
    lambda grad_o, qkv, o, lse, cos, sin, n_heads, sm_scale: common.empty(
        qkv.shape, qkv.dtype, qkv.device), opaque=True)


def _qkv_backward_flops(grad_shape, qkv_shape, qk_shape, o_shape=None, lse_shape=None,
                        cos_shape=None, sin_shape=None, n_heads=None, sm_scale=None, *,
                        out_shape=None, **kwargs) -> int:
    B, T, _, D = qkv_shape  # attention's backward, counted as flash_attention.py counts it
    return _backward_flops(grad_shape, (B, n_heads, T, D), (B, qk_shape[2] - n_heads, T, D))


def _rotating_backward_flops(grad_shape, qkv_shape, o_shape=None, lse_shape=None, cos_shape=None,
                             sin_shape=None, n_heads=None, sm_scale=None, **kwargs) -> int:
    B, T, heads, D = qkv_shape  # attention's backward; the rotation adds no matrix FLOPs
    return _backward_flops(grad_shape, (B, n_heads, T, D), (B, (heads - n_heads) // 2, T, D))


for _op in (getattr(torch.ops, common.LIBRARY).qkv_attention_backward,
            getattr(torch.ops, common.LIBRARY).qkv_attention_backward_hopper):
    torch.utils.flop_counter.register_flop_formula(_op)(_qkv_backward_flops)
torch.utils.flop_counter.register_flop_formula(
    getattr(torch.ops, common.LIBRARY).qkv_attention_backward_rotating)(_rotating_backward_flops)


def _rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The q and k heads of qkv rotated by RoPE in one kernel: (B, T, n_heads + H_kv, D),
    as QKVAttention's forward rotates them (for its backward, with recompute_rope)."""
    H_kv = (qkv.shape[2] - n_heads) // 2
    return rope_forward(qkv[:, :, :n_heads + H_kv], cos, sin, False)


class QKVAttention(torch.autograd.Function):
    """RoPE + causal flash attention on the QKV GEMM's output; the backward returns the
    QKV gradient as one tensor. Saves what its two parts would: the rotated q and k,
    qkv (for v), O and LSE - or, recomputing, all but the rotated q and k."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_heads: int, sm_scale: float, recompute_rope: bool):
        # _rotate's work inline: every frame of an eager call costs the host (test_common.py)
        operators = common.through_operators()
        H_kv = (qkv.shape[2] - n_heads) // 2
        qk = (_rope_op if operators else rope_forward)(qkv[:, :, :n_heads + H_kv], cos, sin, False)
        q, k, v = _split(qkv, qk, n_heads)
        o, lse = (forward_operator(q, k, v) if operators else attention_forward)(q, k, v, sm_scale)
        if recompute_rope:  # neither qk nor a view of it: the backward rotates them again
            ctx.save_for_backward(qkv, None, o, lse, cos, sin, None, None, v)
        else:
            ctx.save_for_backward(qkv, qk, o, lse, cos, sin, q, k, v)
        ctx.n_heads, ctx.sm_scale = n_heads, sm_scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        qkv, qk, o, lse, cos, sin, q, k, v = ctx.saved_tensors
        if common.through_operators():  # an operator takes tensors, not a tuple of views
            if qk is None:  # recompute_rope: the operator rotates them itself
                d_qkv = _rotating_backward_op(grad_o, qkv, o, lse, cos, sin, ctx.n_heads,
                                              ctx.sm_scale)
            else:
                op = traced_operator(q, k, v, _hopper_backward_op, _backward_op, backward=True)
                d_qkv = op(grad_o, qkv, qk, o, lse, cos, sin, ctx.n_heads, ctx.sm_scale)
            return d_qkv, None, None, None, None, None
        if qk is None:  # recompute_rope: q and k rotated again, as the forward rotated them
            qk = _rotate(qkv, cos, sin, ctx.n_heads)
            q, k, _ = _split(qkv, qk, ctx.n_heads)
        d_qkv = _backward(grad_o, qkv, qk, o, lse, cos, sin, ctx.n_heads, ctx.sm_scale, (q, k, v))
        return d_qkv, None, None, None, None, None


def qkv_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
                  sm_scale: Optional[float] = None, recompute_rope: bool = False) -> torch.Tensor:
    """Causal attention of the heads in qkv (B, T, H + 2*H_kv, D): the first n_heads are
    q, then H_kv of k, then H_kv of v; q and k are rotated by RoPE's tables cos, sin
    (>= T, D). Returns the (B, H, T, D) view of (B, T, H, D) memory that
    flash_attention returns; the gradient of qkv comes back as one tensor.
    recompute_rope: keep no rotated q and k for the backward, which rotates them again."""
    if qkv.dim() != 4 or qkv.shape[2] <= n_heads or (qkv.shape[2] - n_heads) % 2:
        raise ValueError(f"qkv_attention wants qkv (B, T, {n_heads} + 2 * kv_heads, D); "
                         f"got {tuple(qkv.shape)}")
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(qkv.shape[3])
    return common.apply(QKVAttention, qkv, cos, sin, n_heads, scale, recompute_rope)
