"""Causal flash attention: the PyTorch reference, the forward kernel, the two
backward kernels, their launch configurations, the operator binding.

softmax(Q K^T / sqrt(D) + causal mask) V, grouped-query heads, without ever writing
the T x T scores to memory: attention traffic and memory go from O(T^2) to O(T).
Tiles are *loaded* in the input precision (that is where the memory traffic is);
every sum, max and exp is fp32 (bf16's 8-bit mantissa would lose the small terms
of a softmax over 2048 keys); only the tiles that feed the matrix units are cast back.

Given RoPE's tables, the kernels also rotate q and k as they load them (RoPE on
load, below): the model then needs no RoPE pass of its own, forward or backward.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.utils.flop_counter
import triton
import triton.language as tl

from . import common, configs
from .configs import KernelSpec

MAX_HEAD_DIM = 128


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
@triton.jit
def _load_rows(base, stride, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """Load the tile base[rows, cols] (rows `stride` apart, columns contiguous).

    Only what can run out of bounds is masked: rows past the sequence end when
    CHECK_ROWS, columns when the head size was padded to BLOCK_D. Both are
    compile-time constants, so an in-bounds tile is loaded with no mask at all.
    """
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if CHECK_ROWS:
        if BLOCK_D != HEAD_DIM:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if BLOCK_D != HEAD_DIM:
            tile = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_rows(base, stride, value, rows, n_rows, cols, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if BLOCK_D != HEAD_DIM:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)


# RoPE on load. The model rotates q and k by their position before attention
# (rope.py): as a kernel of its own that costs one read and one write of q and k
# forward, and the same again for their gradients backward. Every q and k tile
# passes through registers here anyway, so the kernels rotate a tile right after
# loading it. ROTATE is a compile-time switch: without tables the rotation is not
# compiled at all, and the kernels are exactly the plain ones.
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
# Each half is padded to BLOCK_HALF columns, as BLOCK_D pads a head whose size is
# not a power of two; BLOCK_HALF >= 16, the smallest depth tl.dot takes.
@triton.jit
def _load_rotated(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """The tile base[rows, :2 * HALF] rotated by RoPE, as [y1 | y2] (ROWS, 2 * BLOCK_HALF)."""
    cols = tl.arange(0, BLOCK_HALF)
    x1 = _load_rows(base, stride, rows, n_rows, cols, HALF, BLOCK_HALF, CHECK_ROWS)
    x2 = _load_rows(base + HALF, stride, rows, n_rows, cols, HALF, BLOCK_HALF, CHECK_ROWS)
    # The tables are full width, (cos, cos) as version 2 builds them: read the first
    # half. Every head and batch shares them, so they stay in cache.
    cos = _load_rows(COS, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF,
                     CHECK_ROWS).to(tl.float32)
    sin = _load_rows(SIN, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF,
                     CHECK_ROWS).to(tl.float32)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    y1 = (x1f * cos - x2f * sin).to(x1.dtype)
    y2 = (x2f * cos + x1f * sin).to(x1.dtype)
    # (ROWS, BLOCK_HALF, 2) -> (ROWS, 2, BLOCK_HALF) -> (ROWS, 2 * BLOCK_HALF): [y1 | y2]
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), (ROWS, 2 * BLOCK_HALF))


@triton.jit
def _load_qk(base, stride, rows, n_rows, offs_d, COS, SIN, stride_table,
             ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_HALF: tl.constexpr, CHECK_ROWS: tl.constexpr, ROTATE: tl.constexpr):
    """A q or k tile as the dots take it: (ROWS, BLOCK_D), or with ROTATE the
    rotated [y1 | y2] of (ROWS, 2 * BLOCK_HALF), each row by its position."""
    if ROTATE:
        tile = tl.zeros([ROWS, 2 * BLOCK_HALF], dtype=base.dtype.element_ty)
        for _ in range(0, tl.cast(n_rows > 0, tl.int32)):  # once: the layout fence above
            tile = _load_rotated(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS,
                                 HEAD_DIM // 2, BLOCK_HALF, CHECK_ROWS)
    else:
        tile = _load_rows(base, stride, rows, n_rows, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


@triton.jit
def _store_qk_grad(base, stride, grad, rows, n_rows, offs_d, COS, SIN, stride_table,
                   ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_HALF: tl.constexpr, ROTATE: tl.constexpr):
    """Store dQ or dK (fp32 `grad`). With ROTATE, `grad` is [dy1 | dy2], the gradient
    with respect to the rotated tile; what is stored is the gradient with respect to
    the tile the model passed in: the transposed rotation, in fp32."""
    if ROTATE:
        HALF: tl.constexpr = HEAD_DIM // 2
        cols = tl.arange(0, BLOCK_HALF)
        # (ROWS, 2 * BLOCK_HALF) -> (ROWS, 2, BLOCK_HALF) -> (ROWS, BLOCK_HALF, 2) -> halves
        dy1, dy2 = tl.split(tl.permute(tl.reshape(grad, (ROWS, 2, BLOCK_HALF)), (0, 2, 1)))
        cos = _load_rows(COS, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF, True)
        sin = _load_rows(SIN, stride_table, rows, n_rows, cols, HALF, BLOCK_HALF, True)
        cos, sin = cos.to(tl.float32), sin.to(tl.float32)
        _store_rows(base, stride, (dy1 * cos + dy2 * sin).to(base.dtype.element_ty), rows,
                    n_rows, cols, HALF, BLOCK_HALF)
        _store_rows(base + HALF, stride, (dy2 * cos - dy1 * sin).to(base.dtype.element_ty), rows,
                    n_rows, cols, HALF, BLOCK_HALF)
    else:
        _store_rows(base, stride, grad.to(base.dtype.element_ty), rows, n_rows, offs_d, HEAD_DIM,
                    BLOCK_D)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_d,
                    lo, hi, qk_scale, N_CTX, COS, SIN, stride_table,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    ROTATE: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running softmax of one query block."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        # Off-diagonal key blocks lie entirely before this query block, so they
        # are in bounds; only the diagonal block can reach past the sequence end.
        k = _load_qk(k_base, stride_kt, cols, N_CTX, offs_d, COS, SIN, stride_table, BLOCK_N,
                     HEAD_DIM, BLOCK_D, BLOCK_HALF, ON_DIAGONAL, ROTATE)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if ON_DIAGONAL:  # causal mask; it also hides keys past the sequence end
            qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        # P goes back to the input precision for the tensor cores; acc stays fp32.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, LSE, COS, SIN,
                     stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                     stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                     stride_table, num_heads, N_CTX, qk_scale,
                     GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     ROTATE: tl.constexpr, BLOCK_HALF: tl.constexpr):
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

    q = _load_qk(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d, COS, SIN,
                 stride_table, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_HALF, True, ROTATE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: key blocks left of the diagonal - no masks.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, 0, diag, qk_scale, N_CTX, COS, SIN,
                                    stride_table, HEAD_DIM, BLOCK_D, BLOCK_N, False,
                                    DOT_PRECISION, ROTATE, BLOCK_HALF)
    # Stage 2: the diagonal block, causal mask on. Every row keeps at least key
    # `diag` (<= its own index), so no row is all -inf and nothing becomes NaN.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX),
                                    qk_scale, N_CTX, COS, SIN, stride_table, HEAD_DIM, BLOCK_D,
                                    BLOCK_N, True, DOT_PRECISION, ROTATE, BLOCK_HALF)
    o = acc / l_i[:, None]
    _store_rows(O + b * stride_ob + h * stride_oh, stride_ot, o.to(O.dtype.element_ty), offs_m,
                N_CTX, offs_d, HEAD_DIM, BLOCK_D)
    tl.store(LSE + pid_bh * N_CTX + offs_m, m_i + tl.log2(l_i), mask=offs_m < N_CTX)


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
# With RoPE on load, both kernels rotate the q and k tiles they load exactly as the
# forward did (recomputing is cheaper than storing the rotated q and k), and the
# store of dQ and dK unrotates them.
@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qt, stride_dot, offs_n, offs_d, lo, hi, qk_scale, N_CTX,
                         COS, SIN, stride_table,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         ROTATE: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Add the contribution of query blocks [lo, hi) to one key block's dK, dV.

    Works on transposed tiles (keys along rows) so dK and dV come out as rows.
    Query rows past the sequence end load as zeros (dO = 0, delta = 0, LSE = 0),
    which makes their P^T dO and dS^T exactly zero: no extra mask is needed.
    """
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_qk(q_base, stride_qt, offs_m, N_CTX, offs_d, COS, SIN, stride_table, BLOCK_M,
                     HEAD_DIM, BLOCK_D, BLOCK_HALF, True, ROTATE)
        do = _load_rows(do_base, stride_dot, offs_m, N_CTX, offs_d, HEAD_DIM, BLOCK_D, True)
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
def _attn_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, COS, SIN,
                          stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                          stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                          stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
                          stride_table, dk_head0, dv_head0, num_kv_heads, N_CTX, sm_scale, qk_scale,
                          GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, ROTATE: tl.constexpr,
                          BLOCK_HALF: tl.constexpr):
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_n = tl.program_id(0)  # low key blocks see the most queries and run first
    pid_bkv = tl.program_id(1)
    b = (pid_bkv // num_kv_heads).to(tl.int64)
    kv_h = pid_bkv % num_kv_heads
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # This key/value block stays in registers while every query block streams past.
    k = _load_qk(K + b * stride_kb + kv_h * stride_kh, stride_kt, offs_n, N_CTX, offs_d, COS, SIN,
                 stride_table, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_HALF, True, ROTATE)
    v = _load_rows(V + b * stride_vb + kv_h * stride_vh, stride_vt, offs_n, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    if ROTATE:  # dK as wide as the rotated K: [dy1 | dy2]
        dk = tl.zeros([BLOCK_N, 2 * BLOCK_HALF], dtype=tl.float32)
    else:
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
                                      COS, SIN, stride_table, HEAD_DIM, BLOCK_D, BLOCK_M, True,
                                      DOT_PRECISION, ROTATE, BLOCK_HALF)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0,
                                      stride_qt, stride_dot, offs_n, offs_d,
                                      diag + BLOCK_N, N_CTX, qk_scale, N_CTX,
                                      COS, SIN, stride_table, HEAD_DIM, BLOCK_D, BLOCK_M, False,
                                      DOT_PRECISION, ROTATE, BLOCK_HALF)
    dk *= sm_scale  # the chain rule through S = scale * Q K^T
    # dK and dV may be heads of a larger tensor (the QKV gradient), from dk_head0 and dv_head0 on.
    _store_qk_grad(DK + b * stride_dkb + (dk_head0 + kv_h) * stride_dkh, stride_dkt, dk, offs_n,
                   N_CTX, offs_d, COS, SIN, stride_table, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_HALF,
                   ROTATE)
    _store_rows(DV + b * stride_dvb + (dv_head0 + kv_h) * stride_dvh, stride_dvt,
                dv.to(DV.dtype.element_ty), offs_n, N_CTX, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt,
                       offs_m, offs_d, lo, hi, qk_scale, N_CTX, COS, SIN, stride_table,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                       ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       ROTATE: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Add the contribution of key blocks [lo, hi) to one query block's dQ."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_qk(k_base, stride_kt, cols, N_CTX, offs_d, COS, SIN, stride_table, BLOCK_N,
                     HEAD_DIM, BLOCK_D, BLOCK_HALF, ON_DIAGONAL, ROTATE)
        v = _load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        if ON_DIAGONAL:
            p = tl.where(offs_m[:, None] >= cols[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, O, DO, DQ, LSE, DELTA, COS, SIN,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                        stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                        stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                        stride_table, num_heads, N_CTX, sm_scale, qk_scale,
                        GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        ROTATE: tl.constexpr, BLOCK_HALF: tl.constexpr):
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # long rows first, as in the forward
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    kv_h = h // GROUP_SIZE
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_qk(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d, COS, SIN,
                 stride_table, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_HALF, True, ROTATE)
    do = _load_rows(DO + b * stride_dob + h * stride_doh, stride_dot, offs_m, N_CTX, offs_d,
                    HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + pid_bh * N_CTX + offs_m, mask=offs_m < N_CTX, other=0.0)
    o = _load_rows(O + b * stride_ob + h * stride_oh, stride_ot, offs_m, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # rows past the end: 0
    tl.store(DELTA + pid_bh * N_CTX + offs_m, delta, mask=offs_m < N_CTX)  # for dK/dV
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    if ROTATE:  # dQ as wide as the rotated Q: [dy1 | dy2]
        dq = tl.zeros([BLOCK_M, 2 * BLOCK_HALF], dtype=tl.float32)
    else:
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: the diagonal block (mask on). Stage 2: every key block left of it.
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX), qk_scale, N_CTX,
                            COS, SIN, stride_table, HEAD_DIM, BLOCK_D, BLOCK_N, True,
                            DOT_PRECISION, ROTATE, BLOCK_HALF)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, 0, diag, qk_scale, N_CTX, COS, SIN, stride_table,
                            HEAD_DIM, BLOCK_D, BLOCK_N, False, DOT_PRECISION, ROTATE, BLOCK_HALF)
    dq *= sm_scale
    _store_qk_grad(DQ + b * stride_dqb + h * stride_dqh, stride_dqt, dq, offs_m, N_CTX, offs_d,
                   COS, SIN, stride_table, BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_HALF, ROTATE)


# ---- launch configurations ------------------------------------------------------------
def _spec(kernel: str) -> KernelSpec:
    # The rotating kernels ("rope") hold more registers: some head sizes have lists of their own.
    return KernelSpec(
        kernel, lambda target, width=None, variant=None: configs.attention_configs(
            kernel, target, width, variant),
        lambda config, width, elem_bytes: configs.attention_shared_bytes(kernel, config, width,
                                                                          elem_bytes),
        lambda args, constexprs: (constexprs["HEAD_DIM"], args["Q"].element_size(),
                                  "rope" if constexprs["ROTATE"] else None),
        configs.attention_block_check(kernel))


FWD, DKDV, DQ = (_spec(k) for k in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"))
configs.SPECS.update({s.name: s for s in (FWD, DKDV, DQ)})
# What the best tile depends on: sequence length, head size, GQA group, dtype
# (the autotuner adds the tensors' dtypes), RoPE on load or not - not batch or head count.
TUNING_KEY = ["N_CTX", "GROUP_SIZE", "HEAD_DIM", "DOT_PRECISION", "ROTATE"]


# ---- launchers ---------------------------------------------------------------------------
_LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))


def _check_inputs(q, k, v, cos=None, sin=None) -> None:
    common.check_device(q)
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"flash_attention wants q (B, H, T, D), k and v (B, H_kv, T, D); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {k.shape[1]}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q.shape[-1]} is not supported (1..{MAX_HEAD_DIM})")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if common.INTERPRET and q.dtype == torch.bfloat16:
        raise ValueError("Triton's CPU interpreter computes bf16 tl.dot wrongly: "
                         "use fp32 or fp16 on the CPU")
    if (cos is None) != (sin is None):
        raise ValueError("flash_attention wants both RoPE tables (cos and sin) or neither")
    if cos is not None:
        T, D = q.shape[2:]
        if (D % 2 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] < T
                or cos.shape[1] != D):
            raise ValueError(f"flash_attention's RoPE wants an even head_dim and tables "
                             f"(>= T, head_dim) = (>= {T}, {D}); got cos {tuple(cos.shape)}, "
                             f"sin {tuple(sin.shape)}")
        if cos.device != q.device or sin.device != q.device:
            raise ValueError(f"RoPE tables on {cos.device}/{sin.device}, q on {q.device}")


def _tables(q, cos, sin) -> tuple:
    """(COS, SIN, stride_table) for the kernels. Without tables q stands in for both
    pointers: with ROTATE off the kernels never read them."""
    if cos is None:
        return q, q, 0
    cos, sin = common.last_dim_contiguous(cos), common.last_dim_contiguous(sin)
    if cos.stride(0) != sin.stride(0):  # one row stride serves both
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, cos.stride(0)


def _outputs(q: torch.Tensor):
    """O is (B, T, H, D) memory seen as (B, H, T, D): the model's reshape to (B, T, H*D)
    is free. Shared by the op and its fake, so both report the same strides."""
    B, H, T, D = q.shape
    o = common.empty((B, T, H, D), q.dtype, q.device).transpose(1, 2)
    return o, common.empty((B, H, T), torch.float32, q.device)


def _grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    return tuple(common.empty(t.shape, t.dtype, t.device) for t in (q, k, v))


def _strides(t: torch.Tensor):
    return t.stride()[:3]  # batch, head, position (the head dim has stride 1)


def _head_meta(q, k, rotate: bool) -> dict:
    D = q.shape[-1]
    # fp32 inputs: true fp32 ('ieee') unless PyTorch allows TF32 for matmuls too.
    tf32 = (q.dtype == torch.float32 and common.backend() == "cuda"
            and torch.backends.cuda.matmul.allow_tf32)
    return dict(GROUP_SIZE=q.shape[1] // k.shape[1], HEAD_DIM=D,
                BLOCK_D=max(16, common.next_power_of_2(D)), DOT_PRECISION="tf32" if tf32 else "ieee",
                ROTATE=rotate, BLOCK_HALF=max(16, common.next_power_of_2(D // 2)))


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
                      cos: Optional[torch.Tensor] = None,
                      sin: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal flash attention forward. Returns (o, lse); lse is in log2 units.
    With RoPE tables cos, sin (>= T, D), q and k are rotated as they are loaded."""
    _check_inputs(q, k, v, cos, sin)
    q, k, v = map(common.last_dim_contiguous, (q, k, v))
    B, H, T, D = q.shape
    o, lse = _outputs(q)
    if o.numel():
        cos_, sin_, stride_table = _tables(q, cos, sin)
        common.launch(FWD, _attn_fwd_kernel, TUNING_KEY,
                      lambda c: (common.cdiv(T, c["BLOCK_M"]), B * H),
                      q, k, v, o, lse, cos_, sin_, *_strides(q), *_strides(k), *_strides(v),
                      *_strides(o), stride_table, H, T, sm_scale * _LOG2_E,
                      **_head_meta(q, k, cos is not None))
    return o, lse


def attention_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, sm_scale: float,
                       cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal flash attention backward: the dQ kernel, then the dK/dV kernel. With
    RoPE tables, dq and dk are the gradients of the q and k *before* the rotation."""
    dq, dk, dv = _grads(q, k, v)
    attention_backward_into(grad_o, q, k, v, o, lse, sm_scale, dq, dk, dv, cos, sin)
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
                            dq, dk, dv, cos: Optional[torch.Tensor] = None,
                            sin: Optional[torch.Tensor] = None) -> None:
    """attention_backward writing into given outputs: dq, dk and dv each a tensor of q's,
    k's, v's shape, or (qkv_like, head0) - see _grad_slot (qkv_attention.py uses it)."""
    grad_o, q, k, v = map(common.last_dim_contiguous, (grad_o, q, k, v))
    (B, H, T, D), H_kv = q.shape, k.shape[1]
    (dq, dq_strides, dq_head0), (dk, dk_strides, dk_head0), (dv, dv_strides, dv_head0) = (
        _grad_slot(g, t) for g, t in ((dq, q), (dk, k), (dv, v)))
    if dq_head0:  # the dQ kernel writes from head 0 (one argument fewer: its registers are tight)
        raise ValueError("dq's slot must start at head 0")
    if q.numel() == 0:
        return
    meta = _head_meta(q, k, cos is not None)
    cos, sin, stride_table = _tables(q, cos, sin)
    delta = common.empty(lse.shape, torch.float32, lse.device)  # written by the dQ kernel
    common.launch(DQ, _attn_bwd_dq_kernel, TUNING_KEY,
                  lambda c: (common.cdiv(T, c["BLOCK_M"]), B * H),
                  q, k, v, o, grad_o, dq, lse, delta, cos, sin, *_strides(q), *_strides(k),
                  *_strides(v), *_strides(o), *_strides(grad_o), *dq_strides, stride_table,
                  H, T, sm_scale, sm_scale * _LOG2_E, **meta)
    common.launch(DKDV, _attn_bwd_dkdv_kernel, TUNING_KEY,
                  lambda c: (common.cdiv(T, c["BLOCK_N"]), B * H_kv),
                  q, k, v, grad_o, dk, dv, lse, delta, cos, sin, *_strides(q), *_strides(k),
                  *_strides(v), *_strides(grad_o), *dk_strides, *dv_strides, stride_table,
                  dk_head0, dv_head0, H_kv, T, sm_scale, sm_scale * _LOG2_E, **meta)


# ---- the operators, autograd and the FLOP count ------------------------------------------
_forward_op = common.define_op("attention_forward", attention_forward,
                               lambda q, k, v, sm_scale, cos=None, sin=None: _outputs(q))
_backward_op = common.define_op(
    "attention_backward", attention_backward,
    lambda grad_o, q, k, v, o, lse, sm_scale, cos=None, sin=None: _grads(q, k, v))


class FlashAttention(torch.autograd.Function):
    """Causal softmax(Q K^T * scale) V with the Triton kernels, RoPE optionally applied
    to q and k on load; saves only O and LSE (and the tables)."""

    @staticmethod
    def forward(ctx, q, k, v, sm_scale, cos=None, sin=None):
        forward = _forward_op if common.through_operators() else attention_forward
        o, lse = forward(q, k, v, sm_scale, cos, sin)
        # No T x T tensor and no rotated q, k: the backward recomputes both.
        ctx.save_for_backward(q, k, v, o, lse, cos, sin)
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        backward = _backward_op if common.through_operators() else attention_backward
        q, k, v, o, lse, cos, sin = ctx.saved_tensors
        return (*backward(grad_o, q, k, v, o, lse, ctx.sm_scale, cos, sin), None, None, None)


# FlopCounterMode counts attention as PyTorch counts SDPA (4*B*H*Tq*Tk*D forward,
# no causal discount, backward 2.5x), so V3 and V4 report the same FLOPs. RoPE on
# load adds no count: its multiplies are elementwise, and PyTorch counts none for
# version 2's RoPE either.
def _forward_flops(q_shape, k_shape, v_shape=None, sm_scale=None, cos_shape=None,
                   sin_shape=None, *, out_shape=None, **kwargs) -> int:
    b, h, t_q, d = q_shape
    return 4 * b * h * t_q * k_shape[2] * d


def _backward_flops(grad_shape, q_shape, k_shape, v_shape=None, o_shape=None, lse_shape=None,
                    sm_scale=None, cos_shape=None, sin_shape=None, *, out_shape=None,
                    **kwargs) -> int:
    return int(2.5 * _forward_flops(q_shape, k_shape))


_OPS = getattr(torch.ops, common.LIBRARY)
torch.utils.flop_counter.register_flop_formula(_OPS.attention_forward)(_forward_flops)
torch.utils.flop_counter.register_flop_formula(_OPS.attention_backward)(_backward_flops)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    sm_scale: float | None = None, cos: torch.Tensor | None = None,
                    sin: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention. q: (B, H, T, D); k, v: (B, H_kv, T, D), H % H_kv == 0.

    Same result as F.scaled_dot_product_attention(q, k, v, is_causal=True,
    enable_gqa=True). The output is a (B, H, T, D) view of (B, T, H, D) memory.

    cos, sin: RoPE's tables, (>= T, D), full width (cos, cos) / (sin, sin) as
    version 2 builds them. Given, q and k are rotated inside the kernels (rope.py's
    maths) before attention, and their gradients are those of the unrotated q, k:
    flash_attention(q, k, v, cos=cos, sin=sin) computes what
    flash_attention(rope(q), rope(k), v) does (rope on the (B, T, heads, D) layout),
    without the RoPE kernel's reads and writes of q and k.
    """
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return FlashAttention.apply(q, k, v, scale, cos, sin)
