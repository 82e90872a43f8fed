"""What the flash-attention kernels share (flash_attention.py runs the forward,
flash_attention_backward.py the two backward kernels): loading and storing tiles of
rows, RoPE on load, their launch configurations and the launchers' argument checks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import common, configs
from .configs import KernelSpec

MAX_HEAD_DIM = 128


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


# ---- what the launchers share --------------------------------------------------------
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
