"""Shared harness of the tiny-LLaMA workshop: one CLI, config, data, timing,
FLOPs/MFU, memory, gradient guard and results JSON for every model version."""
from .cli import main
from .config import PRESETS, ModelConfig, llama_ffn_dim
from .errors import (GradientFlowError, NonFiniteLoss, OutOfMemory, UsageError,
                     WorkshopError)

__all__ = ["main", "ModelConfig", "PRESETS", "llama_ffn_dim", "WorkshopError", "UsageError",
           "OutOfMemory", "NonFiniteLoss", "GradientFlowError"]
