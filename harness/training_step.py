"""What a training step is built from besides the model: the AdamW a run asks for,
activation checkpointing, and how the host runs the steps of an eager GPU run. The trainer
builds its steps from them, and the memory model's trace of a real step
(analysis_tools.memory.trace_step) builds the very same step."""
from __future__ import annotations

import contextlib
import gc

import torch

from . import master_weights


def enable_grad_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each transformer block in backward instead of storing its activations."""
    from torch.utils.checkpoint import checkpoint

    for block in model.layers:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def adamw_settings(settings) -> dict:
    """AdamW's hyperparameters, the same for every optimizer the runs choose from."""
    return {"lr": settings.learning_rate, "betas": (0.9, 0.95), "weight_decay": 0.1}


def make_optimizer(model: torch.nn.Module, settings, device: torch.device,
                   masters: dict | None = None):
    """settings: what the run asked for (its learning_rate and optimizer)."""
    kwargs = adamw_settings(settings)
    if settings.optimizer == "master":
        return master_weights.MasterWeightAdamW(model.parameters(), masters, **kwargs)
    if settings.optimizer == "fused" and device.type == "cuda":
        kwargs["fused"] = True
    elif settings.optimizer in ("foreach", "fused"):
        kwargs["foreach"] = True  # fused AdamW is GPU-only in older torch; foreach is close
    return torch.optim.AdamW(model.parameters(), **kwargs)


# ---- the host's side of an eager step ------------------------------------------------------
# An eager step at the workshop's sizes is paced by the host: Python and the dispatcher
# queue each kernel, and the GPU runs it in less time than that took. Two things the host
# does by default cost it time without buying anything in a one-GPU run:
#
# - The autograd engine runs a CUDA backward on its own worker thread, one per device. For
#   one GPU that thread adds no parallelism (the calling thread only waits in backward()),
#   but each backward hands its work over and back, and every backward written in Python
#   (an autograd.Function: V3's kernels) runs on the worker, taking the interpreter's lock
#   from the waiting thread. Running the backward on the calling thread skips both.
# - Python's cyclic garbage collector runs whenever enough container objects have been
#   made since the last run: every few steps of a model that makes thousands of small
#   objects per step (autograd contexts, argument tuples), at a step it happens to fall
#   in, for up to a few milliseconds. Switched off for the loop and run every
#   GC_EVERY_STEPS steps instead, it costs the same steps each time and the others none.
#   (Reference counting still frees almost everything the moment it is unused.)
GC_EVERY_STEPS = 50


def host_settings(device: torch.device, world_size: int, compiled: bool):
    """Where the loop's steps run as above: eager runs on one GPU. Compiled runs keep the
    defaults (their backward is one node, and CUDA graph trees expect the worker thread),
    as do DDP and FSDP runs (their gradient hooks run on the engine's threads) and CPU
    runs (the CPU backward runs on the calling thread already). Restores both on exit."""
    if device.type != "cuda" or world_size > 1 or compiled:
        return contextlib.nullcontext()
    return _eager_host()


@contextlib.contextmanager
def _eager_host():
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.autograd.set_multithreading_enabled(False):
            yield
    finally:
        if was_enabled:
            gc.enable()


def step_collect(step: int) -> None:
    """The collector's run inside the loop, every GC_EVERY_STEPS steps (a no-op while the
    collector is on: it runs by itself then)."""
    if not gc.isenabled() and step % GC_EVERY_STEPS == GC_EVERY_STEPS - 1:
        gc.collect(1)
