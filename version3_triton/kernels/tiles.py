"""Loading and storing tiles of rows, masked only where a tile can run out of bounds:
what every attention kernel (and RoPE on load) reads and writes memory with."""
import triton
import triton.language as tl


@triton.jit
def load_rows(base, stride, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
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
def store_rows(base, stride, value, rows, n_rows, cols, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if BLOCK_D != HEAD_DIM:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)
