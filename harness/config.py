"""The facts every part of the workshop shares, each written once: the model
configuration and size presets, the versions, the precisions and the settings
of one training run.

All four versions build the *same* model from a `ModelConfig`; only the
implementation of its operations changes from version to version.

This module imports no torch (the command line's `--help` stays fast) and no
version: a version is loaded by its module name, only when it is needed.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field

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
    # The small configuration of AMD's TinyTransformer workshop (README): hidden 512,
    # 8 layers, seq 128, batch 8.
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


# ---------------------------------------------------------------- versions
@dataclass(frozen=True)
class Version:
    """Where a version lives. What it is (modes, switches, memory) is declared beside
    its model, in <folder>/spec.py: load_spec."""
    name: str    # what results, tables and --version flags call it: "v1"
    folder: str  # "version1_baseline"
    stem: str    # the script's file name without .py: "tiny_llama_v1"

    @property
    def module(self) -> str:
        """Import path: "version1_baseline.tiny_llama_v1"."""
        return f"{self.folder}.{self.stem}"

    @property
    def script(self) -> str:
        """Path from the repository root: "version1_baseline/tiny_llama_v1.py"."""
        return f"{self.folder}/{self.stem}.py"


VERSIONS: dict[str, Version] = {v.name: v for v in (
    Version("v1", "version1_baseline", "tiny_llama_v1"),
    Version("v2", "version2_fused", "tiny_llama_v2"),
    Version("v3", "version3_triton", "tiny_llama_v3"),
    Version("v4", "version4_sdpa", "tiny_llama_v4"),
)}

# Every other version starts from this version's weights: same model, same parameters.
REFERENCE_VERSION = "v1"


def load_version(name: str):
    """Import a version's module (KeyError: no such version; ModuleNotFoundError: not here)."""
    return importlib.import_module(VERSIONS[name].module)


def load_spec(name: str):
    """A version's VersionSpec (harness/spec.py), without importing torch or its model
    (KeyError: no such version)."""
    return importlib.import_module(f"{VERSIONS[name].folder}.spec").SPEC


def reference_weights(config: ModelConfig, seed: int) -> dict:
    """The reference version's initial weights for `config` under `seed`.

    The trainer is handed this function: it never imports a version itself.
    """
    import torch

    torch.manual_seed(seed)
    return load_version(REFERENCE_VERSION).build_model(config).state_dict()


# ---------------------------------------------------------------- precisions
@dataclass(frozen=True)
class Precision:
    """One --precision choice: the dtype of the matmul operands, what one value
    of an activation costs in memory, and whether the forward runs under autocast."""
    dtype_name: str  # a torch dtype, by name (torch is imported only when asked)
    bytes: int
    autocast: bool   # True: parameters stay fp32, autocast computes in `dtype`

    @property
    def dtype(self):
        import torch
        return getattr(torch, self.dtype_name)

    @property
    def autocast_dtype(self):
        """The dtype torch.autocast computes in, or None for a plain fp32/tf32 run."""
        return self.dtype if self.autocast else None


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("float32", 4, autocast=False),
    # tf32: fp32 storage, matrix units with a 10-bit mantissa for the matmuls.
    "tf32": Precision("float32", 4, autocast=False),
    "bf16": Precision("bfloat16", 2, autocast=True),
    "fp16": Precision("float16", 2, autocast=True),
}


def parse_precisions(text: str) -> list[str]:
    """A comma-separated list of PRECISIONS names (a command-line value), checked."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in PRECISIONS]
    if bad or not values:
        raise UsageError(f"precisions must be among {', '.join(PRECISIONS)} (got {text!r})")
    return values


# ---------------------------------------------------------------- one run
@dataclass
class RunSettings:
    """Everything one training run needs, built from the command line by training/cli.py."""
    version: str
    model: ModelConfig
    preset: str | None
    batch_size: int  # sequences per micro-step on one device
    seq_len: int
    num_steps: int
    warmup_steps: int
    learning_rate: float
    precision: str | None  # None = pick the default for the device
    device: str
    seed: int
    deterministic: bool
    data: str
    data_path: str | None
    grad_checkpoint: bool
    grad_accum: int
    compile: bool
    compile_mode: str
    optimizer: str
    measure_peak: bool
    output: str | None
    quiet: bool
    log_every: int
    profile: str | None = None
    profile_dir: str | None = None
    fsdp: bool = False
    ddp_bucket_mb: float | None = None   # data-parallel knobs: see training/parallel.py
    ddp_comm_hook: str = "none"
    compile_ddp: str = "split"
    ddp_static_graph: bool = False
    shard_optimizer: bool = False        # the command line picks it: training/parallel.py sharded_by_default
    reduce_after_backward: bool = False  # and this: reduced_after_backward_by_default
    fsdp_reshard_after_forward: bool = True
    fsdp_param_dtype: str = "fp32"
    comm_priority: str = "high"
    host_probe: int = 0  # steps after the timed ones, each queued behind a GPU wait (HostProbe)
    command: str = ""
    options: dict = field(default_factory=dict)

    def global_batch_size(self, world_size: int = 1) -> int:
        """Sequences of one optimizer step over all ranks: what throughput and MFU count."""
        return self.batch_size * self.grad_accum * world_size
