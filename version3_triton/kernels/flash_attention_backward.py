"""Causal flash attention, backward: the dQ kernel and the dK/dV kernel, and the
launcher that runs them (flash_attention.py has the forward, the autograd.Function
and the operators; attention_tiles.py what both share; attention_rope.py a variant of
these kernels that rotates q and k by RoPE as it loads them)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import attention_hopper, common
from .attention_tiles import (_LOG2_E, DKDV, DQ, TUNING_KEY, _head_meta, _strides, _tf32,
                              load_qk, load_rows, store_dqk, store_rows)


# Backward. With S = scale * Q K^T, P = softmax(S), O = P V and dO given:
#   dV = P^T dO        dP = dO V^T        dS = P * (dP - delta)
#   dQ = scale * dS K  dK = scale * dS^T Q
# where delta_i = sum_j P_ij dP_ij = sum_d O_id dO_id (one number per row).
# P is *recomputed* from Q, K and the saved LSE: recomputing costs FLOPs,
# storing it would cost T^2 memory. Two kernels share the work without
# atomics: one program per query block accumulates dQ over every key block,
# and one program per key block accumulates dK, dV over every query block (and
# every query head of its GQA group). Why two kernels: dQ sums over keys, dK and
# dV over queries; one kernel doing both would have many programs adding into the
# same dQ rows at once (atomics: slower, and the sum order - the bits - would
# change from run to run). The dQ kernel runs first: it loads its
# rows of dO anyway, so it also computes their delta and stores it for the
# dK/dV kernel - no separate "preprocess" kernel (one launch less).
# q and k tiles are loaded by LOAD_QK and dQ, dK stored by STORE_DQK, as in the forward
# (attention_tiles.py): plain here; in attention_rope.py's variant they rotate the tiles
# exactly as the forward did (recomputing is cheaper than storing the rotated q and k),
# and unrotate the gradients.
@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qt, stride_dot, offs_n, offs_d, lo, hi, qk_scale, N_CTX, qk_args,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         LOAD_QK: tl.constexpr):
    """Add the contribution of query blocks [lo, hi) to one key block's dK, dV.

    Works on transposed tiles (keys along rows) so dK and dV come out as rows.
    Query rows past the sequence end load as zeros (dO = 0, delta = 0, LSE = 0),
    which makes their P^T dO and dS^T exactly zero: no extra mask is needed.
    """
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = LOAD_QK(q_base, stride_qt, offs_m, N_CTX, offs_d, qk_args, BLOCK_M, HEAD_DIM, BLOCK_D,
                    True)
        do = load_rows(do_base, stride_dot, offs_m, N_CTX, offs_d, HEAD_DIM, BLOCK_D, True)
        lse = tl.load(lse_base + offs_m, mask=offs_m < N_CTX, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_CTX, other=0.0)
        # Recompute P^T for this tile from the saved log-sum-exp.
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t = tl.exp2(qk_t * qk_scale - lse[None, :])
        if ON_DIAGONAL:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA,
                   stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                   stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                   stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
                   dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale, qk_scale, qk_args,
                   GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   LOAD_QK: tl.constexpr, STORE_DQK: tl.constexpr):
    """One program: one key block of one (batch, key/value head)."""
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_n = tl.program_id(0)  # low key blocks see the most queries and run first
    pid_bkv = tl.program_id(1)
    b = (pid_bkv // num_kv_heads).to(tl.int64)
    kv_h = pid_bkv % num_kv_heads
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # This key/value block stays in registers while every query block streams past.
    k = LOAD_QK(K + b * stride_kb + kv_h * stride_kh, stride_kt, offs_n, N_CTX, offs_d, qk_args,
                BLOCK_N, HEAD_DIM, BLOCK_D, True)
    v = load_rows(V + b * stride_vb + kv_h * stride_vh, stride_vt, offs_n, N_CTX, offs_d,
                  HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    diag = start_n * BLOCK_N
    num_heads = num_kv_heads * GROUP_SIZE
    for g in range(GROUP_SIZE):  # GQA: every query head that shares this K/V head
        h = kv_h * GROUP_SIZE + g
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        row0 = (b * num_heads + h) * N_CTX
        # Causal: only queries at or after this key block attend to it.
        # Stage 1: the diagonal block (mask on). Stage 2: every block below it.
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0,
                                      stride_qt, stride_dot, offs_n, offs_d,
                                      diag, tl.minimum(diag + BLOCK_N, N_CTX), qk_scale, N_CTX,
                                      qk_args, HEAD_DIM, BLOCK_D, BLOCK_M, True, DOT_PRECISION,
                                      LOAD_QK)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0,
                                      stride_qt, stride_dot, offs_n, offs_d,
                                      diag + BLOCK_N, N_CTX, qk_scale, N_CTX, qk_args,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, False, DOT_PRECISION, LOAD_QK)
    dk *= sm_scale  # the chain rule through S = scale * Q K^T
    # dK and dV may be heads of a larger tensor (the QKV gradient), from dk_head0 and dv_head0 on.
    STORE_DQK(DK + b * stride_dkb + (dk_head0 + kv_h) * stride_dkh, stride_dkt, dk, offs_n, N_CTX,
              offs_d, qk_args, BLOCK_N, HEAD_DIM, BLOCK_D)
    store_rows(DV + b * stride_dvb + (dv_head0 + kv_h) * stride_dvh, stride_dvt,
               dv.to(DV.dtype.element_ty), offs_n, N_CTX, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                          stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                          stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                          stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
                          dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale, qk_scale,
                          GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    """The dK/dV kernel: q and k tiles loaded as they are."""
    _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, stride_qb, stride_qh, stride_qt, stride_kb,
                   stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_dob, stride_doh,
                   stride_dot, stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh,
                   stride_dvt, dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale, qk_scale, (),
                   GROUP_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DOT_PRECISION, load_qk,
                   store_dqk)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt,
                       offs_m, offs_d, lo, hi, qk_scale, N_CTX, qk_args,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                       ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       LOAD_QK: tl.constexpr):
    """Add the contribution of key blocks [lo, hi) to one query block's dQ."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = LOAD_QK(k_base, stride_kt, cols, N_CTX, offs_d, qk_args, BLOCK_N, HEAD_DIM, BLOCK_D,
                    ON_DIAGONAL)
        v = load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        if ON_DIAGONAL:
            p = tl.where(offs_m[:, None] >= cols[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, O, DO, DQ, LSE, DELTA,
                 stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                 stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                 stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                 num_heads, N_CTX, sm_scale, qk_scale, qk_args,
                 GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 LOAD_QK: tl.constexpr, STORE_DQK: tl.constexpr):
    """One program: one query block of one (batch, head)."""
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # long rows first, as in the forward
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    kv_h = h // GROUP_SIZE
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = LOAD_QK(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d, qk_args,
                BLOCK_M, HEAD_DIM, BLOCK_D, True)
    do = load_rows(DO + b * stride_dob + h * stride_doh, stride_dot, offs_m, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + pid_bh * N_CTX + offs_m, mask=offs_m < N_CTX, other=0.0)
    o = load_rows(O + b * stride_ob + h * stride_oh, stride_ot, offs_m, N_CTX, offs_d,
                  HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # rows past the end: 0
    tl.store(DELTA + pid_bh * N_CTX + offs_m, delta, mask=offs_m < N_CTX)  # for dK/dV
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: the diagonal block (mask on). Stage 2: every key block left of it.
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX), qk_scale, N_CTX,
                            qk_args, HEAD_DIM, BLOCK_D, BLOCK_N, True, DOT_PRECISION, LOAD_QK)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, 0, diag, qk_scale, N_CTX, qk_args, HEAD_DIM, BLOCK_D,
                            BLOCK_N, False, DOT_PRECISION, LOAD_QK)
    dq *= sm_scale
    STORE_DQK(DQ + b * stride_dqb + h * stride_dqh, stride_dqt, dq, offs_m, N_CTX, offs_d, qk_args,
              BLOCK_M, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, O, DO, DQ, LSE, DELTA,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                        stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                        stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                        num_heads, N_CTX, sm_scale, qk_scale,
                        GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The dQ kernel: q and k tiles loaded as they are."""
    _attn_bwd_dq(Q, K, V, O, DO, DQ, LSE, DELTA, stride_qb, stride_qh, stride_qt, stride_kb,
                 stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_ob, stride_oh,
                 stride_ot, stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                 num_heads, N_CTX, sm_scale, qk_scale, (), GROUP_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M,
                 BLOCK_N, DOT_PRECISION, load_qk, store_dqk)


# ---- the backward launcher -----------------------------------------------------------------
def _grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    return common.empty_like(q), common.empty_like(k), common.empty_like(v)


DELTA_SLOT = 9  # where a backward's `named` tensors hold delta, which the launch allocates


def attention_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, sm_scale: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal flash attention backward: the dQ kernel, then the dK/dV kernel."""
    dq, dk, dv = _grads(q, k, v)
    # A call like an earlier one replays its two launches (common.py's launch plans). The
    # gradients' layouts follow from q's, k's and v's (_grads), so the plan key leaves them out.
    named = [grad_o, q, k, v, o, lse, dq, dk, dv, None]
    plan_key = common.plan_key("attn_bwd", named[:6], sm_scale, _tf32(q), attention_hopper.ENABLED)
    if (plan := common.PLANS.get(plan_key)) is not None:
        named[DELTA_SLOT] = common.empty_like(lse)
        if common.replay(plan, named):
            return dq, dk, dv
    if not _hopper_backward(plan_key, named, sm_scale, dq, dk, dv):
        launch_backward((_attn_bwd_dq_kernel, _attn_bwd_dkdv_kernel), plan_key, named, sm_scale,
                        dq, dk, dv)
    return dq, dk, dv


def _grad_slot(grad, like: torch.Tensor) -> tuple:
    """Where a kernel writes the gradient of `like` (B, heads, T, D): (tensor, its batch /
    head / position strides, first head). `grad` is a tensor of like's shape, or a pair
    (qkv_like, head0): heads head0.. of a (B, T, all heads, D) tensor such as the QKV
    gradient. The pair hands the kernel the whole tensor, never a slice of it: under
    torch.compile a kernel that writes into a view costs copies (or worse)."""
    B, heads, T, D = like.shape
    if isinstance(grad, tuple):
        base, head0 = grad
        if (base.dim() != 4 or (base.shape[0], base.shape[1], base.shape[3]) != (B, T, D)
                or not 0 <= head0 <= base.shape[2] - heads or base.stride(-1) != 1):
            raise ValueError(f"no room for heads {head0}..{head0 + heads - 1} of a "
                             f"{tuple(like.shape)} gradient in a (B, T, heads, D) tensor of shape "
                             f"{tuple(base.shape)}")
        return base, (base.stride(0), base.stride(2), base.stride(1)), head0
    if grad.shape != like.shape or grad.stride(-1) != 1:
        raise ValueError(f"a gradient of shape {tuple(like.shape)} with a contiguous last dim "
                         f"was expected, got {tuple(grad.shape)}")
    return grad, _strides(grad), 0


def attention_backward_into(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, sm_scale: float,
                            dq, dk, dv) -> None:
    """attention_backward writing into given outputs: dq, dk and dv each a tensor of q's,
    k's, v's shape, or (qkv_like, head0) - see _grad_slot (qkv_attention.py uses it)."""
    # A call like an earlier one replays its two launches (common.py's launch plans): the
    # plan key holds every input's layout, each gradient slot's tensor and first head.
    slots = [g if isinstance(g, tuple) else (g, None) for g in (dq, dk, dv)]
    named = [grad_o, q, k, v, o, lse, *(tensor for tensor, _ in slots), None]
    plan_key = common.plan_key("attn_bwd_into", named[:-1], sm_scale, _tf32(q),
                               attention_hopper.ENABLED,
                               *(head0 for _, head0 in slots))
    if (plan := common.PLANS.get(plan_key)) is not None:
        named[DELTA_SLOT] = common.empty_like(lse)
        if common.replay(plan, named):
            return
    if not _hopper_backward(plan_key, named, sm_scale, dq, dk, dv):
        launch_backward((_attn_bwd_dq_kernel, _attn_bwd_dkdv_kernel), plan_key, named,
                        sm_scale, dq, dk, dv)


def _hopper_backward(plan_key, named: list, sm_scale: float, dq, dk, dv) -> bool:
    """attention_hopper.py's kernels where they run (Hopper, head size 64 or 128): True if they
    wrote the gradients (and recorded their plan). dq, dk, dv as launch_backward takes them."""
    grad_o, q, k, v, o, lse = named[:6]
    if grad_o.dtype != q.dtype or not attention_hopper.supported(q, k, v, backward=True):
        return False
    views = []  # each gradient as a (B, heads, T, D) tensor or a view at its first head
    for grad, like in ((dq, q), (dk, k), (dv, v)):
        tensor, _, head0 = _grad_slot(grad, like)
        views.append(tensor[:, :, head0:head0 + like.shape[1]].transpose(1, 2)
                     if isinstance(grad, tuple) else tensor)
    delta = named[DELTA_SLOT] = common.empty_like(lse)
    with common.recording(plan_key, named):
        return attention_hopper.backward(grad_o, q, k, v, o, lse, sm_scale, *views, delta)


def launch_backward(kernels: tuple, plan_key, named: list, sm_scale: float, dq, dk, dv,
                    extra: tuple = ()) -> None:
    """Launch the (dQ, dK/dV) `kernels`, this file's or a variant's (attention_rope.py), whose
    arguments after the plain kernels' are `extra` (tensors and their strides), and record
    their plan. named: [grad_o, q, k, v, o, lse, dq, dk, dv tensors, None (delta's place),
    the variant's tensors]."""
    grad_o, q, k, v = map(common.last_dim_contiguous, named[:4])
    o, lse = named[4:6]
    (B, H, T, D), H_kv = q.shape, k.shape[1]
    (dq, dq_strides, dq_head0), (dk, dk_strides, dk_head0), (dv, dv_strides, dv_head0) = (
        _grad_slot(g, t) for g, t in ((dq, q), (dk, k), (dv, v)))
    if dq_head0:  # the dQ kernel writes from head 0 (one argument fewer: its registers are tight)
        raise ValueError("dq's slot must start at head 0")
    if q.numel() == 0:
        return
    meta = _head_meta(q, k)
    # fp32, one per row like lse: written by the dQ kernel
    delta = named[DELTA_SLOT] = common.empty_like(lse)
    with common.recording(plan_key, named):
        common.launch(DQ, kernels[0], TUNING_KEY, lambda c: (common.cdiv(T, c["BLOCK_M"]), B * H),
                      q, k, v, o, grad_o, dq, lse, delta, *_strides(q), *_strides(k),
                      *_strides(v), *_strides(o), *_strides(grad_o), *dq_strides,
                      H, T, sm_scale, sm_scale * _LOG2_E, *extra, **meta)
        common.launch(DKDV, kernels[1], TUNING_KEY,
                      lambda c: (common.cdiv(T, c["BLOCK_N"]), B * H_kv),
                      q, k, v, grad_o, dk, dv, lse, delta, *_strides(q), *_strides(k),
                      *_strides(v), *_strides(grad_o), *dk_strides, *dv_strides,
                      dk_head0, dv_head0, H_kv, T, sm_scale, sm_scale * _LOG2_E, *extra, **meta)
