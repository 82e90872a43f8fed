"""--shard-optimizer: data parallelism for --optimizer master with the optimizer sharded
across the ranks (ZeRO stage 1, Rajbhandari et al., 2020), in place of DDP.

DDP all-reduces every gradient so that every rank can run the same full optimizer step:
N ranks then update all the weights, N times the same work. An all-reduce is a
reduce-scatter followed by an all-gather (that is how NCCL's ring runs it), so the same
bytes can carry a cheaper step:

  1. after the backward, reduce-scatter the bf16 gradients: rank r receives the average
     of its 1/N slice of them;
  2. rank r updates only that slice: its 1/N of the fp32 master weights and of the AdamW
     moments, which it alone keeps (1/N of the optimizer's memory);
  3. all-gather the updated bf16 weights: every rank holds the whole model again.

The same bytes as DDP's all-reduce, 1/N of the optimizer's work and memory. What it gives
up is DDP's overlap: the gradients move after the backward, not beside it. Where overlap
hides little (the scaling table in docs/MULTI_GPU.md: `+ms vs 1 GPU` against `comm ms
alone`), that costs little.

The bf16 weights live in one flat buffer that the parameters are views of, so the
all-gather writes the model in place; the gradients are copied into a second flat buffer
for the reduce-scatter. The fp32 parameters (embeddings and norms, their own masters, a
small part of the model) are all-reduced and updated on every rank, as before. The maths is
--optimizer master's under DDP: the gradients are divided by N and summed in bf16, then
the same AdamW update (tests/test_distributed.py compares the two).
"""
from __future__ import annotations

import math

import torch

from harness import master_weights


def flatten_low_precision(model: torch.nn.Module, dtype=torch.bfloat16, world_size: int = 1):
    """Make every `dtype` parameter a view of one flat buffer, padded to a multiple of
    world_size: (buffer, its parameters in order). Call before torch.compile: compiled code
    and CUDA graphs read the parameters at the addresses they have then."""
    params = [p for p in model.parameters() if p.requires_grad and p.dtype == dtype]
    total = sum(p.numel() for p in params)
    flat = torch.zeros(math.ceil(total / world_size) * world_size, dtype=dtype,
                       device=params[0].device if params else None)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.data.flatten())
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat, params


class ShardedMasterAdamW(torch.optim.Optimizer):
    """harness.master_weights.MasterWeightAdamW's update on this rank's slice of the flat
    bf16 weights, between a reduce-scatter of the gradients and an all-gather of the
    weights. `flat` and `low` are flatten_low_precision's; `masters` is
    split_master_weights' {bf16 parameter: its fp32 master} (only this rank's slice of them
    is kept); `dist` is torch.distributed with its process group initialised."""

    def __init__(self, params, flat: torch.Tensor, low: list, masters: dict, dist,
                 lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.dist, self.low = dist, low
        self.world, rank = dist.get_world_size(), dist.get_rank()
        low_ids = {id(p) for p in low}
        self.full = [p for group in self.param_groups for p in group["params"]
                     if id(p) not in low_ids]  # fp32: their own masters, updated on every rank
        shard = flat.numel() // self.world
        mine = slice(rank * shard, (rank + 1) * shard)
        self.weights, self.weight_shard = flat, flat[mine]  # a view: the update writes the model
        self.grads = torch.zeros_like(flat)
        self.grad_shard = torch.empty_like(self.weight_shard)
        fp32 = torch.cat([masters[p].flatten() for p in low] +
                         [flat.new_zeros(flat.numel() - sum(p.numel() for p in low), dtype=torch.float32)])
        self.master_shard = fp32[mine].clone()
        del fp32
        for p in low:  # the full fp32 copies are no longer needed: this rank keeps its slice
            masters.pop(p, None)
        self.state_lists = [[torch.zeros_like(t) for t in [self.master_shard, *self.full]]
                            for _ in range(2)]  # exp_avg, exp_avg_sq
        self.step_count = torch.zeros(1, dtype=torch.float32, device=flat.device)
        on_gpu = flat.is_cuda
        self._update = (master_weights._compiled_or_eager(master_weights.adamw_step) if on_gpu
                        else master_weights.adamw_step)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # 1. this rank's slice of the averaged gradients: divided by N first, as DDP does
        n = sum(p.numel() for p in self.low)
        torch.cat([p.grad.flatten() for p in self.low], out=self.grads[:n])
        self.grads.div_(self.world)
        self.dist.reduce_scatter_tensor(self.grad_shard, self.grads)
        if self.full:  # the fp32 parameters' gradients, averaged whole on every rank
            small = torch.cat([p.grad.flatten() for p in self.full]).div_(self.world)
            self.dist.all_reduce(small)
            for p, averaged in zip(self.full, small.split([p.numel() for p in self.full])):
                p.grad.copy_(averaged.view_as(p.grad))
        # 2. AdamW on this rank's slice of the masters, refreshing its slice of the weights
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self._update([self.master_shard, *self.full], [self.grad_shard, *(p.grad for p in self.full)],
                     *self.state_lists, [self.weight_shard], self.step_count,
                     lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                     weight_decay=group["weight_decay"])
        # 3. every rank's updated slice to every rank: the whole model, in place
        self.dist.all_gather_into_tensor(self.weights, self.weight_shard)
        return loss
