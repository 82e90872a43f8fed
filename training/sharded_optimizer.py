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
up is DDP's overlap with the backward: the gradients move after it, not beside it. Where
that overlap hides little (the scaling table in docs/MULTI_GPU.md: `+ms vs 1 GPU` against
`comm ms alone`), that costs little, and the step wins a different overlap back: the flat
buffer is cut into CHUNKS pieces, each with a slice per rank, and the update of one piece
runs on the GPU's compute stream while NCCL's stream reduce-scatters the next piece and
all-gathers the one before. Under torch.compile the model also stays one graph, as on one
GPU: no DDP buckets to cut it into pieces. With master weights that wins (every version's
rows at its best in that table), so there it is the default (training/parallel.py,
sharded_by_default).

The weights live in one flat buffer that the parameters are views of, so the update and
the all-gather write the model in place; the gradients are copied into a second flat buffer
for the reduce-scatter. With --optimizer master the flat buffer holds the bf16 weights and
each rank keeps the fp32 masters of its slices only; the fp32 parameters outside nn.Linear
(embeddings, norms: their own masters, a small part of the model) are all-reduced and
updated on every rank, as before. The maths is that of DDP with the same optimizer: the
gradients are averaged over the ranks (NCCL averages as it reduces; gloo divides by N and
sums, as DDP does), then the same AdamW update (tests/test_distributed.py compares the two).

--reduce-after-backward runs the same flat update unsharded (shard=False): every rank updates
all the weights, so no weight is gathered; each piece of the gradients is copied into the flat
buffer and sent at once, so the first all-reduce starts while the other pieces are copied, and
each piece is updated as soon as its all-reduce lands while NCCL reduces the next. Where the
weights are fp32 (plain --compile) that is what pays: sharded, the all-gather would move fp32
weights, twice the bytes of the bf16 gradients it replaces. Under bf16 autocast the gradients
travel in bf16 (`wire`): the linear layers' weight gradients come out of bf16 matrix products,
so only their sum is rounded, and the all-reduce moves half the bytes of fp32.
"""
from __future__ import annotations

import math

import torch

from harness import master_weights


# Pieces the flat buffer is updated in, each while the collectives of its neighbours run:
# enough for the update to hide under the communication, few enough that each collective
# stays large (tens of MiB at the medium size) and each piece one launch of the update.
CHUNKS = 4


def owned_slices(numel: int, world_size: int, chunks: int, rank: int) -> list[slice]:
    """Rank `rank`'s slice of each of `chunks` equal pieces of a flat buffer of `numel`
    elements (a multiple of world_size x chunks): the part of each piece it updates."""
    piece = numel // chunks
    share = piece // world_size
    return [slice(k * piece + rank * share, k * piece + (rank + 1) * share) for k in range(chunks)]


def piece_parts(sizes: list[int], pieces: int, piece: int) -> list[list[tuple[int, int, int]]]:
    """A flat buffer laid out from tensors of `sizes` elements and cut into `pieces` pieces of
    `piece` elements: for each piece, the (tensor index, start, stop) ranges that fill it, in
    order. A tensor that straddles a boundary fills the end of one piece and the start of the
    next; what no tensor fills is padding."""
    parts, offset = [[] for _ in range(pieces)], 0
    for i, size in enumerate(sizes):
        start = 0
        while start < size:
            k = (offset + start) // piece
            stop = min(size, (k + 1) * piece - offset)
            parts[k].append((i, start, stop))
            start = stop
        offset += size
    return parts


def flatten_parameters(model: torch.nn.Module, dtype: torch.dtype, world_size: int = 1):
    """Make every `dtype` parameter a view of one flat buffer, padded to a multiple of
    world_size x CHUNKS: (buffer, its parameters in order). Call before torch.compile:
    compiled code and CUDA graphs read the parameters at the addresses they have then."""
    params = [p for p in model.parameters() if p.requires_grad and p.dtype == dtype]
    total = sum(p.numel() for p in params)
    multiple = world_size * CHUNKS
    flat = torch.zeros(math.ceil(total / multiple) * multiple, dtype=dtype,
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
    slices of the flat weights, between a reduce-scatter of the gradients and an all-gather
    of the weights, piece by piece. `flat` and `flat_params` are flatten_parameters'.
    `masters`: with --optimizer master, split_master_weights' {bf16 parameter: its fp32
    master}, of which only this rank's slices are kept; None when the flat weights are fp32
    and their own masters. `dist` is torch.distributed with its process group initialised,
    or None for one process: one piece, the whole model, and nothing to send (the 1-GPU
    baseline of the sharded runs, the same update code). shard=False: every rank updates
    every piece after its all-reduce (--reduce-after-backward), the gradients sent as `wire`
    (default: the weights' dtype)."""

    def __init__(self, params, flat: torch.Tensor, flat_params: list, masters: dict | None, dist,
                 lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 shard: bool = True, wire: torch.dtype | None = None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.dist, self.flat_params = dist, flat_params
        self.used = sum(p.numel() for p in flat_params)  # the flat buffer past it is padding
        self.world, rank = (dist.get_world_size(), dist.get_rank()) if dist else (1, 0)
        # with nothing to send there is nothing to overlap: one piece, one update launch
        self.chunks = CHUNKS if dist else 1
        # NCCL averages as it reduces; gloo (the CPU tests) sums what was divided first
        self.average = dist is not None and dist.get_backend() == "nccl"
        flat_ids = {id(p) for p in flat_params}
        # the fp32 parameters beside bf16 flat weights: updated whole on every rank
        self.others = [p for group in self.param_groups for p in group["params"]
                       if p.requires_grad and id(p) not in flat_ids]
        self.shard = shard and dist is not None
        mine = owned_slices(flat.numel(), self.world if self.shard else 1, self.chunks,
                            rank if self.shard else 0)
        share = mine[0].stop - mine[0].start
        self.weight_chunks = list(flat.chunk(self.chunks))  # what each all-gather fills
        self.weight_slices = [flat[s] for s in mine]  # views: the update writes the model
        # with nothing to send, nothing is rounded for the wire
        self.grads = torch.zeros_like(flat, dtype=wire if dist and wire else flat.dtype)
        self.grad_chunks = list(self.grads.chunk(self.chunks))
        self.piece_parts = piece_parts([p.numel() for p in flat_params], self.chunks,
                                       self.grad_chunks[0].numel())
        self.grad_shards = (list(torch.empty(self.chunks * share, dtype=self.grads.dtype,
                                             device=flat.device).split(share))
                            if self.shard else self.grad_chunks)
        if masters is None:  # fp32 weights: each slice is its own master
            self.master_shards, self.copies = self.weight_slices, [[] for _ in mine]
        else:
            fp32 = torch.cat([masters[p].flatten() for p in flat_params] +
                             [flat.new_zeros(flat.numel() - self.used, dtype=torch.float32)])
            self.master_shards = list(torch.cat([fp32[s] for s in mine]).split(share))
            self.copies = [[w] for w in self.weight_slices]
            del fp32
            for p in flat_params:  # the full fp32 copies go: this rank keeps its slices
                masters.pop(p, None)
        # exp_avg, exp_avg_sq: one buffer each for this rank's slices, and the others'
        self.moments = [list(torch.zeros(self.chunks * share, device=flat.device).split(share))
                        for _ in range(2)]
        self.other_moments = [[torch.zeros_like(p, dtype=torch.float32) for p in self.others]
                              for _ in range(2)]
        # adamw_step advances the step count it is given: one counter per update call, so
        # each advances once a step and all of them agree
        self.step_counts = [torch.zeros(1, dtype=torch.float32, device=flat.device)
                            for _ in range(self.chunks + 1)]
        self._update = (master_weights.compiled_or_eager(master_weights.adamw_step) if flat.is_cuda
                        else master_weights.adamw_step)  # as MasterWeightAdamW runs it

    def _adamw(self, masters, grads, moments, copies, step_count):
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self._update(masters, grads, *moments, copies, step_count, lr=group["lr"], beta1=beta1,
                     beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])

    def _op(self):
        return self.dist.ReduceOp.AVG if self.average else self.dist.ReduceOp.SUM

    def _reduce(self, k):
        """Piece k's gradients averaged into grad_shards[k]: this rank's slice (sharded), or
        all of them (in place)."""
        if not self.shard:
            return self.dist.all_reduce(self.grad_chunks[k], op=self._op(), async_op=True)
        return self.dist.reduce_scatter_tensor(self.grad_shards[k], self.grad_chunks[k], op=self._op(),
                                               async_op=True)

    def _fill_and_reduce(self, grads):
        """Unsharded: copy each piece's gradients into its place in the flat buffer and start
        its all-reduce at once, so NCCL starts after the first piece's copy, not after all of them.
        Every all-reduce is issued before the first update: an all-reduce issued after an
        update would wait for it (NCCL's stream waits for what the compute stream has queued)."""
        reduced = []
        for k, parts in enumerate(self.piece_parts):
            used = sum(b - a for _, a, b in parts)
            if parts:  # else all padding, zero since the buffer was made
                torch.cat([grads[i][a:b] for i, a, b in parts], out=self.grad_chunks[k][:used])
            if not self.average:
                self.grad_chunks[k].div_(self.world)
            reduced.append(self._reduce(k))
        return reduced

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        grads = [p.grad.flatten() for p in self.flat_params]
        if self.shard or self.dist is None:
            torch.cat(grads, out=self.grads[:self.used])
        small = torch.cat([p.grad.flatten() for p in self.others]) if self.others else None
        if self.dist is None:  # one process: the whole model, one update
            scattered, averaged = [None], None
        else:
            if not self.average:  # divided by N first, as DDP does
                if self.shard:
                    self.grads.div_(self.world)
                if small is not None:
                    small.div_(self.world)
            # the others' small all-reduce first: its update then runs beside the last gathers
            averaged = self.dist.all_reduce(small, op=self._op(), async_op=True) if small is not None else None
            # NCCL runs its collectives in the order they are issued: reduce-scatter k + 1
            # goes ahead of all-gather k, so NCCL has work while piece k is updated
            scattered = ([self._reduce(k) for k in range(min(2, self.chunks))] if self.shard
                         else self._fill_and_reduce(grads))
        gathered = []
        for k in range(self.chunks):
            if scattered[k] is not None:
                scattered[k].wait()  # on NCCL the compute stream waits, not the host
            self._adamw([self.master_shards[k]], [self.grad_shards[k]],
                        [[m[k]] for m in self.moments], self.copies[k], self.step_counts[k])
            if self.shard:  # every rank's updated slice of piece k to every rank
                gathered.append(self.dist.all_gather_into_tensor(
                    self.weight_chunks[k], self.weight_slices[k], async_op=True))
            if self.shard and k + 2 < self.chunks:
                scattered.append(self._reduce(k + 2))
        if self.others:  # the fp32 parameters beside: averaged whole on every rank, then updated
            if averaged is not None:
                averaged.wait()
                for p, g in zip(self.others, small.split([p.numel() for p in self.others])):
                    p.grad.copy_(g.view_as(p.grad))
            self._adamw(self.others, [p.grad for p in self.others], self.other_moments, [],
                        self.step_counts[-1])
        for work in gathered:
            work.wait()
        return loss
