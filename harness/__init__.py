"""The ground of the tiny-LLaMA workshop: config, data, device, precision, timing,
FLOPs/MFU, probes, memory, gradient guard and results JSON for every model version.
It imports nothing from the packages built on it (training/, profiling/, benchmarks/,
analysis_tools/, tools/, the versions)."""
from .config import PRESETS, ModelConfig, llama_ffn_dim
from .errors import (GradientFlowError, NonFiniteLoss, OutOfMemory, UsageError,
                     WorkshopError)

__all__ = ["ModelConfig", "PRESETS", "llama_ffn_dim", "WorkshopError", "UsageError",
           "OutOfMemory", "NonFiniteLoss", "GradientFlowError"]
