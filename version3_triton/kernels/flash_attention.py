"""Causal flash attention: the PyTorch reference, the forward kernel and its launcher,
the autograd.Function, the operator binding and the public function. The two backward
kernels are flash_attention_backward.py; the q/k tile loads and launch configurations both
share are attention_tiles.py. attention_rope.py is a variant: the same kernels, handed
loads that rotate q and k by RoPE.

softmax(Q K^T / sqrt(D) + causal mask) V, grouped-query heads, without ever writing
the T x T scores to memory: attention traffic and memory go from O(T^2) to O(T).
Tiles are *loaded* in the input precision (that is where the memory traffic is);
every sum, max and exp is fp32 (bf16's 8-bit mantissa would lose the small terms
of a softmax over 2048 keys); only the tiles that feed the matrix units are cast back.
"""
from __future__ import annotations

import math
import torch
import torch.utils.flop_counter
import triton
import triton.language as tl

from . import attention_hopper, common
from .attention_tiles import (_LOG2_E, FWD, TUNING_KEY, _check_inputs, _head_meta, _strides,
                              _tf32, load_qk, load_rows, store_rows)
from .flash_attention_backward import _grads, attention_backward


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The textbook maths of version 1: the (B, H, T, T) scores, written out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    T = q.shape[2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1, dtype=torch.float32)
    return probs.type_as(q) @ v


# Standard attention materialises S = Q K^T (T x T per head), softmaxes it and
# multiplies by V: O(T^2) memory traffic. Flash attention tiles Q into blocks of
# BLOCK_M rows and streams K and V past them in blocks of BLOCK_N rows. For each
# (query block, key block) pair the scores are computed in registers, folded
# into running softmax statistics, and thrown away.
#
# Online softmax: for a row with scores s_1..s_n, softmax needs the max m and
# the sum l = sum exp(s_j - m). Seeing keys block by block, keep a running
# (m, l, acc = sum exp(s_j - m) v_j). When a new block raises the max to m',
# the old terms were scaled by exp(-m) and must be scaled by exp(-m'):
# multiply l and acc by alpha = exp(m - m'). At the end O = acc / l.
# We also store LSE = m + log(l) per row: it is all the backward needs to
# rebuild P = exp(S - LSE) exactly, without storing P (T x T) in the forward.
#
# Implementation notes:
# - exp2 instead of exp: exp(x) = exp2(x * log2(e)). The scale 1/sqrt(D) and
#   log2(e) are folded into one multiplier, and LSE is kept in base-2 units.
# - Causal block skipping: query block i only needs key blocks 0..i. Blocks
#   strictly left of the diagonal need no mask at all; only the diagonal block
#   pays for the `row >= col` comparison. Hence two stages per kernel.
# - GQA: query head h reads key/value head h // GROUP_SIZE directly; the
#   repeated K/V of version 1 are never built.
# - Head sizes that are not a power of two (e.g. 96) are padded to BLOCK_D in
#   registers; the padded columns load as zeros and are never stored.
# - q and k tiles are loaded by LOAD_QK (attention_tiles.py): a plain load here, a
#   rotating one in attention_rope.py's variant of this kernel.
@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_d,
                    lo, hi, qk_scale, N_CTX, qk_args,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    LOAD_QK: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running softmax of one query block."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        # Off-diagonal key blocks lie entirely before this query block, so they
        # are in bounds; only the diagonal block can reach past the sequence end.
        k = LOAD_QK(k_base, stride_kt, cols, N_CTX, offs_d, qk_args, BLOCK_N, HEAD_DIM, BLOCK_D,
                    ON_DIAGONAL)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if ON_DIAGONAL:  # causal mask; it also hides keys past the sequence end
            qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        # P goes back to the input precision for the tensor cores; acc stays fp32.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
              stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, num_heads, N_CTX,
              qk_scale, qk_args, GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              DOT_PRECISION: tl.constexpr, LOAD_QK: tl.constexpr):
    """One program: one query block of one (batch, head)."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when torch.compile launches us (see RMSNorm)
    # Causal: the last query blocks see the most keys. Handing out the
    # blocks last-first starts the long programs early and shortens the tail.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)  # 64-bit offsets: big tensors overflow int32
    h = pid_bh % num_heads
    kv_h = h // GROUP_SIZE
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh

    q = LOAD_QK(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d, qk_args,
                BLOCK_M, HEAD_DIM, BLOCK_D, True)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: key blocks left of the diagonal - no masks.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, 0, diag, qk_scale, N_CTX, qk_args,
                                    HEAD_DIM, BLOCK_D, BLOCK_N, False, DOT_PRECISION, LOAD_QK)
    # Stage 2: the diagonal block, causal mask on. Every row keeps at least key
    # `diag` (<= its own index), so no row is all -inf and nothing becomes NaN.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX),
                                    qk_scale, N_CTX, qk_args, HEAD_DIM, BLOCK_D, BLOCK_N, True,
                                    DOT_PRECISION, LOAD_QK)
    o = acc / l_i[:, None]
    store_rows(O + b * stride_ob + h * stride_oh, stride_ot, o.to(O.dtype.element_ty), offs_m,
               N_CTX, offs_d, HEAD_DIM, BLOCK_D)
    tl.store(LSE + pid_bh * N_CTX + offs_m, m_i + tl.log2(l_i), mask=offs_m < N_CTX)


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, LSE, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh,
                     stride_kt, stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                     num_heads, N_CTX, qk_scale, GROUP_SIZE: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The forward kernel: q and k tiles loaded as they are."""
    _attn_fwd(Q, K, V, O, LSE, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
              stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, num_heads, N_CTX,
              qk_scale, (), GROUP_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DOT_PRECISION,
              load_qk)


# ---- the forward launcher ------------------------------------------------------------------
def _outputs(q: torch.Tensor):
    """O is (B, T, H, D) memory seen as (B, H, T, D): the model's reshape to (B, T, H*D)
    is free. Shared by the op and its fake, so both report the same strides."""
    B, H, T, D = q.shape
    o = common.empty_strided(q, (B, H, T, D), (T * H * D, D, H * D, 1))
    return o, common.empty_strided(q, (B, H, T), (H * T, T, 1), torch.float32)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal flash attention forward. Returns (o, lse); lse is in log2 units."""
    # A call like an earlier one replays its launch (common.py's launch plans), the Hopper
    # kernel's too; the Hopper switch is in the key, so a plan of the portable kernels stands
    # in for them only while they are off (attention_hopper.portable()).
    plan_key = common.plan_key("attn_fwd", (q, k, v), sm_scale, _tf32(q), attention_hopper.ENABLED)
    if (plan := common.PLANS.get(plan_key)) is not None:
        o, lse = _outputs(q)
        if common.replay(plan, (q, k, v, o, lse)):
            return o, lse
    _check_inputs(q, k, v)
    if attention_hopper.supported(q, k, v):  # Hopper at head size 64 or 128: Gluon
        o, lse = _outputs(q)
        with common.recording(plan_key, [q, k, v, o, lse]):
            done = attention_hopper.forward(q, k, v, o, lse, sm_scale)
        if done:
            return o, lse
    return launch_forward(_attn_fwd_kernel, plan_key, q, k, v, sm_scale)


def launch_forward(kernel, plan_key, q, k, v, sm_scale: float,
                   extra: tuple = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch `kernel`, this file's or a variant's (attention_rope.py), whose arguments
    after the plain kernel's are `extra` (tensors and their strides), and record its plan.
    The caller has checked q, k and v (_check_inputs)."""
    named = [q, k, v, None, None, *(t for t in extra if isinstance(t, torch.Tensor))]
    q, k, v = map(common.last_dim_contiguous, (q, k, v))
    B, H, T, D = q.shape
    o, lse = named[3:5] = _outputs(q)
    if o.numel():
        with common.recording(plan_key, named):
            common.launch(FWD, kernel, TUNING_KEY, lambda c: (common.cdiv(T, c["BLOCK_M"]), B * H),
                          q, k, v, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
                          H, T, sm_scale * _LOG2_E, *extra, **_head_meta(q, k))
    return o, lse


# ---- the operators, autograd and the FLOP count ------------------------------------------
_forward_op = common.define_op("attention_forward", attention_forward,
                               lambda q, k, v, sm_scale: _outputs(q))
_backward_op = common.define_op("attention_backward", attention_backward,
                                lambda grad_o, q, k, v, o, lse, sm_scale: _grads(q, k, v))
# The Hopper kernels (attention_hopper.py) under torch.compile: Inductor launches no Gluon
# kernel from its own code, so where they run, the traced step calls an opaque operator (a
# custom_op: one node, never traced) whose eager body picks them - and the portable kernels
# if the tensors it is given at run time do not suit them. CUDA graphs capture its launches.
_hopper_forward_op = common.define_op("attention_forward_hopper", attention_forward,
                                      lambda q, k, v, sm_scale: _outputs(q), opaque=True)
_hopper_backward_op = common.define_op("attention_backward_hopper", attention_backward,
                                       lambda grad_o, q, k, v, o, lse, sm_scale: _grads(q, k, v),
                                       opaque=True)


def traced_operator(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hopper_op, other_op,
                    backward: bool = False):
    """The operator a traced step (or a call inside eager_operators()) calls: the Hopper
    kernels' opaque one where they run, the traced one elsewhere."""
    return (hopper_op if attention_hopper.supported(q, k, v, traced=True, backward=backward)
            else other_op)


def forward_operator(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    return traced_operator(q, k, v, _hopper_forward_op, _forward_op)


class FlashAttention(torch.autograd.Function):
    """Causal softmax(Q K^T * scale) V with the Triton kernels; saves only O and LSE."""

    @staticmethod
    def forward(ctx, q, k, v, sm_scale):
        forward = forward_operator(q, k, v) if common.through_operators() else attention_forward
        o, lse = forward(q, k, v, sm_scale)
        # No T x T tensor: the backward recomputes the scores from q, k and LSE.
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        backward = attention_backward
        if common.through_operators():
            backward = traced_operator(*ctx.saved_tensors[:3], _hopper_backward_op, _backward_op,
                                       backward=True)
        return (*backward(grad_o, *ctx.saved_tensors, ctx.sm_scale), None)


# FlopCounterMode counts attention as PyTorch counts SDPA (4*B*H*Tq*Tk*D forward,
# no causal discount, backward 2.5x), so V3 and V4 report the same FLOPs. The same
# formulas count the RoPE-on-load variant's operators (attention_rope.py), whose extra
# arguments - the tables - they ignore: RoPE's multiplies are elementwise, and PyTorch
# counts none for version 2's RoPE either.
def _forward_flops(q_shape, k_shape, v_shape=None, sm_scale=None, cos_shape=None,
                   sin_shape=None, *, out_shape=None, **kwargs) -> int:
    b, h, t_q, d = q_shape
    return 4 * b * h * t_q * k_shape[2] * d


def _backward_flops(grad_shape, q_shape, k_shape, v_shape=None, o_shape=None, lse_shape=None,
                    sm_scale=None, cos_shape=None, sin_shape=None, *, out_shape=None,
                    **kwargs) -> int:
    return int(2.5 * _forward_flops(q_shape, k_shape))


_OPS = getattr(torch.ops, common.LIBRARY)
for _op, _flops in ((_OPS.attention_forward, _forward_flops),
                    (_OPS.attention_backward, _backward_flops),
                    (_OPS.attention_forward_hopper, _forward_flops),
                    (_OPS.attention_backward_hopper, _backward_flops)):
    torch.utils.flop_counter.register_flop_formula(_op)(_flops)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    sm_scale: float | None = None) -> torch.Tensor:
    """Causal attention. q: (B, H, T, D); k, v: (B, H_kv, T, D), H % H_kv == 0.

    Same result as F.scaled_dot_product_attention(q, k, v, is_causal=True,
    enable_gqa=True). The output is a (B, H, T, D) view of (B, T, H, D) memory.
    """
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return common.apply(FlashAttention, q, k, v, scale)
