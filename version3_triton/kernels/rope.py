"""Rotary embedding (RoPE): the PyTorch reference, the kernel (forward and backward
are one kernel), its launch configuration, the operator binding.

RoPE rotates each pair of channels (i, i + D/2) of q and k by an angle that
depends on the position t:   y1 = x1*cos - x2*sin,   y2 = x2*cos + x1*sin.
Version 2 writes that as x.float(), a slice, a negation, a cat, two multiplies,
an add and a cast - eight kernels, each reading and writing the whole tensor,
for q and again for k. Here one program loads a position's heads once, rotates
them in fp32 registers and stores them once, and q and k go through together:
in the QKV GEMM's output their heads sit side by side.

Backward: a rotation is linear and its inverse is the rotation by -angle, so
the gradient is the same kernel with sin negated (INVERSE).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import common, configs
from .configs import KernelSpec


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, heads, D) rotated by full-width tables (>= T, D), maths in fp32."""
    T, half = x.shape[1], x.shape[-1] // 2
    x32 = x.float()
    x1, x2 = x32[..., :half], x32[..., half:]
    c, s = cos[:T, None, :half].float(), sin[:T, None, :half].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


@triton.jit
def _rope_kernel(X, COS, SIN, Y, seq_len, n_heads, stride_xb, stride_xt, stride_xh,
                 stride_yb, stride_yt, stride_yh, stride_table,
                 INVERSE: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_HALF: tl.constexpr):
    pid = tl.program_id(0)  # one (batch, position) per program
    b, t = (pid // seq_len).to(tl.int64), pid % seq_len
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (cols < HALF)
    # The tables are full width (cos, cos) as in version 2: read the first half.
    cos = tl.load(COS + t * stride_table + cols, mask=cols < HALF, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_table + cols, mask=cols < HALF, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    x = X + b * stride_xb + t * stride_xt + heads * stride_xh + cols
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
    y = Y + b * stride_yb + t * stride_yt + heads * stride_yh + cols
    tl.store(y, (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=mask)
    tl.store(y + HALF, (x2 * cos + x1 * sin).to(Y.dtype.element_ty), mask=mask)


# Launch configuration: one position's heads per program is a few KiB - 4 warps,
# by rule, so nothing is timed (common.launch).
KERNEL = configs.SPECS["rope"] = KernelSpec(
    "rope", None, lambda config, width, elem_bytes: 0,
    lambda args, constexprs: (2 * constexprs["HALF"], args["X"].element_size()),
    rule=lambda target, width, elem_bytes: dict(num_warps=4, num_stages=1))


def rope_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 inverse: bool = False) -> torch.Tensor:
    """Rotate x (B, T, heads, head_dim; any strides, last dim contiguous) by the
    tables cos/sin (>= T rows, full width). Returns a new contiguous tensor;
    inverse=True rotates backwards (the gradient)."""
    y = common.empty(x.shape, x.dtype, x.device)
    rope_into(x, cos, sin, y, inverse)
    return y


def rope_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, y: torch.Tensor,
              inverse: bool = False) -> None:
    """rope_forward writing into the first heads of y: (B, T, >= x's heads, head_dim), last
    dim contiguous - such as the QKV-shaped gradient of qkv_attention.py, whose q and k
    heads come first. y is handed to the kernel whole, never a slice of it: under
    torch.compile a kernel that writes into a view costs copies (or worse)."""
    common.check_device(x)
    B, T, H, D = x.shape
    if D % 2 or cos.shape[0] < T or cos.shape[-1] != D:
        raise ValueError(f"rope wants x (B, T, heads, even head_dim) and tables (>= T, head_dim); "
                         f"got {tuple(x.shape)} and {tuple(cos.shape)}")
    if (y.dim() != 4 or (y.shape[0], y.shape[1], y.shape[3]) != (B, T, D) or y.shape[2] < H
            or y.stride(-1) != 1):
        raise ValueError(f"rope's output must be (B, T, >= {H}, {D}) like {tuple(x.shape)} with a "
                         f"contiguous last dim, got {tuple(y.shape)}")
    if y.numel() == 0:
        return
    x = common.last_dim_contiguous(x)
    common.launch(KERNEL, _rope_kernel, ["n_heads", "HALF"], lambda c: (B * T,),
                  x, cos, sin, y, T, H, *x.stride()[:3], *y.stride()[:3], cos.stride(0),
                  INVERSE=inverse, HALF=D // 2, BLOCK_H=common.next_power_of_2(H),
                  BLOCK_HALF=common.next_power_of_2(D // 2))


_rope_op = common.define_op("rope", rope_forward,
                            lambda x, cos, sin, inverse=False: common.empty(x.shape, x.dtype,
                                                                            x.device))


class RoPEFunction(torch.autograd.Function):
    """Rotary embedding of (B, T, heads, head_dim); backward = the inverse rotation."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return (_rope_op if common.through_operators() else rope_forward)(x, cos, sin, False)

    @staticmethod
    def backward(ctx, grad_y):
        cos, sin = ctx.saved_tensors
        rotate = _rope_op if common.through_operators() else rope_forward
        return rotate(grad_y, cos, sin, True), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Triton forward + backward). x: (B, T, heads, head_dim);
    cos, sin: (>= T, head_dim) tables as version 2 builds them. Same maths as
    version 1's apply_rope (in fp32, result in x's dtype), on the other layout."""
    return common.apply(RoPEFunction, x, cos, sin)
