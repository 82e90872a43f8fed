"""Flash attention's launch configurations: the candidates per GPU family and head size
(ATTENTION_CONFIGS, and ATTENTION_ROPE_CONFIGS for the kernels that rotate q and k on load),
the shared memory a candidate needs, the block rules the causal diagonal sets, and the warning
for GPUs the tables are not tuned for. configs.py chooses among these the way it chooses for
every kernel (the prune, the autotuner, a forced configuration); attention_tiles.py declares
the three attention kernels to it with these functions.
"""
from __future__ import annotations

from typing import Optional

from .target import Target, next_power_of_2

# The AMD GPUs the launch configurations are checked on: `python -m
# benchmarks.codegen` compiles every config the chooser can pick for them with
# no spills, inside LDS, attention on MFMA (tests/test_codegen.py keeps it so).
TUNED_AMD = ("gfx90a", "gfx942", "gfx950")


def attention_warning(target: Target) -> Optional[str]:
    """One line for GPUs where V3's attention is known to be slow, else None."""
    if target.backend != "hip" or target.arch.startswith(TUNED_AMD):
        return None
    if target.arch.startswith(("gfx10", "gfx11", "gfx12")):  # Radeon: wave32, WMMA at most
        why = "its tiles are tuned for Instinct GPUs (64-lane wavefronts, MFMA), not for Radeon"
    elif not target.mfma:  # MI50 and older: gfx906 in `python -m benchmarks.codegen`
        why = ("no MFMA matrix cores: every tile is plain FMAs and its registers spill to "
               "memory (`python -m benchmarks.codegen --targets gfx906`)")
    else:
        why = "its configurations are not checked for this GPU"
    return (f"V3's Triton attention is slow on {target.arch}: {why}; run with "
            f"--no-triton-attention or use version 4")


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
# - No spills: `python -m benchmarks.codegen` compiles every candidate for
#   MI200 (gfx90a), MI300X (gfx942), MI350 (gfx950), A100 (sm_80) and H100 (sm_90),
#   bf16 and fp16, head sizes 64 and 128, and reads registers, spills, LDS and
#   matrix instructions from the compiler's output. The lists hold what compiles
#   there without spilling registers to memory (tests/test_codegen.py keeps it so,
#   with the Triton it runs with: registers depend on the compiler's version - Triton
#   3.6 spills every head-128 backward tile listed for sm_90 here, 3.9 none but the
#   dK/dV exception below); a spilled register costs a round trip to memory inside the
#   hot loop. Head size 128 doubles the Q (or K, V) tile and the fp32 accumulator each
#   thread holds, so its tiles are smaller, or spread over 8 warps.
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
                  128: cfgs((64, 64, 4, 2), (32, 64, 4, 3), (32, 64, 8, 3))},  # see SPILLS_THAT_PAY
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

# The one exception to "nothing the chooser can pick spills": (family, kernel, head size)
# whose list holds spilling candidates because they are faster. On NVIDIA a spill is a store to
# local memory that the L1 cache mostly serves, not a trip to HBM. At head size 128 on Hopper
# the dK/dV kernel's only spill-free tile (8 warps, 32 x 64) leaves the kernel at about twice
# the time of the 4-warp tiles, which spill (`python -m benchmarks.codegen --targets sm_90
# --head-dims 128` shows how much): forward + backward of b4 h16 s2048 d128 bf16 in graph
# replay, 1.23 ms with it, 0.74 ms with 64 x 64 x 4 warps. The spill-free tile stays in the
# list, and the autotuner times them all. On AMD a spill goes to scratch memory through the
# vector cache and costs more: no exception there.
SPILLS_THAT_PAY = {("sm_90", "attn_bwd_dkdv", 128)}

# RoPE on load (attention_rope.py) keeps a rotated tile's fp32 halves and
# tables in registers too, so some candidates that fit without it spill with it.
# Where they do, the rotating kernels get a list of their own, per family and head
# size; everywhere else they share the lists above. Same rule: nothing here spills
# (`python -m benchmarks.codegen` compiles both variants, the "+rope" rows).
ATTENTION_ROPE_CONFIGS = {
    "attn_fwd": {
        "cdna3": {128: cfgs((64, 32, 4, 1, 2), (128, 32, 8, 1, 2), (64, 32, 8, 1, 2), **_MFMA16)},
        "cdna2": {128: cfgs((128, 32, 8, 1, 2), (64, 32, 8, 1, 2), **_MFMA16)},
    },
    "attn_bwd_dkdv": {
        "sm_90": {128: cfgs((32, 64, 8, 3), (16, 64, 8, 3))},
        "sm_80": {64: cfgs((32, 64, 8, 3), (16, 64, 8, 3)),
                  128: cfgs((16, 32, 8, 3), (32, 32, 8, 3))},
        "cdna3": {128: cfgs((16, 32, 8, 1, 2), (16, 16, 4, 1, 2), (16, 16, 8, 1, 2), **_MFMA16)},
    },
    "attn_bwd_dq": {
        "sm_90": {128: cfgs((64, 32, 8, 3), (64, 64, 8, 3), (32, 32, 4, 3), (32, 16, 4, 3))},
        "sm_80": {64: cfgs((64, 32, 4, 3), (64, 32, 4, 4)),
                  128: cfgs((64, 32, 8, 3), (32, 32, 4, 3), (32, 16, 4, 3))},
        "cdna3": {64: cfgs((64, 32, 4, 1, 2), (64, 16, 4, 1, 2), **_MFMA16),
                  128: cfgs((32, 16, 8, 1, 2), (32, 32, 8, 1, 2), (16, 16, 4, 1, 2), **_MFMA16)},
        "cdna2": {64: cfgs((64, 32, 8, 1, 2), (64, 16, 8, 1, 2), (32, 32, 4, 1, 2), **_MFMA16)
                  + [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=4)],
                  128: cfgs((32, 16, 8, 1, 2), (32, 32, 8, 1, 2), (16, 16, 4, 1, 2), **_MFMA16)},
    },
}
ATTENTION_ROPE_CONFIGS["attn_bwd_dkdv"]["cdna2"] = ATTENTION_ROPE_CONFIGS["attn_bwd_dkdv"]["cdna3"]


def config_family(target: Target) -> str:
    """Which lists of ATTENTION_CONFIGS a target uses."""
    if target.backend == "cuda":  # A100 and the other Ampere/Ada GPUs; H100 and newer
        return "sm_80" if target.arch.startswith("sm_8") else "sm_90"
    if target.backend == "hip":
        if target.arch.startswith("gfx90a"):
            return "cdna2"  # MI200
        return "cdna3" if target.arch.startswith(("gfx94", "gfx95")) else "hip"  # MI300, MI350
    return target.backend


def attention_configs(kernel: str, target: Target, head_dim: Optional[int] = None,
                      variant: Optional[str] = None) -> list[dict]:
    """Flash attention's candidates on `target` for `head_dim` (before the shared-memory
    prune); head_dim None: every candidate of the target, all head sizes. variant
    "rope": the candidates of the kernels that rotate q and k on load."""
    family = config_family(target)
    table = ATTENTION_CONFIGS[kernel][family]
    rope = ATTENTION_ROPE_CONFIGS[kernel].get(family, {}) if variant == "rope" else {}
    if rope:  # its own lists for some head sizes, the shared ones for the others
        table = {**table, **rope}
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
    benchmarks.codegen` prints them), up to ~3x above on AMD.
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
