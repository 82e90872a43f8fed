"""The communication probe of a data-parallel run: how long do one step's
collectives take on this machine's interconnect when nothing else runs?

harness.parallel.DataParallel calls measure_communication after training, on
every rank together; rank 0 records the result in the run's `distributed`
section ("Communication alone" in docs/MULTI_GPU.md). Against it,
`python -m analysis_tools scaling` sets how much of the multi-GPU step was
communication that backward could not hide.
"""
from __future__ import annotations

import math
import time

import torch

from harness import device as dev
from harness.config import PRECISIONS
from harness.parallel import BUCKET_MB

BUS_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (N-1)/N, as nccl-tests


def measure_communication(group, reps: int = 10) -> dict:
    """Time the collectives of one step alone, after training.

    `group` is the trainer's harness.parallel.DataParallel: its process group
    (`dist`), device, world size, wrapper kind and the gradients it wrapped.

    Method: one gradient-bucket-sized buffer (--ddp-bucket-mb of the
    gradients' dtype for DDP - fp32, or bf16 with --optimizer master - 25 MB
    of fp32 for FSDP2, or the whole model if smaller; in 16 bits with
    --ddp-comm-hook), timed over `reps` calls after two warm-up calls, the
    slowest rank's mean, scaled by the number of buckets the model fills.
    DDP: one all-reduce of all gradients per step. FSDP2: two all-gathers of
    the weights (forward and backward) and one reduce-scatter of the gradients.
    This is the cost if nothing overlapped; DDP hides most of it behind
    backward, and the part it cannot hide is (multi-GPU step - 1-GPU step):
    `python -m analysis_tools scaling` prints both.
    Bus bandwidth follows the nccl-tests convention (comparable across N).
    """
    n = group.world_size
    ddp = group.kind == "ddp"
    hooked = ddp and group.comm_hook != "none"  # --ddp-comm-hook names a precision
    wire = (PRECISIONS[group.comm_hook].dtype if hooked else
            group.gradient_dtype if ddp else torch.float32)
    # DDP fills its buckets in the gradients' own dtype; a hook converts each bucket after.
    held = (group.gradient_dtype if ddp else torch.float32).itemsize
    numel = min(group.gradient_numel, int((group.bucket_mb if ddp else BUCKET_MB) * 2**20 // held))
    numel = max(n, numel - numel % n)  # divisible by n for all-gather / reduce-scatter
    buckets = math.ceil(group.gradient_numel / numel)
    full = torch.ones(numel, device=group.device, dtype=wire)
    shard = torch.ones(numel // n, device=group.device)
    if ddp:
        ops = {"all_reduce": _time(group, lambda: group.dist.all_reduce(full), reps)}
        per_step = ops["all_reduce"] * buckets
    else:
        # all_gather_single/reduce_scatter_single: the newer names (torch 2.13+)
        all_gather = getattr(group.dist, "all_gather_single", group.dist.all_gather_into_tensor)
        reduce_scatter = getattr(group.dist, "reduce_scatter_single",
                                 group.dist.reduce_scatter_tensor)
        ops = {"all_gather": _time(group, lambda: all_gather(full, shard), reps),
               "reduce_scatter": _time(group, lambda: reduce_scatter(shard, full), reps)}
        per_step = (2 * ops["all_gather"] + ops["reduce_scatter"]) * buckets
    nbytes = numel * full.element_size()
    busbw = {op: nbytes / ms / 1e6 * BUS_FACTOR[op] * (n - 1) / n for op, ms in ops.items()}
    return {"method": f"{reps} timed calls on an idle device, slowest rank, "
                      f"x {buckets} buckets; not overlapped with compute",
            "bucket_mib": nbytes / 2**20, "buckets": buckets,
            "gradient_mib": group.gradient_numel * held / 2**20,
            "ms_per_bucket": ops, "per_step_ms": per_step,
            "bus_bandwidth_gb_s_per_op": busbw,
            "bus_bandwidth_gb_s": next(iter(busbw.values()))}  # all-reduce / all-gather


def _time(group, collective, reps: int) -> float:
    for _ in range(2):  # the first calls set up connections and buffers
        collective()
    dev.synchronize(group.device)
    group.dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        collective()
    dev.synchronize(group.device)
    ms = torch.tensor([(time.perf_counter() - start) * 1000 / reps], device=group.device)
    group.dist.all_reduce(ms, op=group.dist.ReduceOp.MAX)
    return ms.item()
