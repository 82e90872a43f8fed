"""What the three kernel families share: the target GPU, the launch configurations
per target, the hook that forces one, and the operator registration.

How a launch configuration is chosen - one mechanism for every kernel:

    triton.autotune(configs=<this target's list>, key=[...],
                    prune_configs_by={"early_config_prune": <prune>})

The prune runs once per key (sizes, dtypes) and keeps what may run here:
  1. a forced configuration, if the user pinned one (the exercise knob, below);
  2. for the memory-bound kernels (RMSNorm, RoPE), the one configuration their
     rule gives - nothing to time, a whole row per program is already close to
     the copy bandwidth;
  3. otherwise the candidates of the target's GPU family for this head size
     (ATTENTION_CONFIGS: none of them spills registers there) whose tiles fit in
     the target's shared memory (LDS on AMD). More than one left: the autotuner times them on the first
     call with a new key and keeps the fastest. AUTOTUNE off (V3_AUTOTUNE=0),
     or in the CPU interpreter: the first that fits, no timing (quick start-up).

Forcing a configuration (exercise V3-3), for one kernel of KERNEL_NAMES:

    V3_ATTN_FWD_CONFIG="BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2" python ...
    kernels.FORCED_CONFIGS["attn_fwd"] = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4)

`chosen_configs()` tells which configuration each kernel ran with last.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Callable, Optional

import torch
import triton

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
KERNEL_NAMES = ("rmsnorm_fwd", "rmsnorm_bwd", "rope", "attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
FORCED_CONFIGS: dict[str, dict] = {}  # kernel name -> config dict; wins over everything
AUTOTUNE = os.environ.get("V3_AUTOTUNE", "1") != "0"  # 0: first fitting candidate, no timing
POISON_OUTPUTS = False  # tests set True: outputs start as NaN, so unwritten elements show


# ---- the target -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    """What the configuration choice needs to know about a GPU."""
    backend: str        # "hip" (AMD ROCm), "cuda" (NVIDIA) or "interpreter" (CPU)
    arch: str           # "gfx942", "sm_90", "cpu"
    shared_bytes: int   # shared memory (LDS on AMD) one program may use
    warp_size: int      # 64-lane wavefronts on AMD Instinct, 32-lane warps on NVIDIA

    @property
    def mfma(self) -> bool:
        """AMD matrix cores (MFMA): MI100 (gfx908) and newer Instinct GPUs. MI50
        (gfx906) and Radeon (gfx10/11/12) have none: `matrix_instr_nonkdim`, which picks
        the MFMA shape, means nothing there."""
        return self.backend == "hip" and self.arch.startswith(("gfx908", "gfx90a", "gfx94",
                                                               "gfx95"))


def amd_target(arch: str) -> Target:
    # LDS per workgroup: 64 KiB on MI50 ... MI300X; MI350 (gfx950) has 160 KiB.
    lds = 160 * 1024 if arch.startswith("gfx95") else 64 * 1024
    return Target("hip", arch, lds, 32 if arch.startswith(("gfx10", "gfx11", "gfx12")) else 64)


def nvidia_target(capability: int, shared_bytes: Optional[int] = None) -> Target:
    # Opt-in shared memory per block: 99 KiB by default, 163 KiB A100, 227 KiB H100.
    default = {80: 163 * 1024, 90: 227 * 1024}.get(capability, 99 * 1024)
    return Target("cuda", f"sm_{capability}", shared_bytes or default, 32)


# The AMD GPUs the launch configurations are checked on: `python -m
# version3_triton.codegen` compiles every config the chooser can pick for them with
# no spills, inside LDS, attention on MFMA (tests/test_codegen.py keeps it so).
TUNED_AMD = ("gfx90a", "gfx942", "gfx950")


def attention_warning(target: Target) -> Optional[str]:
    """One line for GPUs where V3's attention is known to be slow, else None."""
    if target.backend != "hip" or target.arch.startswith(TUNED_AMD):
        return None
    if target.arch.startswith(("gfx10", "gfx11", "gfx12")):  # Radeon: wave32, WMMA at most
        why = "its tiles are tuned for Instinct GPUs (64-lane wavefronts, MFMA), not for Radeon"
    elif not target.mfma:  # MI50 and older: gfx906 in `python -m version3_triton.codegen`
        why = ("no MFMA matrix cores: every tile is plain FMAs and its registers spill to "
               "memory (`python -m version3_triton.codegen --targets gfx906`)")
    else:
        why = "its configurations are not checked for this GPU"
    return (f"V3's Triton attention is slow on {target.arch}: {why}; run with "
            f"--no-triton-attention or use version 4")


def backend() -> str:
    """'interpreter', 'hip' (AMD ROCm) or 'cuda' (NVIDIA): picks the config list."""
    if INTERPRET:
        return "interpreter"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=None)
def current_target() -> Target:
    """The target of this process: the current GPU, or Triton's CPU interpreter."""
    if backend() == "interpreter":
        return Target("interpreter", "cpu", 1 << 30, 32)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if backend() == "hip":
        return amd_target(getattr(props, "gcnArchName", "gfx000").split(":")[0])
    return nvidia_target(props.major * 10 + props.minor,
                         getattr(props, "shared_memory_per_block_optin", None))


# ---- launch configurations per target -----------------------------------------------
def cfgs(*rows, **amd) -> list[dict]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages[, waves_per_eu]) rows -> config dicts."""
    out = []
    for m, n, warps, stages, *waves in rows:
        config = dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)
        if waves:
            config.update(waves_per_eu=waves[0], **amd)
        out.append(config)
    return out


# Flash attention's candidates, per config family (config_family) and head size.
# A family's entry is one list for every head size, or {64: [...], 128: [...]}: the
# list for head sizes up to 64 and the one for 65..128 (the tile's width, BLOCK_D).
# Notes on the choices:
# - No spills: `python -m version3_triton.codegen` compiles every candidate for
#   MI200 (gfx90a), MI300X (gfx942), MI350 (gfx950), A100 (sm_80) and H100 (sm_90),
#   bf16 and fp16, head sizes 64 and 128, and reads registers, spills, LDS and
#   matrix instructions from the compiler's output. The lists hold what compiles
#   there without spilling registers to memory (tests/test_codegen.py keeps it so);
#   a spilled register costs a round trip to memory inside the hot loop. Head size
#   128 doubles the Q (or K, V) tile and the fp32 accumulator each thread holds, so
#   its tiles are smaller, or spread over 8 warps.
# - NVIDIA: num_stages >= 3 lets Triton prefetch the next K/V tiles into shared
#   memory while the tensor cores work on the current ones (H100: 227 KiB). A100
#   (sm_80; also the list of sm_86/sm_89) compiles the same tiles into more
#   registers than H100: 4-warp 128-row forward tiles spill there at head size 64.
#   The dK/dV kernel holds K, V and two fp32 accumulators per program: at head size
#   128 only 8 warps with small query steps avoid spilling registers.
# - AMD: a "warp" is a 64-lane wavefront, so num_warps=4 is 256 threads. LDS is
#   64 KiB per workgroup (MI350: 160 KiB), so tiles are smaller and num_stages is 1.
#   `waves_per_eu` asks the compiler to keep registers low enough for that many
#   wavefronts per SIMD (occupancy); `matrix_instr_nonkdim=16` picks the 16x16 MFMA
#   instructions. Both keywords exist only in the AMD compiler: passing them to the
#   NVIDIA compiler is an error, so they appear only in the AMD lists. MI200
#   (CDNA2) needs more registers than MI300X/MI350 (CDNA3/4) for the same tile, so
#   it has its own list. The "hip" list serves the AMD GPUs the kernels are not
#   tuned for (MI50, MI100, Radeon: attention_warning).
# - interpreter: small tiles (no timing on a CPU), so tiny test shapes still span
#   several blocks and hit every ragged edge.
# Flash attention needs BLOCK_M % BLOCK_N == 0 (forward, dQ) and
# BLOCK_N % BLOCK_M == 0 (dK/dV): the diagonal block is cut into whole tiles.
_MFMA16 = dict(matrix_instr_nonkdim=16)
_SMALL = cfgs((32, 32, 4, 1), (16, 16, 4, 1))  # the interpreter's
ATTENTION_CONFIGS = {
    "attn_fwd": {
        "sm_90": {64: cfgs((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 3),
                           (64, 64, 4, 3), (64, 32, 4, 4), (64, 64, 4, 2)),
                  128: cfgs((128, 64, 8, 3), (64, 32, 4, 4))},
        "sm_80": {64: cfgs((128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4),
                           (64, 64, 4, 2)),
                  128: cfgs((64, 64, 8, 3), (64, 32, 8, 3), (32, 32, 4, 3))},
        "cdna3": {64: cfgs((128, 64, 4, 1, 2), (128, 32, 4, 1, 2), (64, 32, 4, 1, 2), **_MFMA16)
                  + [dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=4)],
                  128: cfgs((128, 32, 4, 1, 2), (64, 32, 4, 1, 2), **_MFMA16)},
        "cdna2": {64: cfgs((128, 32, 4, 1, 2), (64, 32, 4, 1, 2), (32, 32, 4, 1, 2), **_MFMA16),
                  128: cfgs((128, 32, 4, 1, 2), (128, 32, 8, 1, 2), (64, 32, 8, 1, 2), **_MFMA16)},
        "hip": cfgs((128, 64, 4, 1, 2), (128, 32, 4, 1, 2), (64, 64, 4, 1, 2), **_MFMA16)
        + [dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=4)],
        "interpreter": _SMALL,
    },
    "attn_bwd_dkdv": {  # BLOCK_N = keys per program, BLOCK_M = query rows per step
        "sm_90": {64: cfgs((32, 64, 4, 3), (32, 64, 4, 2), (32, 64, 8, 3), (16, 64, 8, 3),
                           (64, 64, 8, 3), (32, 128, 8, 2), (16, 128, 8, 2)),
                  128: cfgs((32, 64, 8, 3), (16, 64, 8, 3))},
        "sm_80": {64: cfgs((32, 64, 4, 3), (32, 64, 4, 2), (32, 64, 8, 3), (16, 64, 8, 3),
                           (32, 128, 8, 2), (16, 128, 8, 2)),
                  128: cfgs((32, 64, 8, 3), (16, 64, 8, 3))},
        "cdna3": {64: cfgs((32, 64, 4, 1, 2), (16, 64, 4, 1, 2), (16, 32, 4, 1, 2), **_MFMA16),
                  128: cfgs((16, 32, 4, 1, 2), (16, 16, 4, 1, 2), **_MFMA16)},
        "hip": cfgs((32, 64, 4, 1, 2), (16, 64, 4, 1, 2), (16, 32, 4, 1, 2), **_MFMA16),
        "interpreter": _SMALL,
    },
    "attn_bwd_dq": {  # BLOCK_M = query rows per program, BLOCK_N = keys per step
        "sm_90": {64: cfgs((64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 3), (128, 32, 8, 3),
                           (128, 64, 8, 3)),
                  128: cfgs((64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 3), (128, 32, 8, 3))},
        "sm_80": {64: cfgs((64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 3)),
                  128: cfgs((64, 32, 8, 3), (64, 64, 8, 3), (32, 32, 4, 3), (32, 16, 4, 3))},
        "cdna3": {64: cfgs((64, 32, 4, 1, 2), (64, 16, 4, 1, 2), **_MFMA16)
                  + [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=4)],
                  128: cfgs((32, 32, 4, 1, 2), (32, 16, 4, 1, 2), **_MFMA16)},
        "cdna2": {64: cfgs((64, 32, 4, 1, 2), (64, 16, 4, 1, 2), **_MFMA16)
                  + [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=4)],
                  128: cfgs((32, 16, 4, 1, 2), (16, 16, 4, 1, 2), **_MFMA16)},
        "hip": cfgs((64, 32, 4, 1, 2), (64, 16, 4, 1, 2), **_MFMA16)
        + [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=4)],
        "interpreter": _SMALL,
    },
}
ATTENTION_CONFIGS["attn_bwd_dkdv"]["cdna2"] = ATTENTION_CONFIGS["attn_bwd_dkdv"]["cdna3"]


def config_family(target: Target) -> str:
    """Which lists of ATTENTION_CONFIGS a target uses."""
    if target.backend == "cuda":  # A100 and the other Ampere/Ada GPUs; H100 and newer
        return "sm_80" if target.arch.startswith("sm_8") else "sm_90"
    if target.backend == "hip":
        if target.arch.startswith("gfx90a"):
            return "cdna2"  # MI200
        return "cdna3" if target.arch.startswith(("gfx94", "gfx95")) else "hip"  # MI300, MI350
    return target.backend


def attention_configs(kernel: str, target: Target, head_dim: Optional[int] = None) -> list[dict]:
    """Flash attention's candidates on `target` for `head_dim` (before the shared-memory
    prune); head_dim None: every candidate of the target, all head sizes."""
    table = ATTENTION_CONFIGS[kernel][config_family(target)]
    if isinstance(table, list):
        return table
    if head_dim is None:  # every list's configs, once each
        union: list[dict] = []
        for configs in table.values():
            union += [c for c in configs if c not in union]
        return union
    width = max(16, next_power_of_2(head_dim))
    return table[min((k for k in table if k >= width), default=max(table))]


def attention_shared_bytes(kernel: str, config: dict, width: int, elem_bytes: int) -> int:
    """Upper estimate of the shared memory (LDS on AMD) one program needs, in bytes.

    Tiles that feed tl.dot are staged in shared memory; with num_stages > 1 the
    compiler keeps that many copies of the streamed tiles so the next ones load
    while the current ones compute (software pipelining). Counted: resident tiles +
    streamed tiles x stages (+ the P / dS tile the backward converts into a dot
    operand). Never below the compiler's own numbers (`python -m
    version3_triton.codegen` prints them), up to ~3x above on AMD.
    """
    stages = max(1, config.get("num_stages", 1))
    m, n = config.get("BLOCK_M", 0), config.get("BLOCK_N", 0)
    d = max(16, next_power_of_2(width))
    if kernel == "attn_fwd":         # Q resident; K, V streamed
        tiles = m * d + stages * 2 * n * d
    elif kernel == "attn_bwd_dkdv":  # K, V resident; Q, dO streamed; P^T / dS^T
        tiles = 2 * n * d + stages * 2 * m * d + m * n
    else:                            # dQ: Q, dO resident; K, V streamed; dS
        tiles = 2 * m * d + stages * 2 * n * d + m * n
    return tiles * elem_bytes


def attention_block_check(kernel: str):
    def check(config: dict) -> None:
        m, n = config.get("BLOCK_M"), config.get("BLOCK_N")
        if kernel != "attn_bwd_dkdv" and (not m or not n or m % n):
            raise ValueError(f"{kernel}: BLOCK_M ({m}) must be a multiple of BLOCK_N ({n})")
        if kernel == "attn_bwd_dkdv" and (not m or not n or n % m):
            raise ValueError(f"{kernel}: BLOCK_N ({n}) must be a multiple of BLOCK_M ({m})")
    return check


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
    configs: Callable[..., list]  # (target[, width]) -> the candidates; no width: all of them
    shared_bytes: Callable[[dict, int, int], int]  # (config, width, elem bytes) -> estimate
    size: Callable[[dict, dict], tuple]          # (kernel args, constexprs) -> (width, elem bytes)
    check: Callable[[dict], None] = lambda config: None  # ValueError for an impossible config
    rule: Optional[Callable[[Target, int], dict]] = None  # the one config of a memory-bound kernel


SPECS: dict[str, KernelSpec] = {}  # filled by rmsnorm.py, rope.py, flash_attention.py


def candidates(spec: KernelSpec, target: Target, width: int, elem_bytes: int) -> list[dict]:
    """What the chooser may pick on `target` without a forced config: the rule's one
    config, or the candidates whose shared memory fits (the smallest if none does)."""
    if spec.rule is not None:
        return [usable_on(spec.rule(target, width), target)]
    configs = [usable_on(c, target) for c in spec.configs(target, width)]
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


def forced_config(kernel: str) -> Optional[dict]:
    """The configuration the user pinned for `kernel` (FORCED_CONFIGS or env), else None."""
    if kernel in FORCED_CONFIGS:
        return dict(FORCED_CONFIGS[kernel])
    text = os.environ.get(ENV_NAMES[kernel])
    return parse_config(text, ENV_NAMES[kernel]) if text else None


def check_config(kernel: str, config: dict, width: int, elem_bytes: int) -> dict:
    """Validate a hand-picked launch configuration (ValueError says why); return it
    with defaults filled in. width: head_dim for attention, hidden size for RMSNorm."""
    config, spec = dict(config), SPECS[kernel]
    spec.check(config)
    need = spec.shared_bytes(config, width, elem_bytes)
    if backend() == "hip":
        lds = current_target().shared_bytes
        if need > lds:
            raise ValueError(f"{kernel}: config {config} needs ~{need // 1024} KiB of LDS, above "
                             f"the {lds // 1024} KiB an AMD GPU has per workgroup")
    config.setdefault("num_warps", 4)
    config.setdefault("num_stages", 1 if backend() == "hip" else 2)
    return usable_on(config, current_target())


def _triton_config(config: dict) -> triton.Config:
    kwargs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    return triton.Config(kwargs, num_warps=config["num_warps"], num_stages=config["num_stages"])


def _prune(spec: KernelSpec, target: Target):
    """The autotuner's early_config_prune: what may run for these arguments."""
    def prune(configs, named_args, **constexprs):
        width, elem_bytes = spec.size(named_args, constexprs)
        forced = forced_config(spec.name)
        if forced is not None:
            return [_triton_config(check_config(spec.name, forced, width, elem_bytes))]
        fitting = candidates(spec, target, width, elem_bytes)
        timed = AUTOTUNE and target.backend != "interpreter"  # nothing to time on a CPU
        return [_triton_config(c) for c in (fitting if timed else fitting[:1])]
    return prune


# ---- launching --------------------------------------------------------------------------
_TUNERS: dict[str, object] = {}
_TUNED_UNDER: dict[str, tuple] = {}  # kernel -> the knobs its tuner's choices were made under
_LAST: dict[str, tuple] = {}         # kernel -> (how it was chosen, triton.Config)


def launch(spec: KernelSpec, fn, key: list, grid, *args, **constexprs) -> None:
    """Launch `fn` over grid(config) with the configuration its autotuner picks.

    The autotuner remembers its choice per key; changing a forced config or the
    AUTOTUNE switch in a running Python session empties that memory."""
    tuner = _TUNERS.get(spec.name)
    if tuner is None:
        target = current_target()
        configs = [_triton_config(usable_on(c, target)) for c in spec.configs(target)]
        # The autotuner calls the prune only when it holds more than one config.
        assert len(configs) > 1, f"{spec.name}: give the autotuner two configs or more"
        tuner = _TUNERS[spec.name] = triton.autotune(
            configs, key=key, prune_configs_by={"early_config_prune": _prune(spec, target)})(fn)
    forced = FORCED_CONFIGS.get(spec.name) or os.environ.get(ENV_NAMES[spec.name])
    knobs = (AUTOTUNE, repr(forced))
    if _TUNED_UNDER.get(spec.name) != knobs:
        tuner.cache.clear()
        _TUNED_UNDER[spec.name] = knobs
    # Inside a torch.library.triton_op, wrap_triton lets torch.compile see the
    # launch (Inductor then launches the kernel from its generated code).
    run = torch.library.wrap_triton(tuner) if _IN_OPERATOR and USE_TRITON_OP else tuner
    run[grid](*args, **constexprs)
    how = ("forced" if forced else "rule" if spec.rule else "autotuned"
           if AUTOTUNE and not INTERPRET else "first candidate")
    _LAST[spec.name] = (how, getattr(tuner, "best_config", None))


def describe(config) -> str:
    if isinstance(config, triton.Config):
        config = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return ", ".join(f"{k}={v}" for k, v in config.items() if v is not None)


def chosen_configs() -> dict[str, str]:
    """Kernel name -> the configuration it last ran with (autotuned, by rule or forced)."""
    return {name: f"{how}: {describe(config) if config else 'chosen by torch.compile'}"
            for name, (how, config) in _LAST.items()}


# ---- helpers for the launchers --------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (see POISON_OUTPUTS)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("Triton kernels need a GPU tensor; on a CPU-only machine set "
                           "TRITON_INTERPRET=1 before importing triton (slow interpreter)")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# ---- operators: what torch.compile sees ---------------------------------------------------
# Each launcher is also a named operator (torch.ops.tinyllama_v3.*):
# - torch.library.triton_op (torch >= 2.6, on a GPU): torch.compile traces the
#   operator's body and finds our kernels in it (launched through wrap_triton),
#   so Inductor launches them itself - no Python per call, and CUDA graphs can
#   capture them. Inductor autotunes the candidates (after our prune) while it compiles.
# - torch.library.custom_op otherwise (older torch, Triton's CPU interpreter):
#   one opaque node; the compiled code calls back into Python for each one.
# An operator call costs host time (dispatcher, schema and alias checks: ~100-300
# us per call measured on an H200 host, torch 2.11), paid by every kernel of every
# layer, more than the kernels run at the workshop's sizes. So the autograd.Functions
# of the kernel files go through the operators only while torch.compile traces
# (torch.compiler.is_compiling()) or inside `eager_operators()`; other eager runs
# call the Python launchers directly.
#
# What sees only operators: FlopCounterMode (torch.utils.flop_counter) counts the
# operators that carry a FLOP formula (attention's, registered in flash_attention.py);
# a launcher called directly is invisible to it. The FLOP-counting profiler
# (`--profile flopcounter`) therefore counts its one step inside `eager_operators()`,
# which the V3 model offers as `model.flop_counting`.
LIBRARY = "tinyllama_v3"
_IN_OPERATOR = False  # True while an operator's body runs: its launches go through wrap_triton
_EAGER_OPERATORS = 0  # > 0 inside eager_operators(): eager calls go through the operators
USE_TRITON_OP = (hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
                 and not INTERPRET)  # wrap_triton cannot run interpreted kernels


def define_op(name: str, fn, fake):
    """Register the launcher `fn` as the operator tinyllama_v3::name."""
    if hasattr(getattr(torch.ops, LIBRARY), name):  # registered already (module imported twice)
        return getattr(getattr(torch.ops, LIBRARY), name)

    @functools.wraps(fn)
    def body(*args, **kwargs):
        global _IN_OPERATOR
        outer, _IN_OPERATOR = _IN_OPERATOR, True
        try:
            return fn(*args, **kwargs)
        finally:
            _IN_OPERATOR = outer

    if USE_TRITON_OP:  # its fake is the body itself, run on fake tensors
        return torch.library.triton_op(f"{LIBRARY}::{name}", mutates_args=())(body)
    op = torch.library.custom_op(f"{LIBRARY}::{name}", mutates_args=())(body)
    op.register_fake(fake)
    return op


def through_operators() -> bool:
    """Call the operators (torch.compile is tracing, or inside eager_operators()) or the
    plain launchers (other eager calls)?"""
    return _EAGER_OPERATORS > 0 or torch.compiler.is_compiling()


@contextlib.contextmanager
def eager_operators():
    """Route eager calls through the operators while inside, so that tools that watch
    PyTorch's dispatcher (FlopCounterMode) see the kernels. Same kernels, same results;
    each call pays the operator's host cost. Nested uses are fine.

        with common.eager_operators(), FlopCounterMode() as counter:
            loss = model(x).sum(); loss.backward()
    """
    global _EAGER_OPERATORS
    _EAGER_OPERATORS += 1
    try:
        yield
    finally:
        _EAGER_OPERATORS -= 1
