"""What a training step is built from besides the model: the AdamW a run asks for and
activation checkpointing. The trainer builds its steps from them, and the memory model's
trace of a real step (analysis_tools.memory.trace_step) builds the very same step."""
from __future__ import annotations

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


def make_optimizer(model: torch.nn.Module, settings, device: torch.device,
                   masters: dict | None = None):
    """settings: what the run asked for (its learning_rate and optimizer)."""
    kwargs = {"lr": settings.learning_rate, "betas": (0.9, 0.95), "weight_decay": 0.1}
    if settings.optimizer == "master":
        return master_weights.MasterWeightAdamW(model.parameters(), masters, **kwargs)
    if settings.optimizer == "fused" and device.type == "cuda":
        kwargs["fused"] = True
    elif settings.optimizer in ("foreach", "fused"):
        kwargs["foreach"] = True  # fused AdamW is GPU-only in older torch; foreach is close
    return torch.optim.AdamW(model.parameters(), **kwargs)
