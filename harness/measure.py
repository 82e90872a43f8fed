"""Statistics of step timings, memory readings and the gradient-flow guard."""
from __future__ import annotations

import resource
import sys

import torch

from .errors import GradientFlowError


def summarize(samples_ms: list[float]) -> dict:
    """Median and 10th/90th percentiles: robust to the odd slow step."""
    if not samples_ms:
        return {"median": None, "p10": None, "p90": None, "mean": None, "n": 0}
    t = torch.tensor(samples_ms, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"median": q[1], "p10": q[0], "p90": q[2], "mean": t.mean().item(), "n": len(samples_ms)}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict:
    mb = 1024 * 1024
    if device.type == "cuda":
        return {"peak_allocated_mb": torch.cuda.max_memory_allocated(device) / mb,
                "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / mb}
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_mb": rss / (mb if sys.platform == "darwin" else 1024)}


def check_gradient_flow(model: torch.nn.Module) -> int:
    """Every trainable parameter must have a finite, non-zero gradient.

    A custom kernel that writes its output into a fresh tensor without an
    autograd.Function silently cuts the graph: everything before it gets no
    gradient, backward becomes nearly free, and the 'speed-up' is fake. This
    check, run after the first step, makes that impossible to miss.
    Returns the number of parameters checked.
    """
    missing, bad = [], []
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for name, p in params:
        if p.grad is None:
            missing.append(name)
        elif not bool(torch.isfinite(p.grad).all()) or not bool(p.grad.abs().sum() > 0):
            bad.append(name)
    if missing or bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(params)} parameters got no gradient "
                         f"({_some(missing)})")
        if bad:
            parts.append(f"{len(bad)} have zero or non-finite gradients ({_some(bad)})")
        raise GradientFlowError("gradient-flow guard: " + "; ".join(parts) +
                                " - is the autograd graph cut by a kernel without backward?")
    return len(params)


def _some(names: list[str], shown: int = 4) -> str:
    more = f", ... +{len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
