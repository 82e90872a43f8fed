"""Launch configurations: which one each kernel may run with on which GPU.

How a launch configuration is chosen (common.launch runs what this file chooses):
  1. a forced configuration, if the user pinned one (the exercise knob, below);
  2. for the memory-bound kernels (RMSNorm, RoPE, SwiGLU), the one configuration their
     rule gives (in rmsnorm.py, rope.py and swiglu.py), worked out once per shape - nothing
     to time, a whole row per program is already close to the copy bandwidth - and
     launched directly, with no autotuner in the call;
  3. otherwise (attention) Triton's autotuner,

         triton.autotune(configs=<this target's list>, key=[...],
                         prune_configs_by={"early_config_prune": <prune>})

     whose prune runs once per key (sizes, dtypes) and keeps the candidates of the target's
     GPU family for this head size (attention_tables.py: none of them spills registers
     there) whose tiles fit in the target's shared memory (LDS on AMD). More than one left: the
     autotuner times them on the first call with a new key and keeps the fastest. AUTOTUNE
     off (V3_AUTOTUNE=0), or in the CPU interpreter: the first that fits, no timing.

Forcing a configuration (exercise V3-3), for one kernel of KERNEL_NAMES:

    V3_ATTN_FWD_CONFIG="BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2" python ...
    kernels.FORCED_CONFIGS["attn_fwd"] = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4)

`chosen_configs()` (common.py) tells which configuration each kernel ran with last.
The target facts (Target, current_target) live in target.py, each kernel's candidates or
rule beside the kernel (attention's tables in attention_tables.py); common.py launches
kernels with what this file chooses.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

import triton

from . import target as gpu  # the target facts: gpu.triton_backend(), gpu.current_target(), ...
from .target import Target

KERNEL_NAMES = ("rmsnorm_fwd", "rmsnorm_bwd", "rope", "attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq",
                "swiglu_fwd", "swiglu_bwd", "cross_entropy")


class ForcedConfigs(dict):
    """Kernel name -> its pinned configuration (a dict, or the text of its V3_<KERNEL>_CONFIG
    variable); a pin wins over everything. Every change gives the mapping a new `version`:
    common.launch keys its bound launches on it, so a launch bound under other pins is never
    reused, and reading the pins costs nothing per call."""
    _versions = iter(range(1, 1 << 62))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = next(ForcedConfigs._versions)

    def _changed(self, result=None):
        self.version = next(ForcedConfigs._versions)
        return result

    def __setitem__(self, key, value):
        self._changed(super().__setitem__(key, value))

    def __delitem__(self, key):
        self._changed(super().__delitem__(key))

    def pop(self, *args):
        return self._changed(super().pop(*args))

    def popitem(self):
        return self._changed(super().popitem())

    def clear(self):
        self._changed(super().clear())

    def update(self, *args, **kwargs):
        self._changed(super().update(*args, **kwargs))

    def setdefault(self, key, default=None):
        return self._changed(super().setdefault(key, default))


FORCED_CONFIGS = ForcedConfigs()  # filled from the environment below (read_environment)
AUTOTUNE = os.environ.get("V3_AUTOTUNE", "1") != "0"  # 0: first fitting candidate, no timing


def usable_on(config: dict, target: Target) -> dict:
    """Drop compiler options the target lacks: AMD's keywords are an error for the
    NVIDIA compiler, and MFMA instruction shapes mean nothing without MFMA."""
    config = dict(config)
    if not target.mfma:
        config.pop("matrix_instr_nonkdim", None)
    if target.backend != "hip":
        config.pop("waves_per_eu", None)
    return config


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """How to choose the launch configuration of one kernel."""
    name: str
    configs: Optional[Callable[..., list]]  # (target[, width[, variant]]) -> the candidates
    #                                          (no width: all); None for a kernel with a rule
    shared_bytes: Callable[[dict, int, int], int]  # (config, width, elem bytes) -> estimate
    size: Callable[[dict, dict], tuple]  # (args, constexprs) -> (width, elem bytes[, variant])
    check: Callable[[dict], None] = lambda config: None  # ValueError for an impossible config
    rule: Optional[Callable[[Target, int, int], dict]] = None  # (target, width, elem bytes) ->
    #                                                    the one config of a memory-bound kernel


SPECS: dict[str, KernelSpec] = {}  # filled by rmsnorm.py, rope.py, attention_tiles.py, swiglu.py,
#                                    linear_cross_entropy.py


def candidates(spec: KernelSpec, target: Target, width: int, elem_bytes: int,
               variant: Optional[str] = None) -> list[dict]:
    """What the chooser may pick on `target` without a forced config: the rule's one
    config, or the candidates whose shared memory fits (the smallest if none does).
    variant: a compiled variant with lists of its own (attention: "rope"), else None."""
    if spec.rule is not None:
        return [usable_on(spec.rule(target, width, elem_bytes), target)]
    listed = (spec.configs(target, width) if variant is None
              else spec.configs(target, width, variant))
    configs = [usable_on(c, target) for c in listed]
    need = [spec.shared_bytes(c, width, elem_bytes) for c in configs]
    fitting = [c for c, n in zip(configs, need) if n <= target.shared_bytes]
    return fitting or [configs[need.index(min(need))]]


# ---- the forced-config hook ------------------------------------------------------------
ENV_NAMES = {name: f"V3_{name.upper()}_CONFIG" for name in KERNEL_NAMES}


def parse_config(text: str, source: str) -> dict:
    """'BLOCK_M=64,BLOCK_N=32,num_warps=4' -> {'BLOCK_M': 64, ...}"""
    config = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"{source}: bad item {item!r} in {text!r} (want NAME=INT, ...)")
        config[key.strip()] = int(value)
    return config


def read_environment() -> None:
    """Copy the V3_<KERNEL>_CONFIG variables into FORCED_CONFIGS (their text, parsed when
    used). Runs once when this module is imported and again in V3's preflight: a launch
    never reads the environment."""
    for kernel, name in ENV_NAMES.items():
        if os.environ.get(name):
            FORCED_CONFIGS[kernel] = os.environ[name]
        elif isinstance(FORCED_CONFIGS.get(kernel), str):  # the variable is gone: so is its pin
            del FORCED_CONFIGS[kernel]


def forced_setting(kernel: str):
    """What pins `kernel`'s configuration, unparsed: its FORCED_CONFIGS entry (a dict, or the
    text read from the environment), else None."""
    return FORCED_CONFIGS.get(kernel) or None


def forced_config(kernel: str) -> Optional[dict]:
    """The configuration the user pinned for `kernel` (FORCED_CONFIGS or env), else None."""
    setting = forced_setting(kernel)
    if setting is None or isinstance(setting, dict):
        return dict(setting) if setting else None
    return parse_config(setting, ENV_NAMES[kernel])


def check_config(kernel: str, config: dict, width: int, elem_bytes: int) -> dict:
    """Validate a hand-picked launch configuration (ValueError says why); return it
    with defaults filled in. width: head_dim for attention, hidden size for RMSNorm."""
    config, spec = dict(config), SPECS[kernel]
    spec.check(config)
    need = spec.shared_bytes(config, width, elem_bytes)
    if gpu.triton_backend() == "hip":
        lds = gpu.current_target().shared_bytes
        if need > lds:
            raise ValueError(f"{kernel}: config {config} needs ~{need // 1024} KiB of LDS, above "
                             f"the {lds // 1024} KiB an AMD GPU has per workgroup")
    config.setdefault("num_warps", 4)
    config.setdefault("num_stages", 1 if gpu.triton_backend() == "hip" else 2)
    return usable_on(config, gpu.current_target())


def allowed(spec: KernelSpec, target: Target, width: int, elem_bytes: int,
            variant: Optional[str] = None) -> list[dict]:
    """What may run for these sizes: the forced configuration (checked), else the candidates
    (a memory-bound kernel's: its rule's one)."""
    forced = forced_config(spec.name)
    if forced is not None:
        return [check_config(spec.name, forced, width, elem_bytes)]
    return candidates(spec, target, width, elem_bytes, variant)


# ---- the autotuner's prune ----------------------------------------------------------
def triton_config(config: dict) -> triton.Config:
    kwargs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    return triton.Config(kwargs, num_warps=config["num_warps"], num_stages=config["num_stages"])


def as_dict(config) -> dict:
    """A launch configuration as one dict: a triton.Config's kwargs with its num_warps and
    num_stages (a dict stays as it is)."""
    if isinstance(config, triton.Config):
        return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return config


def describe(config) -> str:
    config = as_dict(config)
    return ", ".join(f"{k}={v}" for k, v in config.items() if v is not None)


def early_prune(spec: KernelSpec, target: Target):
    """The autotuner's early_config_prune: what may run for these arguments."""
    def prune(configs, named_args, **constexprs):
        fitting = allowed(spec, target, *spec.size(named_args, constexprs))
        timed = AUTOTUNE and target.backend != "interpreter"  # nothing to time on a CPU
        return [triton_config(c) for c in (fitting if timed else fitting[:1])]
    return prune


read_environment()
