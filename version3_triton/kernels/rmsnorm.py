"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * w: the PyTorch reference, the forward
kernel, the backward kernel, their launch configuration, the operator binding.
The same two kernels also do the residual add in front of a norm (add_rms_norm).

A memory-bound row reduction: per element one read, one write and a handful of
FLOPs, so the kernel's only job is to touch HBM once. A program owns BLOCK_ROWS
whole rows, so the row sum is a register reduction - no second pass, no atomics.

Why fp32 accumulation: bf16 keeps 8 bits of mantissa, so a sum of 1024 squares
loses the small terms entirely. Rows are *loaded* in the input precision (that
is where the memory traffic is) and every sum is done in fp32 registers.

Fused residual add (as vLLM's fused_add_rms_norm, Liger's fused add + RMSNorm):
a pre-norm transformer computes h = x + delta (the residual stream plus a
branch's output) and then rms_norm(h). Apart, the add reads x and delta and
writes h, and the norm reads h back. Fused, the kernel reads x and delta once
and writes h (the next residual) and y (the normalised input of the next GEMM).
The backward sums the two gradients that reach h - from the norm and from the
residual path - inside the norm's backward kernel, instead of a separate add.
"""
from __future__ import annotations

import functools
from typing import Optional  # custom_op reads the annotations (Python 3.9: no `X | None`)

import torch
import triton
import triton.language as tl

from . import common, configs, row_sums
# A kernel calls its @triton.jit helpers by name: torch.compile copies the kernel and its
# helpers into the code it generates, where a module prefix (row_sums.x) names nothing.
from .row_sums import sum_program_rows
from .common import Target
from .configs import KernelSpec


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Version 1's maths: the statistic in fp32, the result in x * weight's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                           eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add (kept in x's dtype, the residual stream's), then the norm."""
    h = (x + delta).to(x.dtype)
    return h, rms_norm_reference(h, weight, eps)


# ---- forward ------------------------------------------------------------------------
# ADD_DELTA (a constexpr: the compiler builds one variant per value, and the
# variant without it is the plain norm, instruction for instruction) first adds
# the branch output DELTA to x and stores the sum h: the residual add rides on
# the loads and stores the norm does anyway.
@triton.jit
def _rmsnorm_fwd_kernel(X, DELTA, W, H, Y, n_rows, n_cols, stride_x, stride_delta,
                        stride_y, eps, ADD_DELTA: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # torch.compile passes Python floats as fp64: stay in fp32
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)[None, :]  # (1, BLOCK_COLS): the same 2D layout as x
    # Masks cover the ragged edges: hidden sizes that are not a power of two
    # and a last tile with fewer than BLOCK_ROWS rows.
    mask = (rows[:, None] < n_rows) & (cols < n_cols)
    x = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0)
    if ADD_DELTA:
        # PyTorch's `x + delta`: both promoted to fp32, the sum rounded to x's dtype
        # (the residual stream's). The norm then reads that rounded h, exactly what
        # the backward finds saved.
        delta = tl.load(DELTA + rows[:, None] * stride_delta + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_y + cols, x, mask=mask)  # h and y: same layout
    x = x.to(tl.float32)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)  # fp32: see the docstring
    y = x * rstd[:, None] * w
    tl.store(Y + rows[:, None] * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


# ---- backward -----------------------------------------------------------------------
# The backward loads each row of x anyway, so it recomputes the row's rstd in registers
# (one more row sum, next to the one it does already) instead of reading a 1/rms the
# forward saved: no buffer for the host to allocate on every forward (~3 us, more than
# the GPU spends on the sum).
#
# With x_hat = x * rstd and g = dy * w:
#   dx = rstd * (g - x_hat * mean(g * x_hat))      (per row)
#   dw = sum over rows of dy * x_hat                (per column)
# dx is per row, like the forward. dw sums over *all* rows, which many programs
# share: each program accumulates the rows it owns into a private fp32 partial
# sum (a whole tile, summed over its rows once at the end: element-wise adds in
# the loop, no cross-thread reduction per step), and the programs' rows are
# summed in the same kernel by the last to finish (row_sums.py): deterministic,
# unlike atomically adding into one shared dw, and no second launch.
#
# After a fused add, X is h and a second gradient reaches h along the residual
# path (DH, from the next layer): ADD_GRAD adds it to dx in registers, so the
# kernel returns the whole gradient of h - which is also the gradient of x and of
# delta, since h = x + delta. When delta has another dtype than x (a bf16 branch
# output, an fp32 residual stream), STORE_DDELTA writes that copy from the same
# registers, a second store instead of a separate cast kernel.
@triton.jit
def _rmsnorm_bwd_kernel(DY, X, W, DH, DX, DDELTA, DW_PARTIAL, DW, TICKETS, n_rows, n_cols,
                        rows_per_program, group_size, stride_dy, stride_x, stride_dh, stride_dx,
                        eps, ADD_GRAD: tl.constexpr, STORE_DDELTA: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                        SUM_ROWS: tl.constexpr):
    eps = tl.cast(eps, tl.float32)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)[None, :]
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for first in range(row_start, row_end, BLOCK_ROWS):
        rows = first + tl.arange(0, BLOCK_ROWS)
        mask = (rows[:, None] < row_end) & (cols < n_cols)
        x = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        if ADD_GRAD:  # issued with x and dy, before the row sums wait for them: one round trip
            dh = tl.load(DH + rows[:, None] * stride_dh + cols, mask=mask, other=0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)  # as the forward's
        x_hat = x * rstd[:, None]
        g = dy * w
        mean_gx = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        if ADD_GRAD:
            dx += dh.to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if STORE_DDELTA:
            tl.store(DDELTA + rows[:, None] * stride_dx + cols, dx.to(DDELTA.dtype.element_ty),
                     mask=mask)
        dw += dy * x_hat  # rows past the end loaded as zeros and add nothing
    sum_program_rows(tl.sum(dw, axis=0)[None, :], DW_PARTIAL, DW, TICKETS, group_size, n_cols,
                     cols, SUM_ROWS, BLOCK_COLS)


# ---- launch configuration: a rule, not a search ----------------------------------------
MAX_NORM_COLS = 65536  # one row must fit in one program's registers
NORM_SCRATCH_BYTES = 16 * 1024


def rmsnorm_config(kernel: str, n_cols: int, target: Optional[Target] = None,
                   elem_bytes: int = 2) -> dict:
    """The RMSNorm launch configuration for rows of n_cols elements.

    BLOCK_COLS = next_power_of_2(n_cols) holds a whole row. Short rows are
    stacked BLOCK_ROWS per program so each program still moves a few KiB.
    Forward: ~8 elements per thread (16 bytes of bf16: one vectorised load per
    thread per row), a tile of at least 1024 elements. Backward: each program
    loops over many rows keeping x, dy and its dw partial sum per element, so
    ~16 elements per thread in tiles of at least 2048 - few enough registers
    that the ~4 programs per compute unit it launches all fit at once.
    At most 16 warps: very wide rows (>= 16k) then hold more per thread and
    spill registers to memory - slower, still correct.
    One measured exception (elem_bytes: x's element size): the backward of fp32 rows of
    2048 or more (the large preset's residual stream) on NVIDIA holds 32 elements per thread,
    half the warps: it measured about a fifth less time that way (V3's README, "Run, switch
    off, tune"). bf16 rows, 1024-wide fp32 rows and AMD GPUs (not measured) keep 16.
    """
    cols = common.next_power_of_2(n_cols)
    target = target or common.current_target()
    per_thread, min_tile = (16, 2048) if kernel == "rmsnorm_bwd" else (8, 1024)
    if kernel == "rmsnorm_bwd" and elem_bytes == 4 and cols >= 2048 and target.backend == "cuda":
        per_thread = 32
    rows = max(1, min_tile // cols)
    warps = min(16, max(1, rows * cols // (per_thread * target.warp_size)))
    return dict(BLOCK_ROWS=rows, num_warps=warps, num_stages=1)


def _check(config: dict) -> None:
    if "BLOCK_ROWS" not in config:
        raise ValueError("rmsnorm: the config needs BLOCK_ROWS")


def _spec(kernel: str) -> KernelSpec:
    # Launched by the rule above: nothing is timed (common.launch). RMSNorm stages no tiles
    # in shared memory: rows stay in registers and only the row/column sums swap partial
    # results through a scratch area (<= 8 KiB for every config and hidden size up to
    # 64k, both vendors), counted as 16 KiB.
    return KernelSpec(kernel, None, lambda config, width, elem: NORM_SCRATCH_BYTES,
                      lambda args, constexprs: (constexprs["BLOCK_COLS"],
                                                args["X"].element_size()), _check,
                      rule=lambda target, width, elem: rmsnorm_config(kernel, width, target, elem))


FWD, BWD = configs.SPECS["rmsnorm_fwd"], configs.SPECS["rmsnorm_bwd"] = (
    _spec("rmsnorm_fwd"), _spec("rmsnorm_bwd"))
TUNING_KEY = ["BLOCK_COLS"]


# ---- launchers -------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)  # a hit costs no Python frame: one less layer per call
def _block_cols(n_cols: int) -> int:
    if n_cols > MAX_NORM_COLS:
        raise ValueError(f"rms_norm: hidden size {n_cols} is above {MAX_NORM_COLS}, the most one "
                         f"program keeps in registers in this teaching kernel")
    return common.next_power_of_2(n_cols)


def _output(x: torch.Tensor, weight: torch.Tensor, out_dtype) -> torch.Tensor:
    """Allocate y (shared by the real op and its fake for torch.compile)."""
    return common.empty_like(x, out_dtype or torch.promote_types(x.dtype, weight.dtype))


def _launch_forward(x, delta, weight, eps, out_dtype):
    """The forward kernel, plain (delta None) or with the residual add. Returns (h, y);
    h is None for the plain norm."""
    # A call like an earlier one replays its launch (common.py's launch plans).
    plan_key = common.plan_key("rms_fwd", (x, delta, weight), eps, out_dtype)
    if (plan := common.PLANS.get(plan_key)) is not None:
        y, h = _output(x, weight, out_dtype), None if delta is None else common.empty_like(x)
        if common.replay(plan, (x, delta, weight, h, y)):
            return h, y
    common.check_device(x)
    n_cols = x.shape[-1]
    block_cols = _block_cols(n_cols)
    x2, n_rows, stride_x = common.as_rows(x, n_cols)
    y = _output(x, weight, out_dtype)
    h = d2 = None
    stride_delta = 0
    if delta is not None:
        if delta.shape != x.shape:
            raise ValueError(f"add_rms_norm: delta {tuple(delta.shape)} is not x's shape "
                             f"{tuple(x.shape)}")
        (d2, _, stride_delta), h = common.as_rows(delta, n_cols), common.empty_like(x)
    if n_rows:
        with common.recording(plan_key, (x, delta, weight, h, y)):
            common.launch(FWD, _rmsnorm_fwd_kernel, TUNING_KEY,
                          lambda c: (common.cdiv(n_rows, c["BLOCK_ROWS"]),),
                          x2, d2, weight, h, y, n_rows, n_cols, stride_x, stride_delta, n_cols,
                          eps, ADD_DELTA=d2 is not None, BLOCK_COLS=block_cols)
    return h, y


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Launch the forward kernel. Returns y in out_dtype, by default the dtype PyTorch's
    `x * weight` would have (same as version 1)."""
    return _launch_forward(x, None, weight, eps, out_dtype)[1]


def add_rmsnorm_forward(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                        out_dtype: Optional[torch.dtype] = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel with the residual add. Returns (h, y): h = x + delta in
    x's dtype, y = rms_norm(h) * weight as in rmsnorm_forward."""
    return _launch_forward(x, delta, weight, eps, out_dtype)


def _chunks(n_rows: int, wave: int, tile: int) -> tuple[int, int]:
    """(programs, rows each) for n_rows in about `wave` contiguous chunks of whole tiles.

    Whole tiles because a program's chunk is walked one BLOCK_ROWS tile at a time: a
    chunk of 2 rows in a tile of 4 leaves half of every tile masked off, and twice the
    programs each write a partial dw row to be summed - a third of the small preset's
    backward time (V3's README has the numbers); wider rows' chunks are whole tiles anyway."""
    rows_each = common.cdiv(common.cdiv(n_rows, wave), tile) * tile  # the wave's share, in tiles
    return common.cdiv(n_rows, rows_each), rows_each


@functools.lru_cache(maxsize=None)  # a hit costs no Python frame
def _programs(device: int, n_rows: int, n_cols: int) -> tuple[int, int]:
    """(programs, rows each) of the backward: about one wave, ~4 programs per compute unit,
    each walking a contiguous chunk of rows and writing one fp32 partial dw row
    (4 * 132 * 4 KiB on an H100). device: the GPU's index, -1 for the CPU (the
    interpreter: 3 programs, so tests see several; its chunks are not rounded to tiles)."""
    if device < 0:
        programs = max(1, min(n_rows, 3))
        return programs, common.cdiv(n_rows, programs)
    wave = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return _chunks(max(1, n_rows), wave, rmsnorm_config("rmsnorm_bwd", n_cols)["BLOCK_ROWS"])


def _backward_buffers(x, weight, delta_dtype, programs: int) -> tuple:
    """(dx, its copy in delta_dtype or None, dw, the partial dw rows, their counters)."""
    dx = common.empty_like(x)  # contiguous: its rows are n_cols apart
    ddelta = None if delta_dtype is None else common.empty_like(x, delta_dtype)
    return dx, ddelta, common.empty_like(weight), *row_sums.scratch(x, programs, x.shape[-1])


def _launch_backward(grad_y, grad_h, x, weight, eps, delta_dtype):
    """The backward kernel; grad_h (the residual path's gradient) is added when given, and
    a copy of the result is stored in delta_dtype when given. Returns (dx, ddelta, dw)."""
    # A call like an earlier one replays its launch (common.py's launch plans).
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    programs, rows_each = _programs(x.get_device(), n_rows, n_cols)
    plan_key = common.plan_key("rms_bwd", (grad_y, grad_h, x, weight), eps, delta_dtype)
    if (plan := common.PLANS.get(plan_key)) is not None:
        named = (grad_y, grad_h, x, weight, *_backward_buffers(x, weight, delta_dtype, programs))
        if common.replay(plan, named):
            return named[4:7]
    block_cols = _block_cols(n_cols)
    (x2, n_rows, stride_x), (dy2, _, stride_dy) = (common.as_rows(x, n_cols),
                                                   common.as_rows(grad_y, n_cols))
    dh2, _, stride_dh = (None, 0, 0) if grad_h is None else common.as_rows(grad_h, n_cols)
    named = (grad_y, grad_h, x, weight, *_backward_buffers(x, weight, delta_dtype, programs))
    dx, ddelta, dw, partial, tickets = named[4:]
    if n_rows == 0:
        return dx, ddelta, dw.zero_()
    with common.recording(plan_key, named):
        common.launch(BWD, _rmsnorm_bwd_kernel, TUNING_KEY, lambda c: (programs,),
                      dy2, x2, weight, dh2, dx, ddelta, partial, dw, tickets, n_rows, n_cols,
                      rows_each, row_sums.group_size(programs), stride_dy, stride_x,
                      stride_dh, n_cols, eps, ADD_GRAD=dh2 is not None,
                      STORE_DDELTA=ddelta is not None, BLOCK_COLS=block_cols,
                      SUM_ROWS=row_sums.summing_rows(n_cols))
    return dx, ddelta, dw


def rmsnorm_backward(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel. Returns (grad_x, grad_weight)."""
    dx, _, dw = _launch_backward(grad_y, None, x, weight, eps, None)
    return dx, dw


def add_rmsnorm_backward(grad_y: torch.Tensor, grad_h: Optional[torch.Tensor], h: torch.Tensor,
                         weight: torch.Tensor, eps: float,
                         delta_dtype: torch.dtype) -> list[torch.Tensor]:
    """Launch the backward kernel after add_rmsnorm_forward. grad_h: the gradient that
    reaches h along the residual path (None: h had no other use).

    Returns [grad_h_total, grad_weight] - grad_h_total is the gradient of x and of
    delta alike - plus, when delta_dtype is not h's dtype, grad_h_total in delta_dtype
    (written by the same kernel). A list: an operator's outputs may not alias, so the
    one tensor is not returned twice."""
    copy_dtype = None if delta_dtype == h.dtype else delta_dtype
    dh, ddelta, dw = _launch_backward(grad_y, grad_h, h, weight, eps, copy_dtype)
    return [dh, dw] if ddelta is None else [dh, dw, ddelta]


# ---- the operators and autograd -----------------------------------------------------------
_forward_op = common.define_op(
    "rmsnorm_forward", rmsnorm_forward,
    lambda x, weight, eps, out_dtype=None: _output(x, weight, out_dtype))
_backward_op = common.define_op(
    "rmsnorm_backward", rmsnorm_backward,
    lambda grad_y, x, weight, eps: (common.empty(x.shape, x.dtype, x.device),
                                    common.empty(weight.shape, weight.dtype, weight.device)))


def _add_forward_fake(x, delta, weight, eps, out_dtype=None):
    return common.empty(x.shape, x.dtype, x.device), _output(x, weight, out_dtype)


def _add_backward_fake(grad_y, grad_h, h, weight, eps, delta_dtype):
    grads = [common.empty(h.shape, h.dtype, h.device),
             common.empty(weight.shape, weight.dtype, weight.device)]
    return grads if delta_dtype == h.dtype else grads + [common.empty(h.shape, delta_dtype,
                                                                       h.device)]


_add_forward_op = common.define_op("add_rmsnorm_forward", add_rmsnorm_forward, _add_forward_fake)
_add_backward_op = common.define_op("add_rmsnorm_backward", add_rmsnorm_backward,
                                    _add_backward_fake)


class RMSNormFunction(torch.autograd.Function):
    """y = rms_norm(x) * weight, with the Triton forward and backward kernels."""

    @staticmethod
    def forward(ctx, x, weight, eps, out_dtype=None):
        forward = _forward_op if common.through_operators() else rmsnorm_forward
        y = forward(x, weight, eps, out_dtype)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, grad_y):
        backward = _backward_op if common.through_operators() else rmsnorm_backward
        dx, dw = backward(grad_y, *ctx.saved_tensors, ctx.eps)
        return dx, dw, None, None


class AddRMSNormFunction(torch.autograd.Function):
    """(h, y) = (x + delta, rms_norm(x + delta) * weight), one kernel each way."""

    @staticmethod
    def forward(ctx, x, delta, weight, eps, out_dtype=None):
        forward = _add_forward_op if common.through_operators() else add_rmsnorm_forward
        h, y = forward(x, delta, weight, eps, out_dtype)
        # h, not x and delta: the backward needs only the norm's input.
        ctx.save_for_backward(h, weight)
        ctx.eps, ctx.delta_dtype = eps, delta.dtype
        # A gradient nobody sends (h unused, as after the last layer) stays None,
        # not a tensor of zeros the kernel would read.
        ctx.set_materialize_grads(False)
        return h, y

    @staticmethod
    def backward(ctx, grad_h, grad_y):
        h, weight = ctx.saved_tensors
        if grad_y is None:  # y unused: the norm's gradient is zero
            grad_y = torch.zeros_like(h)
        backward = _add_backward_op if common.through_operators() else add_rmsnorm_backward
        dh, dw, *ddelta = backward(grad_y, grad_h, h, weight, ctx.eps, ctx.delta_dtype)
        # h = x + delta: one gradient for both, in each one's dtype.
        return dh, ddelta[0] if ddelta else dh, dw, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
             out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """RMSNorm over the last dimension (Triton forward + backward)."""
    return common.apply(RMSNormFunction, x, weight, eps, out_dtype)


def add_rms_norm(x: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float = 1e-5, out_dtype: Optional[torch.dtype] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = x + delta in x's dtype (the residual stream's; delta may be the
    bf16/fp16 output of an autocast GEMM), y = rms_norm(h) * weight in out_dtype.
    One forward kernel, one backward kernel. delta None: (x, rms_norm(x)), for the
    first norm of a model, which has nothing to add yet."""
    if delta is None:
        return x, rms_norm(x, weight, eps, out_dtype)
    return common.apply(AddRMSNormFunction, x, delta, weight, eps, out_dtype)
