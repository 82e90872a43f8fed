"""AdamW with fp32 master weights: the model's matmul weights are stored in bf16.

`--optimizer master` (bf16 only). Why it is faster - the arithmetic is the same:

Under autocast every linear layer keeps an fp32 weight and casts it to bf16 on
every call (torch.compile may keep that copy for backward or cast again), and
every weight gradient, computed in bf16, is widened to fp32 before it reaches
`.grad`. Passes over every weight that do no arithmetic: a few percent of a
compiled medium-preset step, which the "master weights" rows of docs/RESULTS.md
measure.

Here the model holds the bf16 copy and the optimizer holds the fp32 "master"
copy (mixed-precision training, Micikevicius et al., 2018). One compiled update
reads the bf16 gradient, the fp32 master and the two moments once, and writes
master, moments and the refreshed bf16 weight once: the casts ride along with
memory traffic the update needs anyway.

Same numbers as autocast, by construction: autocast multiplies by bf16(W),
which is exactly the weight stored here; the weight gradient is the same bf16
GEMM output, widened inside the update instead of before it; the update is
torch.optim.AdamW's formula (tests/test_master_weights.py checks all three).
Two places where bf16 gradients would add up in bf16 and so round differently
are kept out: --grad-accum > 1 is refused, and weights shared between layers
(tied embeddings) or used outside nn.Linear (embeddings, norms) stay fp32.
Under DDP the bf16 gradients are averaged in bf16, as with --ddp-comm-hook bf16.
"""
from __future__ import annotations

import sys

import torch
from torch import nn


def split_master_weights(model: nn.Module, dtype=torch.bfloat16) -> dict:
    """Store nn.Linear weights and biases in `dtype`; return {param: its fp32 master}.

    Call before wrapping the model (DDP fixes its gradient buckets' dtypes, and
    torch.compile its guards, when they wrap it). The Parameter objects stay
    the same, so `model.parameters()` still lists every parameter once.
    """
    holders = {}  # parameter -> the modules that hold it
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(param, []).append(module)
    masters = {}
    for param, modules in holders.items():
        if (len(modules) == 1 and isinstance(modules[0], nn.Linear)
                and param.dtype == torch.float32):
            masters[param] = param.detach().clone()
            param.data = param.data.to(dtype)
    return masters


def adamw_step(masters, grads, exp_avgs, exp_avg_sqs, copies, step, *,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float):
    """One AdamW step (torch.optim.AdamW's formula) on fp32 masters, in place.

    grads may be bf16: they are widened here, inside the one pass. copies[i]
    is the bf16 weight of masters[i] (copies is shorter than masters: the
    fp32 parameters at the end are their own masters). step is a 1-element
    fp32 tensor, so a compiled version does not recompile every step.
    """
    step.add_(1)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step).sqrt()
    for i, (master, grad, exp_avg, exp_avg_sq) in enumerate(
            zip(masters, grads, exp_avgs, exp_avg_sqs)):
        grad = grad.float()
        master.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        master.sub_((lr / bias_correction1) * exp_avg / denom)
        if i < len(copies):
            copies[i].copy_(master)


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW over fp32 masters that also refreshes the model's bf16 weights.

    params: every parameter of the model; masters: split_master_weights'
    result (parameters not in it are fp32 and are their own masters).
    On a GPU the whole update is compiled (torch.compile) into one kernel per
    tensor; on the CPU, or if compiling fails, the same code runs eagerly.
    """

    def __init__(self, params, masters: dict, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.masters = masters
        on_gpu = any(p.is_cuda for group in self.param_groups for p in group["params"])
        self._update = compiled_or_eager(adamw_step) if on_gpu else adamw_step

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # The bf16 weights first (stable sort): copies[i] is the weight of masters[i].
            ordered = sorted((p for p in group["params"] if p.grad is not None),
                             key=lambda p: p not in self.masters)
            if not ordered:
                continue
            # One step counter per group, shared by its parameters' states.
            step = next((self.state[p]["step"] for p in ordered if self.state[p]), None)
            if step is None:
                step = torch.zeros(1, dtype=torch.float32, device=ordered[0].device)
            for p in ordered:
                state = self.state[p]
                if not state:
                    master = self.masters.get(p, p)
                    state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(master,
                                                           memory_format=torch.preserve_format)
                    state["step"] = step
            beta1, beta2 = group["betas"]
            self._update([self.masters.get(p, p) for p in ordered], [p.grad for p in ordered],
                         [self.state[p]["exp_avg"] for p in ordered],
                         [self.state[p]["exp_avg_sq"] for p in ordered],
                         [p for p in ordered if p in self.masters], step,
                         lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                         weight_decay=group["weight_decay"])
        return loss


def compiled_or_eager(fn):
    """torch.compile(fn), falling back to fn (with one line) if compiling fails."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    state = {"fn": compiled}

    def call(*args, **kwargs):
        try:
            return state["fn"](*args, **kwargs)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any compiler failure: run the same maths eagerly
            if state["fn"] is fn:
                raise
            print(f"note: --optimizer master runs uncompiled ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''}); slower, same maths",
                  file=sys.stderr)
            state["fn"] = fn
            return fn(*args, **kwargs)

    return call
