"""Memory for time: a GEMM's input rebuilt in the backward instead of kept for it.

A linear layer out = y @ W^T keeps its input y until the backward, for the weight's
gradient (dW = d_out^T @ y). When y is the output of one of our cheap kernels whose own
input autograd keeps anyway, the backward can run that kernel again instead: one tensor
of y's size less per layer, held from the forward to the backward, for one more launch of
a memory-bound kernel. Each function here puts the kernel and the GEMM after it in one
autograd step that keeps only the kernel's input and the weight:

    add_rms_norm_linear  the residual add + RMSNorm in front of the QKV and gate/up GEMMs
                         (--recompute-norm): the norm's output, (rows, hidden) each
    swiglu_linear        silu(gate) * up in front of the down projection
                         (--recompute-swiglu): (rows, ffn)

Same kernels, same GEMMs, same bits as the two calls; the weight is cast to the GEMM's
dtype (autocast's) outside the step, as autocast casts it, so autograd casts its gradient
back. The memory model (analysis_tools/memory.py) predicts what each keeps.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import common, rmsnorm
from .swiglu import _backward_op as _swiglu_backward_op
from .swiglu import _forward_op as _swiglu_forward_op
from .swiglu import swiglu_backward, swiglu_forward


def _gemm_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a GEMM on x computes in: autocast's, else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _linear_backward(grad_out: torch.Tensor, y: torch.Tensor, weight: torch.Tensor):
    """(d y, d weight) of F.linear(y, weight): the two GEMMs autograd would run. y is
    freed by the caller right after: it exists only here."""
    d_weight = grad_out.reshape(-1, weight.shape[0]).t().mm(y.reshape(-1, weight.shape[1]))
    return grad_out.matmul(weight), d_weight


class AddRMSNormLinearFunction(torch.autograd.Function):
    """(h, F.linear(rms_norm(h) * norm_weight, weight)) with h = x + delta (delta None: h is
    x, and only the GEMM's output is returned); keeps h, the norm's weight and the weight."""

    @staticmethod
    def forward(ctx, x, delta, norm_weight, weight, eps):
        operators = common.through_operators()
        if delta is None:
            h, y = x, (rmsnorm._forward_op if operators else rmsnorm.rmsnorm_forward)(
                x, norm_weight, eps, weight.dtype)
        else:
            h, y = (rmsnorm._add_forward_op if operators else rmsnorm.add_rmsnorm_forward)(
                x, delta, norm_weight, eps, weight.dtype)
        ctx.save_for_backward(h, norm_weight, weight)
        ctx.eps, ctx.delta_dtype = eps, None if delta is None else delta.dtype
        ctx.set_materialize_grads(False)  # an output nobody uses gets None, not zeros to read
        out = F.linear(y, weight)
        return out if delta is None else (h, out)

    @staticmethod
    def backward(ctx, *grads):
        grad_h, grad_out = grads if len(grads) == 2 else (None, grads[0])
        operators = common.through_operators()
        h, norm_weight, weight = ctx.saved_tensors
        y = (rmsnorm._forward_op if operators else rmsnorm.rmsnorm_forward)(
            h, norm_weight, ctx.eps, weight.dtype)  # the norm's output again
        grad_y, d_weight = _linear_backward(grad_out, y, weight)
        del y
        delta_dtype = ctx.delta_dtype or h.dtype
        dh, d_norm_weight, *d_delta = (rmsnorm._add_backward_op if operators else
                                       rmsnorm.add_rmsnorm_backward)(
            grad_y, grad_h, h, norm_weight, ctx.eps, delta_dtype)
        if ctx.delta_dtype is None:
            return dh, None, d_norm_weight, d_weight, None
        return dh, d_delta[0] if d_delta else dh, d_norm_weight, d_weight, None


def add_rms_norm_linear(x: torch.Tensor, delta: Optional[torch.Tensor], norm_weight: torch.Tensor,
                        weight: torch.Tensor, eps: float = 1e-5
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, F.linear(rms_norm(h) * norm_weight, weight)) with h = x + delta, as add_rms_norm
    and the GEMM compute them (delta None: h is x); the norm's output is rebuilt in the
    backward instead of kept. The norm writes the GEMM's dtype, as V3's norm does."""
    w = weight.to(_gemm_dtype(x if delta is None else delta))
    if delta is None:
        return x, common.apply(AddRMSNormLinearFunction, x, None, norm_weight, w, eps)
    return common.apply(AddRMSNormLinearFunction, x, delta, norm_weight, w, eps)


class SwiGLULinearFunction(torch.autograd.Function):
    """F.linear(silu(gate) * up, weight) of gate_up = [gate | up]; keeps gate_up and the
    weight."""

    @staticmethod
    def forward(ctx, gate_up, weight):
        ctx.save_for_backward(gate_up, weight)
        forward = _swiglu_forward_op if common.through_operators() else swiglu_forward
        return F.linear(forward(gate_up).to(weight.dtype), weight)

    @staticmethod
    def backward(ctx, grad_out):
        operators = common.through_operators()
        gate_up, weight = ctx.saved_tensors
        y = (_swiglu_forward_op if operators else swiglu_forward)(gate_up).to(weight.dtype)
        grad_y, d_weight = _linear_backward(grad_out, y, weight)
        del y  # before the SwiGLU gradient is allocated: no more alive at once than without
        backward = _swiglu_backward_op if operators else swiglu_backward
        return backward(grad_y, gate_up), d_weight


def swiglu_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(swiglu(gate_up), weight): the MLP's down projection of silu(gate) * up,
    which is rebuilt in the backward instead of kept for it."""
    return common.apply(SwiGLULinearFunction, gate_up, weight.to(_gemm_dtype(gate_up)))
