"""RoPE on load (`--rope-in-attention`): the attention kernels rotate q and k as they load
them, so the model needs no RoPE pass of its own, forward or backward. The plain kernels
(flash_attention.py, flash_attention_backward.py) call these functions only where their
compile-time switch ROTATE is on; without it nothing here is compiled into them.
"""
import torch
import triton
import triton.language as tl

from . import common
from .tiles import load_rows, store_rows


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
def load_rotated(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """The rotated [y1 | y2] (ROWS, 2 * BLOCK_HALF) of a q or k tile, each row by its
    position, behind the layout fence above."""
    tile = tl.zeros([ROWS, 2 * BLOCK_HALF], dtype=base.dtype.element_ty)
    for _ in range(0, tl.cast(n_rows > 0, tl.int32)):  # once: the layout fence above
        tile = _rotate(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS,
                       HEAD_DIM // 2, BLOCK_HALF, CHECK_ROWS)
    return tile


@triton.jit
def store_unrotated(base, stride, grad, rows, n_rows, COS, SIN, stride_table,
                    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Store dQ or dK given `grad` = [dy1 | dy2], the fp32 gradient with respect to the
    rotated tile: what is stored is the gradient with respect to the tile the model passed
    in, the transposed rotation."""
    HALF: tl.constexpr = HEAD_DIM // 2
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


# ---- the launchers' side -------------------------------------------------------------
def check_tables(q: torch.Tensor, cos, sin) -> None:
    """RoPE's tables as the kernels read them: both or neither, (>= T, head_dim) on q's device."""
    if (cos is None) != (sin is None):
        raise ValueError("flash_attention wants both RoPE tables (cos and sin) or neither")
    if cos is None:
        return
    T, D = q.shape[2:]
    if (D % 2 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] < T
            or cos.shape[1] != D):
        raise ValueError(f"flash_attention's RoPE wants an even head_dim and tables "
                         f"(>= T, head_dim) = (>= {T}, {D}); got cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)}")
    if cos.device != q.device or sin.device != q.device:
        raise ValueError(f"RoPE tables on {cos.device}/{sin.device}, q on {q.device}")


def tables(q, cos, sin) -> tuple:
    """(COS, SIN, stride_table) for the kernels. Without tables q stands in for both
    pointers: with ROTATE off the kernels never read them."""
    if cos is None:
        return q, q, 0
    cos, sin = common.last_dim_contiguous(cos), common.last_dim_contiguous(sin)
    if cos.stride(0) != sin.stride(0):  # one row stride serves both
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, cos.stride(0)
