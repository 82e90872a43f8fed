"""The output layer and the loss, a chunk of rows at a time: the PyTorch reference, the
cross-entropy kernel (loss and gradient in one), its launch rule, the chunked driver, the
autograd.Function.

A language model ends with logits = h @ W^T, one score per word of the vocabulary for each
of its rows (batch x sequence positions), and the loss -log softmax(logits)[target]. Written
that way, the (rows, vocab) logits exist whole: in the compute dtype, again in fp32 for the
loss, and again as their gradient. At the large preset (16 x 1024 rows, 32,000 words) each
fp32 copy is 2 GiB - more than the model's weights.

Here the rows go through in chunks. For each chunk: one GEMM gives its logits; the kernel
reads each row twice - once for its log-sum-exp, once to overwrite the logits with their
gradient; two more GEMMs turn that into the chunk's share of dh and dW (dW summed over the
chunks in fp32, by the GEMM itself where the BLAS can: _add_product). Only one chunk's
logits ever exist, the gradients are ready when forward ends, and backward only scales them
by the incoming gradient (1 for the loss itself).

    loss_i = logsumexp(z_i) - z_i[t_i]          d z_ij = (softmax(z_i)_j - [j == t_i]) / rows

The softmax is computed in fp32 registers from the stored logits, as F.cross_entropy does
from their fp32 copy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import common, configs
from .configs import KernelSpec


def linear_cross_entropy_reference(h: torch.Tensor, weight: torch.Tensor,
                                   targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of h @ weight^T against targets, written the direct way (the
    loss in fp32, or in fp64 for fp64 inputs)."""
    logits = h @ weight.to(h.dtype).T
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)


@triton.jit
def _cross_entropy_kernel(Z, TARGETS, LOSSES, n_vocab, stride_z, grad_scale,
                          BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one row of logits per program
    z_row = Z + row * stride_z
    target = tl.load(TARGETS + row)
    z_target = tl.load(z_row + target).to(tl.float32)  # before pass 2 overwrites it
    # Pass 1: log-sum-exp over the vocabulary, BLOCK_V columns at a time. Each lane keeps
    # its own running max and sum (the online softmax of flash attention); a large finite
    # start instead of -inf keeps lanes that only ever see masked columns at exp(0) * 0.
    m = tl.full((BLOCK_V,), -1e30, tl.float32)
    s = tl.zeros((BLOCK_V,), tl.float32)
    for start in range(0, n_vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        z = tl.load(z_row + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, z)
        s = s * tl.exp(m - m_new) + tl.exp(z - m_new)
        m = m_new
    row_max = tl.max(m, axis=0)
    lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max), axis=0))
    tl.store(LOSSES + row, lse - z_target)
    # Pass 2: the logits become the gradient of the mean loss with respect to them.
    for start in range(0, n_vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < n_vocab
        z = tl.load(z_row + cols, mask=mask, other=0.0).to(tl.float32)
        grad = tl.exp(z - lse)
        grad = tl.where(cols == target, grad - 1.0, grad) * grad_scale
        tl.store(z_row + cols, grad.to(Z.dtype.element_ty), mask=mask)


# Launch configuration: a row reduction read twice, by rule (common.launch): BLOCK_V columns
# a step, up to 4096 (16 fp32 values per thread of 8 warps), so a 32k vocabulary takes eight.
def _rule(target, width=None, elem_bytes=None):
    return dict(num_warps=8 if (width or 0) >= 2048 else 4, num_stages=1)


KERNEL = configs.SPECS["cross_entropy"] = KernelSpec(
    "cross_entropy", None, lambda config, width, elem_bytes: 0,
    lambda args, constexprs: (constexprs["BLOCK_V"], args["Z"].element_size()), rule=_rule)


def _block(n_vocab: int) -> int:
    return min(4096, common.next_power_of_2(max(n_vocab, 16)))


def cross_entropy_in_place(logits: torch.Tensor, targets: torch.Tensor, grad_scale: float) -> torch.Tensor:
    """Each row's loss (fp32, a new tensor); `logits` (rows, vocab) is overwritten with the
    gradient of grad_scale * sum(losses) with respect to it."""
    common.check_device(logits)
    rows, n_vocab = logits.shape
    losses = common.empty((rows,), torch.float32, logits.device)
    if rows:
        block = _block(n_vocab)
        common.launch(KERNEL, _cross_entropy_kernel, ["BLOCK_V"], lambda c: (rows,),
                      logits, targets, losses, n_vocab, logits.stride(0), grad_scale, BLOCK_V=block)
    return losses


def _chunk_rows(rows: int, n_vocab: int) -> int:
    """Rows per chunk: about 2^26 logits (128 MiB in bf16) - a few GEMMs large enough to
    run at full speed, a few percent of the whole logits at the large preset."""
    return max(1, min(rows, 2 ** 26 // max(n_vocab, 1)))


def linear_cross_entropy_forward(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                 chunk_rows: int | None = None):
    """(mean loss, dh, dW) of h (rows, d) @ weight (vocab, d)^T against targets (rows,): the
    loss as a 0-d fp32 tensor, the gradients in h's and weight's dtypes, for a loss gradient of 1."""
    rows, n_vocab = h.shape[0], weight.shape[0]
    if targets.shape != (rows,):
        raise ValueError(f"targets must be one index per row of h: h {tuple(h.shape)}, "
                         f"targets {tuple(targets.shape)}")
    w = weight.to(h.dtype)
    chunk = chunk_rows or _chunk_rows(rows, n_vocab)
    grad_h = torch.empty_like(h)
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
    losses = []
    for start in range(0, rows, chunk):
        h_chunk = h[start:start + chunk]
        logits = h_chunk @ w.T  # (chunk, vocab): the only logits that exist
        losses.append(cross_entropy_in_place(logits, targets[start:start + chunk], 1.0 / rows))
        torch.mm(logits, w, out=grad_h[start:start + chunk])  # logits now hold d loss / d logits
        _add_product(grad_w, logits.T, h_chunk)  # summed over the chunks in fp32
    return torch.cat(losses).sum() / rows, grad_h, grad_w.to(weight.dtype)


_ADDS_IN_PLACE: dict[str, bool] = {}  # device type -> whether the one-GEMM sum works there


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total (fp32) += a @ b. In the compute dtype the product would be rounded to it and
    added by one more pass over total (a 256 MiB fp32 matrix at the large preset, per chunk);
    where BLAS takes an fp32 output for bf16/fp16 inputs (CUDA: addmm's out_dtype), one GEMM
    adds its fp32 result into total (beta = 1). Checked once per device type on a small case."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
        return
    adds_in_place = _ADDS_IN_PLACE.get(a.device.type)
    if adds_in_place is None:
        adds_in_place = _probe_adds_in_place(a)
    if adds_in_place:
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    else:
        total += a @ b


def _probe_adds_in_place(like: torch.Tensor) -> bool:
    """Does addmm(acc, a, b, out_dtype=fp32, out=acc) add a @ b into acc on like's device?"""
    if like.is_cuda and torch.cuda.is_current_stream_capturing():
        return False  # (no answer without a sync; asked again outside the capture)
    try:
        acc = torch.ones(2, 2, device=like.device)
        a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=like.device, dtype=like.dtype)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
        works = acc.tolist() == [[8.0, 11.0], [16.0, 23.0]]
    except (RuntimeError, NotImplementedError, TypeError):
        works = False
    _ADDS_IN_PLACE[like.device.type] = works
    return works


class LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients; backward scales them. The chunk loop
    runs in Python (a few iterations): under torch.compile call it outside the compiled
    graph (torch.compiler.disable), where it launches the kernel eagerly."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk_rows):
        loss, grad_h, grad_w = linear_cross_entropy_forward(h, weight, targets, chunk_rows)
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of h @ weight^T against targets (Triton kernel, chunked): the same
    loss as F.cross_entropy(F.linear(h, weight).float(), targets) without its whole logits.
    h (..., d) in the compute dtype (under autocast, the weight is cast to it); targets (...)."""
    return common.apply(LinearCrossEntropy, h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1),
                        chunk_rows)
