"""Causal flash attention for Hopper (H100/H200, sm_90) in Gluon, at head sizes 64 and 128.

Why a second set of kernels: on Hopper, Triton's `tl.dot` kernels spill registers in every
backward tile at head size 128, and at 64 and 128 alike their forward cannot overlap the softmax
with the matrix units (`tl.dot` leaves each product's wait to the compiler). Gluon (Triton's
lower-level dialect) writes what `tl.dot` hides: each tile's register layout, TMA copies (the
tensor-memory accelerator moves a tile between global and shared memory by itself), and Hopper's
asynchronous `warpgroup_mma`, each wait placed by hand. Same maths and saved tensors (O, the
base-2 LSE) as flash_attention.py: the two paths mix freely.

    forward   a program per query block; Q once, K and V through a ring of STAGES slots;
              S_j+1 = Q K_j+1^T and P_j V_j in flight while the softmax of block j+1 runs.
    dQ        a program per query block, K and V streamed; stores delta = rowsum(O * dO).
    dK, dV    a program per key block, K and V held, Q and dO streamed over the query blocks
              below the diagonal (of each query head of the GQA group).

Each result tile leaves by TMA through the shared memory of an operand tile the program has
finished with. 64 x 64 tiles at 4 warps: two programs share an SM (~100 KB of shared memory
each), one's softmax running while the other's products do. Chosen where it pays (supported());
everywhere else flash_attention.py's kernels run.
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from . import common, configs, operators
from .target import INTERPRET

try:  # Gluon arrived in Triton 3.4 and its API still moves between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                                  tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # Triton 3.6 names the TMA copies async_copy_*, later releases async_load / async_store
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    AVAILABLE = True
except (ImportError, AttributeError):
    AVAILABLE = False

HEAD_DIMS = (64, 128)  # at 128 Triton's kernels spill; at 64 these are faster (V3's README)
BLOCK, FWD_STAGES, BWD_STAGES, WARPS = 64, 3, 2, 4
HOW = "Hopper kernel (Gluon, attention_hopper.py)"
ENABLED = True  # False: flash_attention.py's kernels everywhere (a failed build, portable())


@contextlib.contextmanager
def portable():
    """Inside: flash_attention.py's kernels everywhere (the Hopper path's "off" row)."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


_capability = functools.lru_cache(torch.cuda.get_device_capability)
_is_hopper = torch.compiler.assume_constant_result(  # a fact of the GPU: compiled, read once
    lambda index: _capability(index) == (9, 0))


def by_token(t: torch.Tensor, address: bool = True):
    """How TMA reads a (B, heads, T, D) tensor as 2D (rows, columns). True: (B, T, heads, D)
    memory, a row per token, its heads side by side (the model's q, k, v: slices of the QKV
    output); False: contiguous (B, heads, T, D), a row per head and position. None: neither, or
    an address TMA cannot read (16-byte aligned; `address=False` for a traced tensor)."""
    B, H, T, D = t.shape
    sb, sh, st, sd = t.stride()
    if sd != 1 or (address and t.data_ptr() % 16):
        return None
    if t.is_contiguous():
        return False
    return True if sh == D and st % 8 == 0 and st >= H * D and (B == 1 or sb == T * st) else None


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, traced: bool = False,
              backward: bool = False) -> bool:
    """Run the forward (backward) kernels? K and V in one layout (by_token), no forced tile for
    that direction's portable kernels (V3_ATTN_FWD_CONFIG; _BWD_DQ_, _BWD_DKDV_). Eager calls
    only: traced=True asks, while torch.compile traces, for the opaque operator that runs them."""
    if not (AVAILABLE and ENABLED and q.is_cuda) or INTERPRET or torch.version.hip:
        return False
    pins = configs.FORCED_CONFIGS
    pinned = ("attn_bwd_dq" in pins or "attn_bwd_dkdv" in pins) if backward else "attn_fwd" in pins
    if pinned or (not traced and (operators.IN_OPERATOR or torch.compiler.is_compiling())):
        return False
    B, H, T, D = q.shape
    if not (D in HEAD_DIMS and T % BLOCK == 0 and T > 0 and B * H > 0
            and q.dtype in (torch.bfloat16, torch.float16) and k.dtype == v.dtype == q.dtype
            and _is_hopper(q.device.index or 0)):
        return False
    layouts = [by_token(t, not traced) for t in (q, k, v)]
    return None not in layouts and layouts[1] == layouts[2]


if AVAILABLE:
    @gluon.jit
    def _load_pair(a_desc, b_desc, a_smem, b_smem, bars, row, col, slot, pred):
        """TMA: the tiles at (row, col) of K and V (or Q and dO) into ring slot `slot`."""
        bar = bars.index(slot)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        _tma_load(a_desc, [row, col], bar, a_smem.index(slot), pred=pred)
        _tma_load(b_desc, [row, col], bar, b_smem.index(slot), pred=pred)

    @gluon.jit
    def _query_block(n_heads, group):
        """This program's query block (longest first), (batch, head) row, batch, head, k/v head."""
        pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
        bh = gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)
        b, h = bh // n_heads, bh % n_heads
        return pid_m, bh, b, h, h // group

    @gluon.jit
    def _barriers(STAGES: gl.constexpr):
        """An mbarrier for the tiles loaded once, and one per ring slot."""
        once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ring = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(once, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ring.index(i), count=1)
        fence_async_shared()
        return once, ring

    @gluon.jit  # where head h's position 0 of batch b sits in by_token's 2D view
    def _row_col(b, h, n_heads, seq_len, BY_TOKEN: gl.constexpr, HEAD_D: gl.constexpr):
        if BY_TOKEN:
            return b * seq_len, h * HEAD_D
        else:
            return (b * n_heads + h) * seq_len, 0

    @gluon.jit
    def _store_tile(tile, smem, desc, row, col):
        """A result tile out by TMA through `smem`, a tile the program reads no more: one bulk
        copy, not each thread's few bytes a row (the caller waits: tma.store_wait)."""
        smem.store(tile)
        fence_async_shared()  # the threads' writes, visible to the TMA unit
        _tma_store(desc, [row, col], smem)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale, q_pos, kv_start, MASK: gl.constexpr,
                      BLOCK_N: gl.constexpr, mma: gl.constexpr):
        """The online softmax of one score tile: P, the new running max and sum, and the
        factor the accumulator is rescaled by."""
        if MASK:
            cols = kv_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
            s = gl.where(q_pos[:, None] >= cols[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, m_new, l_i * alpha + gl.sum(p, axis=1), alpha

    @gluon.jit
    def _attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, seq_len, n_heads, group, qk_scale,
                  Q_BY_TOKEN: gl.constexpr, KV_BY_TOKEN: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                  O_BY_TOKEN: gl.constexpr, num_warps: gl.constexpr):
        pid_m, bh, b, h, kv_h = _query_block(n_heads, group)
        dtype: gl.constexpr = q_desc.dtype
        # The score tile's layout is the one wgmma writes; P is fed back as its A operand
        mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, BLOCK_N, 16])
        o_mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, HEAD_D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_mma, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, mma)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar, bars = _barriers(STAGES)

        kv_row, kv_col = _row_col(b, kv_h, n_heads // group, seq_len, KV_BY_TOKEN, HEAD_D)
        q_row, q_col = _row_col(b, h, n_heads, seq_len, Q_BY_TOKEN, HEAD_D)  # and dO's
        n_blocks = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N  # up to the diagonal
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + pid_m * BLOCK_M, q_col], q_bar, q_smem)
        for i in gl.static_range(STAGES):  # the first blocks in flight
            _load_pair(k_desc, v_desc, k_smem, v_smem, bars, kv_row + i * BLOCK_N, kv_col,
                       i, i < n_blocks)

        q_pos = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_l)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_l)
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_l)
        acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_mma)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
        diag_from = pid_m * BLOCK_M // BLOCK_N  # the blocks that need the causal mask
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, q_pos, 0, 0 >= diag_from,
                                           BLOCK_N, mma)
        p = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(n_blocks - 1):
            # Issue S_j+1 = Q K_j+1^T, then P_j V_j; wait for S_j+1 only and run its softmax
            # while P_j V_j is still on the matrix units. Nothing but the softmax touches
            # registers of a product in flight (rescaling acc then would serialise them).
            nxt = (j + 1) % STAGES
            mbarrier.wait(bars.index(nxt), ((j + 1) // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            acc = warpgroup_mma(p, v_smem.index(j % STAGES), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, q_pos, (j + 1) * BLOCK_N,
                                               j + 1 >= diag_from, BLOCK_N, mma)
            p = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_mma))[:, None]
            ahead = j + STAGES  # block j's slot is free: both its products are done
            _load_pair(k_desc, v_desc, k_smem, v_smem, bars, kv_row + ahead * BLOCK_N, kv_col,
                       j % STAGES, ahead < n_blocks)
        acc = warpgroup_mma(p, v_smem.index((n_blocks - 1) % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))

        out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_mma))[:, None]
        o_row, o_col = _row_col(b, h, n_heads, seq_len, O_BY_TOKEN, HEAD_D)
        _store_tile(out.to(dtype), q_smem, o_desc, o_row + pid_m * BLOCK_M, o_col)
        gl.store(LSE + bh * seq_len + q_pos, m_i + gl.log2(l_i))
        tma.store_wait(0)

    @gluon.jit
    def _attn_bwd_dq(q_desc, k_desc, v_desc, do_desc, O, LSE, DELTA, dq_desc, so_b, so_h, so_t,
                     seq_len, n_heads, group, sm_scale, qk_scale, Q_BY_TOKEN: gl.constexpr,
                     KV_BY_TOKEN: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_D: gl.constexpr, STAGES: gl.constexpr, DQ_BY_TOKEN: gl.constexpr,
                     num_warps: gl.constexpr):
        pid_m, bh, b, h, kv_h = _query_block(n_heads, group)
        dtype: gl.constexpr = q_desc.dtype
        s_mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, BLOCK_N, 16])
        o_mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, HEAD_D, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_mma, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, s_mma)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
        q_bar, bars = _barriers(STAGES)

        kv_row, kv_col = _row_col(b, kv_h, n_heads // group, seq_len, KV_BY_TOKEN, HEAD_D)
        q_row, q_col = _row_col(b, h, n_heads, seq_len, Q_BY_TOKEN, HEAD_D)  # and dO's
        n_blocks = ((pid_m + 1) * BLOCK_M + BLOCK_N - 1) // BLOCK_N
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + pid_m * BLOCK_M, q_col], q_bar, q_smem)
        _tma_load(do_desc, [q_row + pid_m * BLOCK_M, q_col], q_bar, do_smem)
        for i in gl.static_range(STAGES - 1):
            _load_pair(k_desc, v_desc, k_smem, v_smem, bars, kv_row + i * BLOCK_N, kv_col,
                       i, i < n_blocks)

        # delta = rowsum(O * dO), while the first tiles load; the dK/dV kernel reads it
        rows_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        t_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_l))
        d_o = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, rows_l))
        o = gl.load(O + b.to(gl.int64) * so_b + h * so_h + t_o[:, None] * so_t + d_o[None, :])
        mbarrier.wait(q_bar, 0)
        do = do_smem.load(rows_l)
        delta = gl.convert_layout(gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1), row_l)
        q_pos = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_l)
        gl.store(DELTA + bh * seq_len + q_pos, delta)
        lse = gl.load(LSE + bh * seq_len + q_pos)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_mma)
        dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_mma)
        diag_from = pid_m * BLOCK_M // BLOCK_N
        for j in range(n_blocks):
            slot = j % STAGES
            ahead = j + STAGES - 1  # its slot was freed by the wait at the end of step j - 1
            _load_pair(k_desc, v_desc, k_smem, v_smem, bars, kv_row + ahead * BLOCK_N, kv_col,
                       ahead % STAGES, ahead < n_blocks)
            mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
            k_s = k_smem.index(slot)
            s = warpgroup_mma(q_smem, k_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), s_zero,
                               use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))  # dP = dO V^T runs beside the exponentials
            p = gl.exp2(s * qk_scale - lse[:, None])
            if j >= diag_from:
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_mma))
                p = gl.where(q_pos[:, None] >= cols[None, :], p, 0.0)
            dp = warpgroup_mma_wait(0, deps=(dp, ))
            ds = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
            dq = warpgroup_mma(ds, k_s, dq, is_async=True)
            dq = warpgroup_mma_wait(0, deps=(dq, ))

        dq_row, dq_col = _row_col(b, h, n_heads, seq_len, DQ_BY_TOKEN, HEAD_D)
        _store_tile((dq * sm_scale).to(dtype), q_smem, dq_desc, dq_row + pid_m * BLOCK_M, dq_col)
        tma.store_wait(0)

    @gluon.jit
    def _attn_bwd_dkdv(q_desc, k_desc, v_desc, do_desc, LSE, DELTA, dk_desc, dv_desc, seq_len,
                       n_heads, GROUP: gl.constexpr, sm_scale, qk_scale, Q_BY_TOKEN: gl.constexpr,
                       KV_BY_TOKEN: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HEAD_D: gl.constexpr, STAGES: gl.constexpr, DKV_BY_TOKEN: gl.constexpr,
                       num_warps: gl.constexpr):
        pid_n = gl.program_id(1)  # key block 0 sees every query block: the longest first
        bh_kv = gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)
        n_kv_heads = n_heads // GROUP
        b, kv_h = bh_kv // n_kv_heads, bh_kv % n_kv_heads
        n0 = pid_n * BLOCK_N
        dtype: gl.constexpr = k_desc.dtype
        # dK and dV are (keys, D): here the score tiles are transposed, S^T = K Q^T
        s_mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, BLOCK_M, 16])
        o_mma: gl.constexpr = gl.NVMMADistributedLayout([3, 0], [num_warps, 1], [16, HEAD_D, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_mma, k_width=2)
        col_l: gl.constexpr = gl.SliceLayout(0, s_mma)  # along the query positions of S^T

        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_D], v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_D], do_desc.layout)
        kv_bar, bars = _barriers(STAGES)

        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        kv_row, kv_col = _row_col(b, kv_h, n_kv_heads, seq_len, KV_BY_TOKEN, HEAD_D)
        _tma_load(k_desc, [kv_row + n0, kv_col], kv_bar, k_smem)
        _tma_load(v_desc, [kv_row + n0, kv_col], kv_bar, v_smem)
        # Steps: each query head of the group, each query block from the diagonal down
        first = n0 // BLOCK_M
        per_head = seq_len // BLOCK_M - first
        kv_pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_mma))
        s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_mma)
        dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=o_mma)
        dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, layout=o_mma)
        inv_scale = 1.0 / qk_scale
        mbarrier.wait(kv_bar, 0)
        for g in gl.static_range(GROUP):  # every query head that reads these K, V (GQA)
            h = kv_h * GROUP + g
            q_row, q_col = _row_col(b, h, n_heads, seq_len, Q_BY_TOKEN, HEAD_D)  # and dO's
            q_row += first * BLOCK_M
            lse_rows = (b * n_heads + h) * seq_len
            done = g * per_head  # the steps before: the ring's slots and phases go on
            for i in gl.static_range(STAGES - 1):
                _load_pair(q_desc, do_desc, q_smem, do_smem, bars, q_row + i * BLOCK_M, q_col,
                           (done + i) % STAGES, i < per_head)
            for j in range(per_head):
                slot = (done + j) % STAGES
                ahead = j + STAGES - 1  # its slot was freed by the wait ending step j - 1
                _load_pair(q_desc, do_desc, q_smem, do_smem, bars, q_row + ahead * BLOCK_M,
                           q_col, (done + ahead) % STAGES, ahead < per_head)
                mbarrier.wait(bars.index(slot), ((done + j) // STAGES) & 1)
                q_s, do_s = q_smem.index(slot), do_smem.index(slot)
                # The accumulators start at -LSE / scale and -delta: the products come out
                # as the exponent and dP^T - delta, and no row vector stays live beside them
                q_pos = (first + j) * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_l)
                lse = gl.load(LSE + lse_rows + q_pos) * inv_scale
                st = warpgroup_mma(k_smem, q_s.permute((1, 0)), s_zero - lse[None, :],
                                   is_async=True)
                delta = gl.load(DELTA + lse_rows + q_pos)
                dpt = warpgroup_mma(v_smem, do_s.permute((1, 0)), s_zero - delta[None, :],
                                    is_async=True)
                st = warpgroup_mma_wait(1, deps=(st, ))  # dP^T runs beside the exponentials
                pt = gl.exp2(st * qk_scale)
                if j < (BLOCK_N + BLOCK_M - 1) // BLOCK_M:  # the block crosses the diagonal
                    pt = gl.where(q_pos[None, :] >= kv_pos[:, None], pt, 0.0)
                dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do_s, dv,
                                   is_async=True)
                dpt = warpgroup_mma_wait(1, deps=(dpt, ))
                dst = gl.convert_layout((pt * dpt).to(dtype), a_layout)
                dk = warpgroup_mma(dst, q_s, dk, is_async=True)
                dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))

        d_row, d_col = _row_col(b, kv_h, n_kv_heads, seq_len, DKV_BY_TOKEN, HEAD_D)
        _store_tile((dk * sm_scale).to(dtype), k_smem, dk_desc, d_row + n0, d_col)
        _store_tile(dv.to(dtype), v_smem, dv_desc, d_row + n0, d_col)
        tma.store_wait(0)


# ---- launchers ---------------------------------------------------------------------------
_LOG2_E = 1.4426950408889634
# The launch order (_grid): SET_HEADS kv heads at a time, the longest blocks of the set first, so
# its K and V (8 MiB at 2k tokens) stay in L2 while its programs read them: on an H200 faster than
# one head after another at every shape tried, and than sets of 16 or 32 at most.
SET_HEADS = 8


def _grid(n_kv: int, T: int, group: int) -> tuple:
    """(query heads of a set, blocks, sets): a set the most kv heads dividing n_kv, <= SET_HEADS."""
    size = max(d for d in range(1, min(n_kv, SET_HEADS) + 1) if n_kv % d == 0)
    return (size * group, T // BLOCK, n_kv // size)


def _descriptor(t: torch.Tensor, token: bool, rows: int = BLOCK):
    """A TMA descriptor that moves (rows, D) tiles of t's 2D view, by_token(t) being `token`."""
    B, H, T, D = t.shape
    shape, stride = ((B * T, H * D), t.stride(2)) if token else ((B * H * T, D), D)
    return TensorDescriptor(t, list(shape), [stride, 1], [rows, D], _smem_layout(rows, D, t.dtype))


@functools.lru_cache(maxsize=None)  # Gluon works it out in ~16 us of Python, every call
def _smem_layout(rows: int, cols: int, dtype: torch.dtype):
    """The shared-memory layout (swizzle) a (rows, cols) tile lands in."""
    element = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([rows, cols], element)


def _launch(launches, stages: int) -> bool:
    """Run each (name, kernel, grid, arguments); False if Gluon cannot build them (warned once)."""
    global ENABLED
    config = dict(BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=WARPS, num_stages=stages)
    try:
        for name, kernel, grid, args in launches:
            common.launch_fixed(kernel, grid, args, (name, (HOW, config)), num_warps=WARPS)
    except Exception as err:  # noqa: BLE001 - any build failure means: use the other kernels
        ENABLED = False
        warnings.warn(f"V3 attention: the Hopper (Gluon) kernels did not build under this Triton "
                      f"({type(err).__name__}); using the portable Triton kernels")
        return False
    return True


def forward(q, k, v, o, lse, sm_scale: float) -> bool:
    """Write o and lse (B, H, T) fp32; False if the kernel did not build or TMA cannot write o."""
    (B, H, T, D), H_kv = q.shape, k.shape[1]
    q_token, kv_token, o_token = by_token(q), by_token(k), by_token(o)  # (v's is k's)
    if o_token is None:
        return False
    descriptors = [_descriptor(t, tok) for t, tok in
                   zip((q, k, v, o), (q_token, kv_token, kv_token, o_token))]
    return _launch([("attn_fwd", _attn_fwd, _grid(B * H_kv, T, H // H_kv), [
        *descriptors, lse, T, H, H // H_kv, sm_scale * _LOG2_E, q_token, kv_token, BLOCK, BLOCK,
        D, FWD_STAGES, o_token])], FWD_STAGES)


def backward(grad_o, q, k, v, o, lse, sm_scale: float, dq, dk, dv, delta) -> bool:
    """Write dq, dk, dv ((B, heads, T, D) tensors or views) and delta (lse's shape), the dQ
    kernel first: it stores delta for the dK/dV kernel. False if they did not build, or TMA
    cannot write the gradients (dk and dv in one layout)."""
    (B, H, T, D), H_kv = q.shape, k.shape[1]
    q_token, kv_token, dq_token, dkv_token = map(by_token, (q, k, dq, dk))
    if dq_token is None or dkv_token is None or by_token(dv) != dkv_token:
        return False
    if by_token(grad_o) != q_token:  # dO is read through Q's map: a copy in Q's layout
        grad_o = (grad_o.transpose(1, 2).contiguous().transpose(1, 2) if q_token
                  else grad_o.contiguous())
    descriptors = [_descriptor(t, tok) for t, tok in
                   zip((q, k, v, grad_o), (q_token, kv_token, kv_token, q_token))]
    shared = (T, H, H // H_kv, sm_scale, sm_scale * _LOG2_E, q_token, kv_token, BLOCK, BLOCK, D,
              BWD_STAGES)
    dq_args = [*descriptors, o, lse, delta, _descriptor(dq, dq_token), *o.stride()[:3], *shared,
               dq_token]
    dkdv_args = [*descriptors, lse, delta, *(_descriptor(t, dkv_token) for t in (dk, dv)), *shared,
                 dkv_token]
    return _launch([("attn_bwd_dq", _attn_bwd_dq, _grid(B * H_kv, T, H // H_kv), dq_args),
                    ("attn_bwd_dkdv", _attn_bwd_dkdv, _grid(B * H_kv, T, 1), dkdv_args)],
                   BWD_STAGES)
