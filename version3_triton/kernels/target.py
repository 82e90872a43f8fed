"""The GPU a kernel is built for: what the launch configurations depend on (shared
memory, warp size, matrix cores), for the current device or any named AMD/NVIDIA
target. Imports nothing from the rest of the package, so configs.py and common.py
both build on it."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


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


def triton_backend() -> str:
    """'interpreter', 'hip' (AMD ROCm) or 'cuda' (NVIDIA): picks the config list."""
    if INTERPRET:
        return "interpreter"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=None)
def current_target() -> Target:
    """The target of this process: the current GPU, or Triton's CPU interpreter."""
    if triton_backend() == "interpreter":
        return Target("interpreter", "cpu", 1 << 30, 32)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if triton_backend() == "hip":
        return amd_target(getattr(props, "gcnArchName", "gfx000").split(":")[0])
    return nvidia_target(props.major * 10 + props.minor,
                         getattr(props, "shared_memory_per_block_optin", None))


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
