"""RoPE on load (`--rope-in-attention`): flash attention whose kernels rotate q and k as they
load them, so the model needs no RoPE pass of its own, forward or backward. A variant of
flash_attention.py and flash_attention_backward.py: the same kernels, handed the functions
below to load q and k tiles and store their gradients; its own launchers, operators and
autograd.Function around them.

    flash_attention_rope(q, k, v, cos, sin)  ==  flash_attention(rope(q), rope(k), v)
        (rope as rope.py applies it on the (B, T, heads, D) layout)
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import common
from .attention_tiles import _check_inputs, _tf32, load_rows, store_rows
from .flash_attention import _attn_fwd, _backward_flops, _forward_flops, _outputs, launch_forward
from .flash_attention_backward import (DELTA_SLOT, _attn_bwd_dkdv, _attn_bwd_dq, _grads,
                                       launch_backward)


# RoPE on load. The model rotates q and k by their position before attention
# (rope.py): as a kernel of its own that costs one read and one write of q and k
# forward, and the same again for their gradients backward. Every q and k tile
# passes through registers here anyway, so the kernels rotate a tile right after
# loading it: the attention kernels take the functions that load q and k tiles and store
# their gradients as compile-time arguments (attention_tiles.py), and the kernels below are
# the plain ones handed the three functions here, with RoPE's tables as their arguments.
#
# RoPE pairs channel i with channel i + D/2. The two halves of each row are loaded
# as tiles of their own, (rows, D/2), rotated in fp32 and cast back to the input
# dtype for the matrix units - exactly the values rope.py would have stored:
#     y1 = x1*cos - x2*sin,   y2 = x2*cos + x1*sin    (cos, sin of the row's position)
# then joined side by side into one (rows, D) tile [y1 | y2]. From there on a
# rotated tile is just a tile: every tl.dot is the one of the plain kernels.
#
# A layout fence. Triton's layout optimiser moves a tile's conversion into the
# register layout of a tl.dot operand as far up as it can: through the rotation's
# arithmetic, right behind the loads. For a dot's second operand that layout gives
# every warp the whole tile, so the fp32 halves and tables take up to num_warps
# times the registers, and a tile that feeds two dots (k in the dQ kernel, q in the
# dK/dV kernel) is rotated twice, once per layout: many configurations then spill,
# on AMD and NVIDIA GPUs alike. The optimiser stops at the results of a loop, so
# the rotation runs inside a loop that runs exactly once (n_rows > 0, which the
# compiler cannot know): the tile is rotated once, in the layout it was loaded in,
# and converted when it is finished - as a loaded tile is. The trip count goes
# through tl.cast, so it is a tensor even where n_rows is a compile-time constant
# (Triton makes an integer argument equal to 1 one, e.g. a sequence of length 1).
#
# The backward's dQ and dK are then gradients with respect to the *rotated* q and
# k. The gradient with respect to what the model passed in is the transposed
# rotation (a rotation's inverse: the angle negated), applied once per program
# just before the store, to the accumulator split back into its halves:
#     dx1 = dy1*cos + dy2*sin,   dx2 = dy2*cos - dy1*sin.
# Each half is padded to BLOCK_HALF = BLOCK_D / 2 columns, as BLOCK_D pads a head whose
# size is not a power of two: the joined tile is as wide as a plain one.
@triton.jit
def _rotate(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """The tile base[rows, :2 * HALF] rotated by RoPE, as [y1 | y2] (ROWS, 2 * BLOCK_HALF)."""
    cols = tl.arange(0, BLOCK_HALF)
    x1 = load_rows(base, stride, rows, n_rows, cols, HALF, BLOCK_HALF, CHECK_ROWS)
    x2 = load_rows(base + HALF, stride, rows, n_rows, cols, HALF, BLOCK_HALF, CHECK_ROWS)
    # The tables are full width, (cos, cos) as version 2 builds them: read the first
    # half. Every head and batch shares them, so they stay in cache.
    cos = load_rows(COS, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF,
                    CHECK_ROWS).to(tl.float32)
    sin = load_rows(SIN, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF,
                    CHECK_ROWS).to(tl.float32)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    y1 = (x1f * cos - x2f * sin).to(x1.dtype)
    y2 = (x2f * cos + x1f * sin).to(x1.dtype)
    # (ROWS, BLOCK_HALF, 2) -> (ROWS, 2, BLOCK_HALF) -> (ROWS, 2 * BLOCK_HALF): [y1 | y2]
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), (ROWS, 2 * BLOCK_HALF))


@triton.jit
def load_rotated(base, stride, rows, n_rows, offs_d, qk_args, ROWS: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """LOAD_QK of the kernels below: the rotated [y1 | y2] (ROWS, BLOCK_D) of a q or k tile,
    each row by its position, behind the layout fence above. qk_args: (COS, SIN, their
    row stride)."""
    COS, SIN, stride_table = qk_args
    tile = tl.zeros([ROWS, BLOCK_D], dtype=base.dtype.element_ty)
    for _ in range(0, tl.cast(n_rows > 0, tl.int32)):  # once: the layout fence above
        tile = _rotate(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS,
                       HEAD_DIM // 2, BLOCK_D // 2, CHECK_ROWS)
    return tile


@triton.jit
def store_unrotated(base, stride, grad, rows, n_rows, offs_d, qk_args, ROWS: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """STORE_DQK of the kernels below: given `grad` = [dy1 | dy2], the fp32 gradient with
    respect to the rotated tile, store the gradient with respect to the tile the model
    passed in - the transposed rotation."""
    COS, SIN, stride_table = qk_args
    HALF: tl.constexpr = HEAD_DIM // 2
    BLOCK_HALF: tl.constexpr = BLOCK_D // 2
    cols = tl.arange(0, BLOCK_HALF)
    # (ROWS, 2 * BLOCK_HALF) -> (ROWS, 2, BLOCK_HALF) -> (ROWS, BLOCK_HALF, 2) -> halves
    dy1, dy2 = tl.split(tl.permute(tl.reshape(grad, (ROWS, 2, BLOCK_HALF)), (0, 2, 1)))
    cos = load_rows(COS, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF, True)
    sin = load_rows(SIN, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF, True)
    cos, sin = cos.to(tl.float32), sin.to(tl.float32)
    store_rows(base, stride, (dy1 * cos + dy2 * sin).to(base.dtype.element_ty), rows,
               n_rows, cols, HALF, BLOCK_HALF)
    store_rows(base + HALF, stride, (dy2 * cos - dy1 * sin).to(base.dtype.element_ty), rows,
               n_rows, cols, HALF, BLOCK_HALF)


# ---- the kernels: attention's, with the functions above ------------------------------------
# Each takes the plain kernel's arguments, then RoPE's tables and their row stride.
@triton.jit
def _attn_fwd_rope_kernel(Q, K, V, O, LSE, stride_qb, stride_qh, stride_qt, stride_kb,
                          stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_ob,
                          stride_oh, stride_ot, num_heads, N_CTX, qk_scale, COS, SIN, stride_table,
                          GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    _attn_fwd(Q, K, V, O, LSE, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
              stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, num_heads, N_CTX,
              qk_scale, (COS, SIN, stride_table), GROUP_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
              DOT_PRECISION, load_rotated)


@triton.jit
def _attn_bwd_dq_rope_kernel(Q, K, V, O, DO, DQ, LSE, DELTA,
                             stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                             stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                             stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh,
                             stride_dqt, num_heads, N_CTX, sm_scale, qk_scale, COS, SIN,
                             stride_table, GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             DOT_PRECISION: tl.constexpr):
    _attn_bwd_dq(Q, K, V, O, DO, DQ, LSE, DELTA, stride_qb, stride_qh, stride_qt, stride_kb,
                 stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_ob, stride_oh,
                 stride_ot, stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                 num_heads, N_CTX, sm_scale, qk_scale, (COS, SIN, stride_table), GROUP_SIZE,
                 HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DOT_PRECISION, load_rotated, store_unrotated)


@triton.jit
def _attn_bwd_dkdv_rope_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                               stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                               stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                               stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh,
                               stride_dvt, dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale,
                               qk_scale, COS, SIN, stride_table, GROUP_SIZE: tl.constexpr,
                               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               DOT_PRECISION: tl.constexpr):
    _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, stride_qb, stride_qh, stride_qt, stride_kb,
                   stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_dob, stride_doh,
                   stride_dot, stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh,
                   stride_dvt, dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale, qk_scale,
                   (COS, SIN, stride_table), GROUP_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                   DOT_PRECISION, load_rotated, store_unrotated)


# ---- the launchers ---------------------------------------------------------------------------
def check_tables(q: torch.Tensor, cos, sin) -> None:
    """RoPE's tables as the kernels read them: (>= T, head_dim) on q's device."""
    T, D = q.shape[2:]
    if (D % 2 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] < T
            or cos.shape[1] != D):
        raise ValueError(f"flash_attention_rope wants an even head_dim and tables "
                         f"(>= T, head_dim) = (>= {T}, {D}); got cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)}")
    if cos.device != q.device or sin.device != q.device:
        raise ValueError(f"RoPE tables on {cos.device}/{sin.device}, q on {q.device}")


def _tables(q, cos, sin) -> tuple:
    """(COS, SIN, their row stride): the kernels' last arguments."""
    check_tables(q, cos, sin)
    cos, sin = common.last_dim_contiguous(cos), common.last_dim_contiguous(sin)
    if cos.stride(0) != sin.stride(0):  # one row stride serves both
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, cos.stride(0)


def attention_rope_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
                           cos: torch.Tensor, sin: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attention.py's attention_forward, q and k rotated as they are loaded."""
    plan_key = common.plan_key("attn_fwd_rope", (q, k, v, cos, sin), sm_scale, _tf32(q))
    if (plan := common.PLANS.get(plan_key)) is not None:
        o, lse = _outputs(q)
        if common.replay(plan, (q, k, v, o, lse, cos, sin)):
            return o, lse
    _check_inputs(q, k, v)
    return launch_forward(_attn_fwd_rope_kernel, plan_key, q, k, v, sm_scale,
                          _tables(q, cos, sin))


def attention_rope_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, sm_scale: float,
                            cos: torch.Tensor, sin: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash_attention_backward.py's attention_backward: dq and dk are the gradients of
    the q and k *before* the rotation."""
    dq, dk, dv = _grads(q, k, v)
    named = [grad_o, q, k, v, o, lse, dq, dk, dv, None, cos, sin]
    # the gradients' layouts follow from q's, k's and v's, as in attention_backward
    plan_key = common.plan_key("attn_bwd_rope", (grad_o, q, k, v, o, lse, cos, sin), sm_scale,
                               _tf32(q))
    if (plan := common.PLANS.get(plan_key)) is not None:
        named[DELTA_SLOT] = common.empty_like(lse)
        if common.replay(plan, named):
            return dq, dk, dv
    launch_backward((_attn_bwd_dq_rope_kernel, _attn_bwd_dkdv_rope_kernel), plan_key, named,
                    sm_scale, dq, dk, dv, _tables(q, cos, sin))
    return dq, dk, dv


# ---- the operators and autograd ----------------------------------------------------------------
_forward_op = common.define_op("attention_rope_forward", attention_rope_forward,
                               lambda q, k, v, sm_scale, cos, sin: _outputs(q))
_backward_op = common.define_op(
    "attention_rope_backward", attention_rope_backward,
    lambda grad_o, q, k, v, o, lse, sm_scale, cos, sin: _grads(q, k, v))
_OPS = getattr(torch.ops, common.LIBRARY)
torch.utils.flop_counter.register_flop_formula(_OPS.attention_rope_forward)(_forward_flops)
torch.utils.flop_counter.register_flop_formula(_OPS.attention_rope_backward)(_backward_flops)


class FlashAttentionRoPE(torch.autograd.Function):
    """Causal attention of RoPE-rotated q and k; saves O, LSE and the tables, not the
    rotated q and k (the backward rotates them again as it loads them)."""

    @staticmethod
    def forward(ctx, q, k, v, cos, sin, sm_scale):
        forward = _forward_op if common.through_operators() else attention_rope_forward
        o, lse = forward(q, k, v, sm_scale, cos, sin)
        ctx.save_for_backward(q, k, v, o, lse, cos, sin)
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        backward = _backward_op if common.through_operators() else attention_rope_backward
        q, k, v, o, lse, cos, sin = ctx.saved_tensors
        return (*backward(grad_o, q, k, v, o, lse, ctx.sm_scale, cos, sin), None, None, None)


def flash_attention_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """flash_attention(rope(q), rope(k), v) without the RoPE kernel's reads and writes of q
    and k: the kernels rotate them (rope.py's maths) as they load them, and the gradients
    are those of the unrotated q, k. cos, sin: RoPE's tables, (>= T, D), full width
    (cos, cos) / (sin, sin) as version 2 builds them."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return common.apply(FlashAttentionRoPE, q, k, v, cos, sin, scale)
