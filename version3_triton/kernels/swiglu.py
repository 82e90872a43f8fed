"""SwiGLU's middle, silu(gate) * up, on the gate/up GEMM's output: the PyTorch reference,
the forward kernel, the backward kernel, the launch configuration, the operator binding.

The MLP computes gate_up = x @ [W_gate; W_up]^T, (rows, 2 * ffn), then
y = silu(gate) * up with gate, up its two halves. Version 2 generates one kernel for
silu_mul (torch.compile of two PyTorch operations) and hands it gate and up as two views;
its backward returns their gradients as two tensors, which autograd then gathers into the
gate/up GEMM's gradient (a zero-filled buffer per half, two copies, an add). Here the
forward reads the GEMM's output directly, and the backward writes that gradient whole,
[d gate | d up], in the same pass - recomputing sigmoid(gate) rather than storing it.

recompute.py's swiglu_linear goes one step further (--recompute-swiglu): silu(gate) * up
is not kept for the down projection's backward at all.

    s = sigmoid(g)      y = g * s * u
    d g = dy * u * s * (1 + g * (1 - s))       d u = dy * g * s

Every value is computed in fp32 registers and rounded once, on the store.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import common, configs
from .configs import KernelSpec


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up = [gate | up] (last dim), maths in fp32."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


@triton.jit
def _swiglu_fwd_kernel(GU, Y, n_cols, stride_gu, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one row, one block of its columns per program
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + row * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(GU, DY, DGU, n_cols, stride_gu, stride_dy, stride_dgu,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + row * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    d_gate = dy * up * s * (1.0 + gate * (1.0 - s))
    d_up = dy * gate * s
    out = DGU + row * stride_dgu + cols  # both halves of the one gradient tensor
    tl.store(out, d_gate.to(DGU.dtype.element_ty), mask=mask)
    tl.store(out + n_cols, d_up.to(DGU.dtype.element_ty), mask=mask)


# Launch configuration: an elementwise kernel, one block of BLOCK columns of one row per
# program (1024 bf16 values: 16-byte loads for every thread of 4 warps), by rule, so
# nothing is timed (common.launch).
def _rule(target, width=None, elem_bytes=None):
    return dict(num_warps=4, num_stages=1)


def _spec(kernel: str) -> KernelSpec:
    return KernelSpec(kernel, None, lambda config, width, elem_bytes: 0,
                      lambda args, constexprs: (constexprs["BLOCK"], args["GU"].element_size()),
                      rule=_rule)


FWD, BWD = configs.SPECS["swiglu_fwd"], configs.SPECS["swiglu_bwd"] = (
    _spec("swiglu_fwd"), _spec("swiglu_bwd"))


# ---- launchers -------------------------------------------------------------------------
def _block(n_cols: int) -> int:
    return min(1024, common.next_power_of_2(max(n_cols, 16)))


def swiglu_forward(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up (..., 2 * n): a new (..., n) tensor in gate_up's dtype."""
    common.check_device(gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu wants [gate | up] in the last dim (an even size); got "
                         f"{tuple(gate_up.shape)}")
    n_cols = gate_up.shape[-1] // 2
    gu, rows, stride = common.as_rows(gate_up, 2 * n_cols)
    y = common.empty((*gate_up.shape[:-1], n_cols), gate_up.dtype, gate_up.device)
    if rows and n_cols:
        block = _block(n_cols)
        common.launch(FWD, _swiglu_fwd_kernel, ["BLOCK"],
                      lambda c: (rows, common.cdiv(n_cols, block)),
                      gu, y, n_cols, stride, n_cols, BLOCK=block)
    return y


def swiglu_backward(grad_y: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """The gradient of gate_up, [d gate | d up], as one new tensor of its shape."""
    common.check_device(gate_up)
    n_cols = gate_up.shape[-1] // 2
    (gu, rows, stride), (dy, _, dy_stride) = (common.as_rows(gate_up, 2 * n_cols),
                                              common.as_rows(grad_y, n_cols))
    d_gate_up = common.empty(gate_up.shape, gate_up.dtype, gate_up.device)
    if rows and n_cols:
        block = _block(n_cols)
        common.launch(BWD, _swiglu_bwd_kernel, ["BLOCK"],
                      lambda c: (rows, common.cdiv(n_cols, block)),
                      gu, dy, d_gate_up, n_cols, stride, dy_stride, 2 * n_cols, BLOCK=block)
    return d_gate_up


def _forward_fake(gate_up):
    return common.empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2), gate_up.dtype,
                        gate_up.device)


_forward_op = common.define_op("swiglu_forward", swiglu_forward, _forward_fake)
_backward_op = common.define_op(
    "swiglu_backward", swiglu_backward,
    lambda grad_y, gate_up: common.empty(gate_up.shape, gate_up.dtype, gate_up.device))


class SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up of [gate | up]; saves only the GEMM output it reads."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        return (_forward_op if common.through_operators() else swiglu_forward)(gate_up)

    @staticmethod
    def backward(ctx, grad_y):
        backward = _backward_op if common.through_operators() else swiglu_backward
        return backward(grad_y, *ctx.saved_tensors)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the gate/up GEMM's output [gate | up] (Triton forward + backward):
    (..., 2 * ffn) -> (..., ffn); the gradient comes back as one tensor of gate_up's shape.
    Same maths as version 2's silu_mul(gate, up), rounded once."""
    return common.apply(SwiGLUFunction, gate_up)
