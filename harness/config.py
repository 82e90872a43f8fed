"""Model configuration and size presets shared by every version.

All four versions build the *same* model from a `ModelConfig`; only the
implementation of its operations changes from version to version.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import UsageError


def llama_ffn_dim(hidden_dim: int, multiple_of: int = 64) -> int:
    """SwiGLU hidden size as in LLaMA: 2/3 of 4*hidden, rounded up to a multiple.

    SwiGLU has three weight matrices instead of two, so LLaMA shrinks the inner
    size to 8/3*hidden to keep the parameter count of a 4*hidden MLP. Rounding
    to a multiple of 64 keeps the GEMMs friendly to tensor/matrix cores.
    """
    raw = int(8 * hidden_dim / 3)
    return multiple_of * ((raw + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    hidden_dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    ffn_dim: int = 0  # 0 means "LLaMA default", filled in by __post_init__
    max_seq_len: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self):
        if self.ffn_dim == 0 and self.hidden_dim > 0:
            object.__setattr__(self, "ffn_dim", llama_ffn_dim(self.hidden_dim))
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    def validate(self) -> None:
        for name in ("vocab_size", "hidden_dim", "num_layers", "num_heads",
                     "num_kv_heads", "ffn_dim", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            raise UsageError("norm_eps and rope_theta must be > 0")
        if self.hidden_dim % self.num_heads:
            raise UsageError(f"hidden_dim {self.hidden_dim} is not divisible by "
                             f"num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise UsageError(f"num_heads {self.num_heads} is not divisible by "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise UsageError(f"head_dim {self.head_dim} must be even for RoPE")

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    batch_size: int
    seq_len: int
    description: str


PRESETS: dict[str, Preset] = {
    "tiny": Preset(ModelConfig(vocab_size=256, hidden_dim=64, num_layers=2, num_heads=4,
                               num_kv_heads=2, max_seq_len=64),
                   batch_size=4, seq_len=32, description="seconds on a laptop CPU"),
    # The public precedent's small configuration (hidden 512, 8 layers, seq 128, batch 8).
    "small": Preset(ModelConfig(vocab_size=1000, hidden_dim=512, num_layers=8, num_heads=8,
                                num_kv_heads=8, max_seq_len=128),
                    batch_size=8, seq_len=128, description="launch-bound on a GPU"),
    "medium": Preset(ModelConfig(vocab_size=1000, hidden_dim=1024, num_layers=12, num_heads=16,
                                 num_kv_heads=16, max_seq_len=512),
                     batch_size=16, seq_len=512, description="the main GPU benchmark"),
    "large": Preset(ModelConfig(vocab_size=32000, hidden_dim=2048, num_layers=16, num_heads=16,
                                num_kv_heads=8, max_seq_len=2048),
                    batch_size=8, seq_len=2048, description="fills a 64+ GiB GPU (~1 B params)"),
}
