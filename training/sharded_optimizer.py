"""--shard-optimizer: data parallelism with the optimizer sharded across the ranks (ZeRO
stage 1, Rajbhandari et al., 2020), in place of DDP.

DDP all-reduces every gradient so that every rank can run the same full optimizer step:
N ranks then update all the weights, N times the same work. An all-reduce is a
reduce-scatter followed by an all-gather (that is how NCCL's ring runs it), so the same
bytes can carry a cheaper step:

  1. after the backward, reduce-scatter the gradients: rank r receives the average of its
     1/N slice of them;
  2. rank r updates only that slice, with AdamW moments for it alone (1/N of the
     optimizer's memory);
  3. all-gather the updated weights: every rank holds the whole model again.

The same bytes as DDP's all-reduce, 1/N of the optimizer's work and memory. What it gives
up is DDP's overlap: the gradients move after the backward, not beside it. Where overlap
hides little (the scaling table in docs/MULTI_GPU.md: `+ms vs 1 GPU` against `comm ms
alone`), that costs little. Under torch.compile the model also stays one graph, as on one
GPU: no DDP buckets to cut it into pieces.

The weights live in one flat buffer that the parameters are views of, so the update and
the all-gather write the model in place; the gradients are copied into a second flat buffer
for the reduce-scatter. With --optimizer master the flat buffer holds the bf16 weights and
each rank keeps the fp32 masters of its slice only; the fp32 parameters outside nn.Linear
(embeddings, norms: their own masters, a small part of the model) are all-reduced and
updated on every rank, as before. The maths is that of DDP with the same optimizer: the
gradients are divided by N and summed, then the same AdamW update
(tests/test_distributed.py compares the two).
"""
from __future__ import annotations

import math

import torch

from harness import master_weights


def flatten_parameters(model: torch.nn.Module, dtype: torch.dtype, world_size: int = 1):
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


class ShardedAdamW(torch.optim.Optimizer):
    """AdamW (harness.master_weights.adamw_step, torch.optim.AdamW's formula) on this rank's
    slice of the flat weights, between a reduce-scatter of the gradients and an all-gather
    of the weights. `flat` and `flat_params` are flatten_parameters'. `masters`: with
    --optimizer master, split_master_weights' {bf16 parameter: its fp32 master}, of which
    only this rank's slice is kept; None when the flat weights are fp32 and their own
    masters. `dist` is torch.distributed with its process group initialised, or None for
    one process: one shard, the whole model, and nothing to send (the 1-GPU baseline of the
    sharded runs, the same update code)."""

    def __init__(self, params, flat: torch.Tensor, flat_params: list, masters: dict | None, dist,
                 lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.dist, self.flat_params = dist, flat_params
        self.used = sum(p.numel() for p in flat_params)  # the flat buffer past it is padding
        self.world, rank = (dist.get_world_size(), dist.get_rank()) if dist else (1, 0)
        flat_ids = {id(p) for p in flat_params}
        # the fp32 parameters beside bf16 flat weights: updated whole on every rank
        self.others = [p for group in self.param_groups for p in group["params"]
                       if p.requires_grad and id(p) not in flat_ids]
        shard = flat.numel() // self.world
        mine = slice(rank * shard, (rank + 1) * shard)
        self.weights, self.weight_shard = flat, flat[mine]  # a view: the update writes the model
        self.grads = torch.zeros_like(flat)
        self.grad_shard = torch.empty_like(self.weight_shard) if dist else self.grads
        if masters is None:  # fp32 weights: the shard is its own master
            self.master_shard, self.copies = self.weight_shard, []
        else:
            fp32 = torch.cat([masters[p].flatten() for p in flat_params] +
                             [flat.new_zeros(flat.numel() - self.used, dtype=torch.float32)])
            self.master_shard, self.copies = fp32[mine].clone(), [self.weight_shard]
            del fp32
            for p in flat_params:  # the full fp32 copies go: this rank keeps its slice
                masters.pop(p, None)
        self.moments = [[torch.zeros_like(t) for t in [self.master_shard, *self.others]]
                        for _ in range(2)]  # exp_avg, exp_avg_sq
        self.step_count = torch.zeros(1, dtype=torch.float32, device=flat.device)
        self._update = (master_weights.compiled_or_eager(master_weights.adamw_step) if flat.is_cuda
                        else master_weights.adamw_step)  # as MasterWeightAdamW runs it

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # 1. this rank's slice of the averaged gradients: divided by N first, as DDP does
        torch.cat([p.grad.flatten() for p in self.flat_params], out=self.grads[:self.used])
        if self.dist is not None:
            self.grads.div_(self.world)
            self.dist.reduce_scatter_tensor(self.grad_shard, self.grads)
        if self.others and self.dist is not None:  # their gradients, averaged whole on every rank
            small = torch.cat([p.grad.flatten() for p in self.others]).div_(self.world)
            self.dist.all_reduce(small)
            for p, averaged in zip(self.others, small.split([p.numel() for p in self.others])):
                p.grad.copy_(averaged.view_as(p.grad))
        # 2. AdamW on this rank's slice (and the others), refreshing its slice of the weights
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self._update([self.master_shard, *self.others], [self.grad_shard, *(p.grad for p in self.others)],
                     *self.moments, self.copies, self.step_count,
                     lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                     weight_decay=group["weight_decay"])
        # 3. every rank's updated slice to every rank: the whole model, in place
        if self.dist is not None:
            self.dist.all_gather_into_tensor(self.weights, self.weight_shard)
        return loss
