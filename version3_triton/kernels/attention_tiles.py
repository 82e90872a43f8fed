"""What the flash-attention kernels share (flash_attention.py runs the forward,
flash_attention_backward.py the two backward kernels): tiles of rows loaded and stored with
no more masking than needed, the functions that load a q or k tile and store its gradient,
the launch configurations and the launchers' argument checks.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import common
from .attention_tables import attention_block_check, attention_configs, attention_shared_bytes
from .configs import SPECS, KernelSpec

MAX_HEAD_DIM = 128


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
    """Store `value` into base[rows, cols], masked as load_rows masks (rows always: a tile
    ends past the sequence only where its rows do)."""
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if BLOCK_D != HEAD_DIM:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)


# Every q and k tile a kernel reads, and every dQ and dK tile it writes, goes through a
# pair of functions the kernel is handed at compile time (LOAD_QK, STORE_DQK), together
# with the arguments those need beyond the tile (`qk_args`). The plain kernels hand in
# the two below, which need none: a q or k tile is a tile of rows like any other. A
# variant of attention hands in its own pair and the kernels stay as they are -
# attention_rope.py rotates q and k on load that way. Being compile-time arguments, the
# functions are inlined: a kernel compiled with these is the plain kernel, instruction
# for instruction.
@triton.jit
def load_qk(base, stride, rows, n_rows, offs_d, qk_args, ROWS: tl.constexpr,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """A q or k tile as the dots take it: (ROWS, BLOCK_D)."""
    return load_rows(base, stride, rows, n_rows, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS)


@triton.jit
def store_dqk(base, stride, grad, rows, n_rows, offs_d, qk_args, ROWS: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a dQ or dK tile (fp32 `grad`) in the gradient's dtype."""
    store_rows(base, stride, grad.to(base.dtype.element_ty), rows, n_rows, offs_d, HEAD_DIM,
               BLOCK_D)


# ---- launch configurations ------------------------------------------------------------
def _spec(kernel: str) -> KernelSpec:
    # The rotating kernels (attention_rope.py, the ones given RoPE's tables COS and SIN)
    # hold more registers: some head sizes have lists of their own.
    return KernelSpec(
        kernel, lambda target, width=None, variant=None: attention_configs(kernel, target, width,
                                                                            variant),
        lambda config, width, elem_bytes: attention_shared_bytes(kernel, config, width, elem_bytes),
        lambda args, constexprs: (constexprs["HEAD_DIM"], args["Q"].element_size(),
                                  "rope" if "COS" in args else None),
        attention_block_check(kernel))


FWD, DKDV, DQ = (_spec(k) for k in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"))
SPECS.update({s.name: s for s in (FWD, DKDV, DQ)})
# What the best tile depends on: sequence length, head size, GQA group, dtype (the
# autotuner adds the tensors' dtypes) - not batch or head count. A variant's kernels
# (RoPE on load) have tuners of their own.
TUNING_KEY = ["N_CTX", "GROUP_SIZE", "HEAD_DIM", "DOT_PRECISION"]


# ---- what the launchers share --------------------------------------------------------
_LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))


def _check_inputs(q, k, v) -> None:
    common.check_device(q)
    q_shape, k_shape = q.shape, k.shape  # each .shape is a new object: read them once
    if len(q_shape) != 4 or k_shape != v.shape or q_shape[0] != k_shape[0] or q_shape[2:] != k_shape[2:]:
        raise ValueError(f"flash_attention wants q (B, H, T, D), k and v (B, H_kv, T, D); got "
                         f"{tuple(q_shape)}, {tuple(k_shape)}, {tuple(v.shape)}")
    if q_shape[1] % k_shape[1]:
        raise ValueError(f"query heads {q_shape[1]} are not a multiple of kv heads {k_shape[1]}")
    if not 1 <= q_shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q_shape[-1]} is not supported (1..{MAX_HEAD_DIM})")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if common.INTERPRET and q.dtype == torch.bfloat16:
        raise ValueError("Triton's CPU interpreter computes bf16 tl.dot wrongly: "
                         "use fp32 or fp16 on the CPU")


def _strides(t: torch.Tensor):
    return t.stride()[:3]  # batch, head, position (the head dim has stride 1)


def _tf32(q) -> bool:
    """fp32 inputs: true fp32 ('ieee') unless PyTorch allows TF32 for matmuls too."""
    return q.dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _head_meta(q, k) -> dict:
    return _meta(q.shape[1] // k.shape[1], q.shape[-1], _tf32(q))


@functools.lru_cache(maxsize=None)
def _meta(group_size: int, D: int, tf32: bool) -> dict:
    """The attention kernels' constexprs, worked out once per kind of call (read-only).
    BLOCK_D: the head size padded to a power of two, at least 16 (tl.dot's smallest depth)."""
    return dict(GROUP_SIZE=group_size, HEAD_DIM=D, BLOCK_D=max(16, common.next_power_of_2(D)),
                DOT_PRECISION="tf32" if tf32 and common.triton_backend() == "cuda" else "ieee")
