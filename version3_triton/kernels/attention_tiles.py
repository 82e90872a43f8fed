"""What the flash-attention kernels share (flash_attention.py runs the forward,
flash_attention_backward.py the two backward kernels): loading q, k and storing their
gradients (plain, or rotated by RoPE on load: attention_rope.py), the launch
configurations and the launchers' argument checks.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import common
from .attention_rope import check_tables, load_rotated, store_unrotated
from .attention_tables import attention_block_check, attention_configs, attention_shared_bytes
from .configs import SPECS, KernelSpec
from .tiles import load_rows, store_rows

MAX_HEAD_DIM = 128


@triton.jit
def _load_qk(base, stride, rows, n_rows, offs_d, COS, SIN, stride_table,
             ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_HALF: tl.constexpr, CHECK_ROWS: tl.constexpr, ROTATE: tl.constexpr):
    """A q or k tile as the dots take it: (ROWS, BLOCK_D), or with ROTATE the
    rotated [y1 | y2] of (ROWS, 2 * BLOCK_HALF) (attention_rope.py)."""
    if ROTATE:
        tile = load_rotated(base, stride, rows, n_rows, COS, SIN, stride_table, ROWS, HEAD_DIM,
                            BLOCK_HALF, CHECK_ROWS)
    else:
        tile = load_rows(base, stride, rows, n_rows, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


@triton.jit
def _store_qk_grad(base, stride, grad, rows, n_rows, offs_d, COS, SIN, stride_table,
                   ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_HALF: tl.constexpr, ROTATE: tl.constexpr):
    """Store dQ or dK (fp32 `grad`); with ROTATE, the gradient of the unrotated tile
    (attention_rope.py)."""
    if ROTATE:
        store_unrotated(base, stride, grad, rows, n_rows, COS, SIN, stride_table, ROWS,
                        HEAD_DIM, BLOCK_HALF)
    else:
        store_rows(base, stride, grad.to(base.dtype.element_ty), rows, n_rows, offs_d, HEAD_DIM,
                   BLOCK_D)


# ---- launch configurations ------------------------------------------------------------
def _spec(kernel: str) -> KernelSpec:
    # The rotating kernels ("rope") hold more registers: some head sizes have lists of their own.
    return KernelSpec(
        kernel, lambda target, width=None, variant=None: attention_configs(kernel, target, width,
                                                                            variant),
        lambda config, width, elem_bytes: attention_shared_bytes(kernel, config, width, elem_bytes),
        lambda args, constexprs: (constexprs["HEAD_DIM"], args["Q"].element_size(),
                                  "rope" if constexprs["ROTATE"] else None),
        attention_block_check(kernel))


FWD, DKDV, DQ = (_spec(k) for k in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"))
SPECS.update({s.name: s for s in (FWD, DKDV, DQ)})
# What the best tile depends on: sequence length, head size, GQA group, dtype
# (the autotuner adds the tensors' dtypes), RoPE on load or not - not batch or head count.
TUNING_KEY = ["N_CTX", "GROUP_SIZE", "HEAD_DIM", "DOT_PRECISION", "ROTATE"]


# ---- what the launchers share --------------------------------------------------------
_LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))


def _check_inputs(q, k, v, cos=None, sin=None) -> None:
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
    if cos is not None or sin is not None:
        check_tables(q, cos, sin)


def _strides(t: torch.Tensor):
    return t.stride()[:3]  # batch, head, position (the head dim has stride 1)


def _tf32(q) -> bool:
    """fp32 inputs: true fp32 ('ieee') unless PyTorch allows TF32 for matmuls too."""
    return q.dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _head_meta(q, k, rotate: bool) -> dict:
    return _meta(q.shape[1] // k.shape[1], q.shape[-1], _tf32(q), rotate)


@functools.lru_cache(maxsize=None)
def _meta(group_size: int, D: int, tf32: bool, rotate: bool) -> dict:
    """The attention kernels' constexprs, worked out once per kind of call (read-only)."""
    return dict(GROUP_SIZE=group_size, HEAD_DIM=D, BLOCK_D=max(16, common.next_power_of_2(D)),
                DOT_PRECISION="tf32" if tf32 and common.triton_backend() == "cuda" else "ieee",
                ROTATE=rotate, BLOCK_HALF=max(16, common.next_power_of_2(D // 2)))
