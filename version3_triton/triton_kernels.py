"""Hand-written Triton kernels for version 3: RMSNorm and flash attention,
forward AND backward, for AMD (ROCm) and NVIDIA (CUDA) GPUs.

Read it in this order:
  1. Launch configurations - how block sizes, warps and pipeline stages are
     chosen per vendor, and how to force your own (the exercise knob).
  2. RMSNorm - a memory-bound row reduction: one read, one write, maths in fp32.
  3. Flash attention - tiling plus the "online softmax", so the (T x T) score
     matrix never exists in memory; the backward recomputes it tile by tile.
  4. Rotary embedding (RoPE) - purely elementwise: one kernel rotates q and
     k together instead of the eight PyTorch operations of version 2.
  5. The PyTorch side - autograd.Functions whose forward/backward launch the
     kernels; registered with `torch.library` too, so torch.compile and
     FlopCounterMode see named operators instead of opaque Python.

Why fp32 accumulation everywhere: bf16 keeps 8 bits of mantissa, so a sum of
1024 squares (RMSNorm) or a softmax denominator over 2048 keys loses the small
terms entirely. Tiles are *loaded* in the input precision (that is where the
memory traffic is) and every sum, max and exp is done in fp32 registers.

Changing the launch configuration (exercise): without a forced configuration,
each attention kernel is autotuned over a few candidates per vendor (see the
*_CONFIGS tables) once per sequence length / head size / GQA group / dtype;
RMSNorm uses a fixed rule (rmsnorm_config). To pin one, either set an
environment variable before the run, e.g.

    V3_ATTN_FWD_CONFIG="BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2" \\
        python version3_triton/tiny_llama_v3.py --preset medium

or, from Python, `triton_kernels.FORCED_CONFIGS["attn_fwd"] = dict(BLOCK_M=64, ...)`.
Kernel names: rmsnorm_fwd, rmsnorm_bwd, rope, attn_fwd, attn_bwd_dkdv, attn_bwd_dq.
`chosen_configs()` tells which configuration each kernel ran with last.
V3_AUTOTUNE=0 skips autotuning: each kernel takes its first candidate that fits
(quick start-up, e.g. for tests; not the fastest).

On a machine without a GPU set TRITON_INTERPRET=1 *before* importing triton:
the kernels then run, slowly, in Triton's CPU interpreter (the tests do this).
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from typing import Optional  # custom_op reads the annotations (Python 3.9: no `X | None`)

import torch
import triton
import triton.language as tl

# =============================================================================
# 1. Launch configurations
# =============================================================================
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
AMD_LDS_BYTES = 64 * 1024  # shared memory ("LDS") per workgroup on MI200/MI300
MAX_HEAD_DIM = 128
MAX_NORM_COLS = 65536  # one row must fit in one program's registers
NORM_SCRATCH_BYTES = 16 * 1024


@functools.lru_cache(maxsize=None)
def backend() -> str:
    """'interpreter', 'hip' (AMD ROCm) or 'cuda' (NVIDIA): picks the config table."""
    if INTERPRET:
        return "interpreter"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


# Each attention kernel has a few candidate configurations per backend; the
# autotuner times them on the first call with a new key (sequence length, head
# size, GQA group, dtype) and keeps the fastest. Notes on the choices:
# - NVIDIA: num_stages >= 3 lets Triton prefetch the next K/V tiles into shared
#   memory while the tensor cores work on the current ones (H100 has 227 KiB).
#   The dK/dV kernel holds K, V and two fp32 accumulators per program: at head
#   size 128 only 8 warps with small query steps avoid spilling registers to
#   memory (checked with the sm_90 compiler); the autotuner drops the others.
# - AMD: an AMD "warp" is a 64-lane wavefront, so num_warps=4 is 256 threads.
#   LDS is only 64 KiB per workgroup, so tiles are smaller and num_stages is
#   1-2. `waves_per_eu` asks the compiler to keep registers low enough for that
#   many wavefronts per SIMD (occupancy); `matrix_instr_nonkdim=16` picks the
#   16x16 MFMA instructions. Both keywords exist only in the AMD backend:
#   passing them to the NVIDIA compiler is an error, so they appear only here.
# - interpreter: one small configuration (no timing on a CPU), small enough that
#   tiny test shapes still span several blocks and hit every ragged edge.
# Flash attention needs BLOCK_M % BLOCK_N == 0 (forward, dQ) and
# BLOCK_N % BLOCK_M == 0 (dK/dV): the diagonal block is cut into whole tiles.
def _cfgs(*rows, **amd) -> list[dict]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages[, waves_per_eu]) rows -> config dicts."""
    out = []
    for m, n, warps, stages, *waves in rows:
        config = dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)
        if waves:
            config.update(waves_per_eu=waves[0], **amd)
        out.append(config)
    return out


_MFMA16 = dict(matrix_instr_nonkdim=16)
ATTN_FWD_CONFIGS = {
    "cuda": _cfgs((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 3),
                  (64, 64, 4, 3), (64, 32, 4, 4), (64, 64, 4, 2)),
    "hip": _cfgs((128, 64, 4, 1, 2), (128, 32, 4, 1, 2), (64, 64, 4, 1, 3), **_MFMA16)
    + [dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=4)],
    "interpreter": _cfgs((32, 32, 4, 1)),
}
ATTN_BWD_DKDV_CONFIGS = {  # BLOCK_N = keys per program, BLOCK_M = query rows per step
    "cuda": _cfgs((32, 64, 4, 3), (32, 64, 4, 2), (32, 64, 8, 3), (16, 64, 8, 3),
                  (64, 64, 8, 3), (32, 128, 8, 2), (16, 128, 8, 2)),
    "hip": _cfgs((32, 128, 4, 1, 1), (32, 64, 4, 1, 2), (16, 64, 4, 1, 2), **_MFMA16)
    + [dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=4)],
    "interpreter": _cfgs((32, 32, 4, 1)),
}
ATTN_BWD_DQ_CONFIGS = {  # BLOCK_M = query rows per program, BLOCK_N = keys per step
    "cuda": _cfgs((64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 4, 3), (128, 32, 4, 3),
                  (128, 32, 8, 3), (128, 64, 8, 3)),
    "hip": _cfgs((128, 32, 4, 1, 1), (64, 32, 4, 1, 2), (64, 16, 4, 1, 2), **_MFMA16)
    + [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=4)],
    "interpreter": _cfgs((32, 32, 4, 1)),
}
KERNEL_CONFIGS = {"attn_fwd": ATTN_FWD_CONFIGS, "attn_bwd_dkdv": ATTN_BWD_DKDV_CONFIGS,
                  "attn_bwd_dq": ATTN_BWD_DQ_CONFIGS}  # the autotuned kernels
# RMSNorm and RoPE are not autotuned: they are memory-bound and the rule of the
# Triton layer-norm tutorial (a whole row per program, ~8 elements per thread)
# is already close to the copy bandwidth. See rule_config().
KERNEL_NAMES = ("rmsnorm_fwd", "rmsnorm_bwd", "rope", *KERNEL_CONFIGS)
FORCED_CONFIGS: dict[str, dict] = {}  # kernel name -> config dict; wins over autotuning
AUTOTUNE = os.environ.get("V3_AUTOTUNE", "1") != "0"  # 0: first fitting candidate, no timing
POISON_OUTPUTS = False  # tests set True: outputs start as NaN, so unwritten elements show


def rule_config(kernel: str, width: int) -> dict | None:
    """The launch configuration of a kernel chosen by rule (None: autotuned)."""
    if kernel.startswith("rmsnorm"):
        return rmsnorm_config(kernel, width)
    if kernel == "rope":  # one position's heads per program: a few KiB, 4 warps
        return dict(num_warps=4, num_stages=1)
    return None


def rmsnorm_config(kernel: str, n_cols: int) -> dict:
    """The RMSNorm launch configuration for rows of n_cols elements.

    BLOCK_COLS = next_power_of_2(n_cols) holds a whole row. Short rows are
    stacked BLOCK_ROWS per program so each program still moves a few KiB.
    Forward: ~8 elements per thread (16 bytes of bf16: one vectorised load per
    thread per row), a tile of at least 1024 elements. Backward: each program
    loops over many rows keeping x, dy and its dw partial sum per element, so
    ~16 elements per thread in tiles of at least 2048 - few enough registers
    that the ~4 programs per compute unit it launches all fit at once.
    At most 16 warps: very wide rows (>= 16k) then hold more per thread and
    spill registers to memory - slower, still correct.
    """
    cols = _next_power_of_2(n_cols)
    per_thread, min_tile = (16, 2048) if kernel == "rmsnorm_bwd" else (8, 1024)
    rows = max(1, min_tile // cols)
    lanes = 64 if backend() == "hip" else 32
    warps = min(16, max(1, rows * cols // (per_thread * lanes)))
    return dict(BLOCK_ROWS=rows, num_warps=warps, num_stages=1)


def shared_memory_estimate(kernel: str, config: dict, width: int, elem_bytes: int) -> int:
    """Upper estimate of the shared memory (LDS on AMD) one program needs, in bytes.

    width: head_dim for attention, hidden size for RMSNorm. Tiles that feed
    tl.dot are staged in shared memory; with num_stages > 1 the compiler keeps
    that many copies of the streamed tiles so the next ones load while the
    current ones compute (software pipelining). Counted: resident tiles +
    streamed tiles x stages (+ the P / dS tile the backward converts into a
    dot operand). Checked against the compiler's own numbers for every config
    below (Triton 3.9, sm_90 and gfx942/gfx90a): never lower, up to ~3x higher
    on AMD, which keeps AMD configs safely inside 64 KiB.
    """
    stages = max(1, config.get("num_stages", 1))
    m, n = config.get("BLOCK_M", 0), config.get("BLOCK_N", 0)
    d = max(16, _next_power_of_2(width))
    if kernel == "attn_fwd":         # Q resident; K, V streamed
        tiles = m * d + stages * 2 * n * d
    elif kernel == "attn_bwd_dkdv":  # K, V resident; Q, dO streamed; P^T / dS^T
        tiles = 2 * n * d + stages * 2 * m * d + m * n
    elif kernel == "attn_bwd_dq":    # Q, dO resident; K, V streamed; dS
        tiles = 2 * m * d + stages * 2 * n * d + m * n
    else:  # RMSNorm stages no tiles: rows stay in registers and only the row/column
        # sums swap partial results through a scratch area (<= 8 KiB measured for
        # every config and hidden size up to 64k, both vendors), counted as 16 KiB.
        return NORM_SCRATCH_BYTES
    return tiles * elem_bytes


@functools.lru_cache(maxsize=None)
def _shared_memory_limit() -> int:
    if backend() == "hip":
        return AMD_LDS_BYTES
    if backend() == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return getattr(props, "shared_memory_per_block_optin", 99 * 1024)
    return 1 << 30  # the interpreter has no limit


@functools.lru_cache(maxsize=None)
def _hip_has_mfma() -> bool:
    """MI100 and newer (gfx908/90a/94x/95x) have matrix cores; MI50 (gfx906) does not."""
    if not torch.cuda.is_available():
        return False
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    return arch.startswith(("gfx908", "gfx90a", "gfx94", "gfx95"))


def _usable_here(config: dict) -> dict:
    """Drop compiler options this backend lacks: AMD's keywords are an error for the
    NVIDIA compiler, and MFMA instruction shapes mean nothing on an MI50."""
    config = dict(config)
    if backend() != "hip" or not _hip_has_mfma():
        config.pop("matrix_instr_nonkdim", None)
    if backend() != "hip":
        config.pop("waves_per_eu", None)
    return config


def _triton_config(config: dict) -> triton.Config:
    kwargs = {k: v for k, v in _usable_here(config).items() if k not in ("num_warps", "num_stages")}
    return triton.Config(kwargs, num_warps=config["num_warps"], num_stages=config["num_stages"])


def fitting_configs(kernel: str, configs: list[dict], width: int, elem_bytes: int,
                    limit: int) -> list[dict]:
    """The candidates the autotuner may try: those whose shared memory fits
    `limit` (the smallest one if none does)."""
    need = [shared_memory_estimate(kernel, c, width, elem_bytes) for c in configs]
    fitting = [c for c, n in zip(configs, need) if n <= limit]
    return fitting or [configs[need.index(min(need))]]


def _parse_config(text: str, source: str) -> dict:
    """'BLOCK_M=64,BLOCK_N=32,num_warps=4' -> {'BLOCK_M': 64, ...}"""
    config = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"{source}: bad item {item!r} in {text!r} (want NAME=INT, ...)")
        config[key.strip()] = int(value)
    return config


_ENV_NAMES = {name: f"V3_{name.upper()}_CONFIG" for name in KERNEL_NAMES}


def forced_config(kernel: str) -> dict | None:
    """The configuration the user pinned for `kernel` (FORCED_CONFIGS or env), else None."""
    if kernel in FORCED_CONFIGS:
        return dict(FORCED_CONFIGS[kernel])
    name = _ENV_NAMES[kernel]
    text = os.environ.get(name)
    return _parse_config(text, name) if text else None


def check_config(kernel: str, config: dict, width: int, elem_bytes: int) -> dict:
    """Validate a hand-picked launch configuration (ValueError says why); return it
    with defaults filled in. width: head_dim for attention, hidden size for RMSNorm."""
    config = dict(config)
    m, n = config.get("BLOCK_M"), config.get("BLOCK_N")
    if kernel in ("attn_fwd", "attn_bwd_dq") and (not m or not n or m % n):
        raise ValueError(f"{kernel}: BLOCK_M ({m}) must be a multiple of BLOCK_N ({n})")
    if kernel == "attn_bwd_dkdv" and (not m or not n or n % m):
        raise ValueError(f"{kernel}: BLOCK_N ({n}) must be a multiple of BLOCK_M ({m})")
    if kernel.startswith("rmsnorm") and "BLOCK_ROWS" not in config:
        raise ValueError(f"{kernel}: the config needs BLOCK_ROWS")
    need = shared_memory_estimate(kernel, config, width, elem_bytes)
    if backend() == "hip" and need > AMD_LDS_BYTES:
        raise ValueError(f"{kernel}: config {config} needs ~{need // 1024} KiB of LDS, above the "
                         f"{AMD_LDS_BYTES // 1024} KiB an AMD GPU has per workgroup")
    config.setdefault("num_warps", 4)
    config.setdefault("num_stages", 1 if backend() == "hip" else 2)
    return _usable_here(config)


def _describe(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items() if v is not None and k != "num_ctas")


# Host overhead matters: at the workshop's sizes a kernel runs for 10-100 us,
# about what Python spends deciding how to launch it (benchmarks/host_overhead.py
# measures it). So every decision is made once per (kernel, shape key) and kept
# in a _Launch: later calls are one dict lookup and a launch. Triton's Autotuner
# is only called on the first launch with a new key, to time the candidates.
_CHOSEN: dict[tuple, "_Launch"] = {}  # (kernel, key, autotune, forced) -> how to launch
_LAST_CONFIG: dict[str, str] = {}
# Fast launch (V3_FAST_LAUNCH=0 turns it off, to measure what it saves): a plain
# `kernel[grid](*args)` makes Triton bind every argument, work out what the
# compiled kernel is specialised on and look it up - ~10-15 us per launch, more
# than our small kernels run. A _Launch remembers the compiled kernel per
# specialisation key and calls it directly.
FAST_LAUNCH = os.environ.get("V3_FAST_LAUNCH", "1") != "0" and not INTERPRET


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # plain Python: triton.cdiv is a (slower) constexpr function


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def specialization_key(args) -> tuple:
    """What Triton compiles a separate kernel for, besides the constexprs: the
    value of each integer argument (it specialises on == 1 and on divisibility by
    16), each tensor's dtype and 16-byte alignment, and on AMD whether the tensor
    is small enough for 32-bit buffer addressing."""
    if backend() == "hip":
        return tuple((a.dtype, a.data_ptr() % 16 == 0, a.untyped_storage().nbytes() < 2**31)
                     if isinstance(a, torch.Tensor) else a for a in args if not isinstance(a, float))
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a
                 for a in args if not isinstance(a, float))


class _Launch:
    """How to launch one kernel for one shape key: the launch kwargs (block
    sizes, warps, stages, head meta) and the compiled kernels seen so far."""

    def __init__(self, kernel: str, config: dict, description: str, meta: dict):
        self.jit_fn = _KERNELS[kernel]
        self.config, self.description = config, description
        self.kwargs = {**meta, **config}
        # The compiled kernel takes every argument positionally, constexprs included,
        # in the order of the kernel's signature (triton >= 3.2). None: no fast path
        # (the interpreter, whose kernels are never compiled).
        params = getattr(self.jit_fn, "params", None)
        self.constexprs = None if params is None else [
            self.kwargs[p.name] for p in params if p.is_constexpr]
        self.compiled: dict[tuple, object] = {}

    def __call__(self, grid: tuple, args: tuple) -> None:
        if self.constexprs is None or not FAST_LAUNCH:
            self.jit_fn[grid](*args, **self.kwargs)
            return
        key = (args[0].get_device(), specialization_key(args))  # compiled kernels are per GPU
        compiled = self.compiled.get(key)
        if compiled is None:  # the normal path; it returns the compiled kernel it ran
            self.compiled[key] = self.jit_fn[grid](*args, **self.kwargs)
            return
        try:
            compiled[(*grid, 1, 1)[:3]](*args, *self.constexprs)  # it wants 3 grid dimensions
        except (TypeError, IndexError, ValueError, SystemError) as e:
            # Another Triton version with another calling convention: say so, stop trying.
            _fast_launch_unavailable(e)
            self.jit_fn[grid](*args, **self.kwargs)


def _fast_launch_unavailable(error: Exception) -> None:
    global FAST_LAUNCH
    FAST_LAUNCH = False
    warnings.warn(f"version 3: Triton {triton.__version__} does not take the direct launch "
                  f"({error}); using the normal launch path", stacklevel=3)


def chosen_configs() -> dict[str, str]:
    """Kernel name -> the configuration it last ran with (autotuned, by rule or forced)."""
    return dict(_LAST_CONFIG)


def _candidates(kernel: str, width: int, elem_bytes: int) -> tuple[list[dict], str]:
    """The configurations `kernel` may run with, and how they were chosen: the
    forced one, the one by rule (RMSNorm, RoPE), or the candidates that fit in
    shared memory - all of them to autotune, only the first with AUTOTUNE off."""
    forced = forced_config(kernel)
    if forced is not None:
        return [check_config(kernel, forced, width, elem_bytes)], "forced"
    rule = rule_config(kernel, width)
    if rule is not None:
        return [rule], "rule"
    candidates = fitting_configs(kernel, KERNEL_CONFIGS[kernel][backend()], width, elem_bytes,
                                 _shared_memory_limit())
    if not AUTOTUNE or len(candidates) == 1:
        return candidates[:1], "first candidate"
    return candidates, "autotuned"


def _choose(kernel: str, key: tuple, grid, args, meta, width: int, elem_bytes: int):
    """Pick the launch kwargs for `kernel` among its _candidates; autotuning
    launches the kernel once per candidate, so the caller must not launch it
    again. Returns (kwargs, how, launched)."""
    configs, how = _candidates(kernel, width, elem_bytes)
    if len(configs) == 1:
        return _usable_here(configs[0]), how, False
    tuner = triton.autotune(configs=[_triton_config(c) for c in configs], key=[])(_KERNELS[kernel])
    tuner[grid](*args, **meta)  # times every candidate, then runs the best one
    return tuner.best_config.all_kwargs(), how, True


def _launch(kernel: str, grid, key: tuple, *args, width: int, elem_bytes: int, **meta):
    """Launch `kernel` over grid(config) with the configuration chosen for `key`.

    key: what the choice depends on (sizes, dtypes); forced configurations and
    the AUTOTUNE switch are looked up on every call (cheap), so the exercise
    knobs also work in a running Python session."""
    if _INSIDE_OPERATOR and _wrap_triton_enabled():  # torch.compile is tracing: see section 5
        _launch_for_inductor(kernel, grid, args, meta, width, elem_bytes)
        return
    forced = FORCED_CONFIGS.get(kernel) or os.environ.get(_ENV_NAMES[kernel])
    cache_key = (kernel, key, AUTOTUNE, str(forced) if forced else None)
    launch, launched = _CHOSEN.get(cache_key), False
    if launch is None:
        config, how, launched = _choose(kernel, key, grid, args, meta, width, elem_bytes)
        launch = _CHOSEN[cache_key] = _Launch(kernel, config, f"{how}: " + _describe(config), meta)
    _LAST_CONFIG[kernel] = launch.description
    if not launched:  # autotuning already ran the kernel
        launch(grid(launch.config), args)


# =============================================================================
# 2. RMSNorm:  y = x / sqrt(mean(x^2) + eps) * w
# =============================================================================
# Memory-bound: per element one read and one write, a handful of FLOPs. The
# kernel's only job is to touch HBM once. A program owns BLOCK_ROWS whole rows,
# so the row sum is a register reduction - no second pass, no atomics.
@triton.jit
def _rmsnorm_fwd_kernel(X, W, Y, RSTD, n_rows, n_cols, stride_x, stride_y, eps,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # torch.compile passes Python floats as fp64: stay in fp32
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)[None, :]  # (1, BLOCK_COLS): the same 2D layout as x
    # Masks cover the ragged edges: hidden sizes that are not a power of two
    # and a last tile with fewer than BLOCK_ROWS rows.
    mask = (rows[:, None] < n_rows) & (cols < n_cols)
    x = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)  # fp32: see module docstring
    y = x * rstd[:, None] * w
    tl.store(Y + rows[:, None] * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    # Saving 4 bytes per row lets the backward skip recomputing the reduction.
    tl.store(RSTD + rows, rstd, mask=rows < n_rows)


# Backward, with x_hat = x * rstd and g = dy * w:
#   dx = rstd * (g - x_hat * mean(g * x_hat))      (per row)
#   dw = sum over rows of dy * x_hat                (per column)
# dx is per row, like the forward. dw sums over *all* rows, which many programs
# share: each program accumulates the rows it owns into a private fp32 partial
# sum and writes it out; a tiny reduction over programs finishes the job. That
# is deterministic, unlike atomically adding into one shared dw. The partial
# sum is kept as a whole tile and summed over its rows only once at the end:
# element-wise adds in the loop, no cross-thread reduction per step.
@triton.jit
def _rmsnorm_bwd_kernel(DY, X, W, RSTD, DX, DW_PARTIAL, n_rows, n_cols, rows_per_program,
                        stride_dy, stride_x, stride_dx,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)[None, :]
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for first in range(row_start, row_end, BLOCK_ROWS):
        rows = first + tl.arange(0, BLOCK_ROWS)
        mask = (rows[:, None] < row_end) & (cols < n_cols)
        x = tl.load(X + rows[:, None] * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rows < row_end, other=0.0)
        x_hat = x * rstd[:, None]
        g = dy * w
        mean_gx = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * x_hat  # rows past the end loaded as zeros and add nothing
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw, axis=0)[None, :], mask=cols < n_cols)


def _empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (see POISON_OUTPUTS)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def _as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    rows = t.reshape(-1, n_cols)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("Triton kernels need a GPU tensor; on a CPU-only machine set "
                           "TRITON_INTERPRET=1 before importing triton (slow interpreter)")


def _norm_block_cols(n_cols: int) -> int:
    if n_cols > MAX_NORM_COLS:
        raise ValueError(f"rms_norm: hidden size {n_cols} is above {MAX_NORM_COLS}, the most one "
                         f"program keeps in registers in this teaching kernel")
    return _next_power_of_2(n_cols)


def _rmsnorm_outputs(x: torch.Tensor, weight: torch.Tensor, out_dtype):
    """Allocate y and rstd (shared by the real op and its fake for torch.compile)."""
    dtype = out_dtype or torch.promote_types(x.dtype, weight.dtype)
    return _empty(x.shape, dtype, x.device), _empty(x.shape[:-1], torch.float32, x.device)


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    out_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Returns (y, rstd); y has out_dtype, by default
    the dtype PyTorch's `x * weight` would have (same as version 1)."""
    _check_device(x)
    n_cols = x.shape[-1]
    block_cols = _norm_block_cols(n_cols)
    x2 = _as_rows(x, n_cols)
    y, rstd = _rmsnorm_outputs(x, weight, out_dtype)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return y, rstd
    _launch("rmsnorm_fwd", lambda c: (_cdiv(n_rows, c["BLOCK_ROWS"]),), (n_cols,),
            x2, weight, y, rstd, n_rows, n_cols, x2.stride(0), n_cols, eps,
            width=n_cols, elem_bytes=x.element_size(), BLOCK_COLS=block_cols)
    return y, rstd


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def rmsnorm_backward(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel. Returns (grad_x, grad_weight)."""
    n_cols = x.shape[-1]
    block_cols = _norm_block_cols(n_cols)
    x2, dy2 = _as_rows(x, n_cols), _as_rows(grad_y, n_cols)
    n_rows = x2.shape[0]
    dx = _empty((n_rows, n_cols), x.dtype, x.device)
    if n_rows == 0:
        return dx.view(x.shape), torch.zeros_like(weight)
    # One wave of programs: ~4 per compute unit, each walking a contiguous chunk
    # of rows and writing one fp32 partial dw row (4 * 132 * 4 KiB on an H100).
    programs = max(1, min(n_rows, 4 * _sm_count(x.device) if x.is_cuda else 3))
    partial = _empty((programs, n_cols), torch.float32, x.device)
    _launch("rmsnorm_bwd", lambda c: (programs,), (n_cols,),
            dy2, x2, weight, rstd, dx, partial, n_rows, n_cols, _cdiv(n_rows, programs),
            dy2.stride(0), x2.stride(0), n_cols,
            width=n_cols, elem_bytes=x.element_size(), BLOCK_COLS=block_cols)
    return dx.view(x.shape), partial.sum(dim=0).to(weight.dtype)


# =============================================================================
# 3. Flash attention (causal), forward and backward
# =============================================================================
# Standard attention materialises S = Q K^T (T x T per head), softmaxes it and
# multiplies by V: O(T^2) memory traffic. Flash attention tiles Q into blocks of
# BLOCK_M rows and streams K and V past them in blocks of BLOCK_N rows. For each
# (query block, key block) pair the scores are computed in registers, folded
# into running softmax statistics, and thrown away.
#
# Online softmax: for a row with scores s_1..s_n, softmax needs the max m and
# the sum l = sum exp(s_j - m). Seeing keys block by block, keep a running
# (m, l, acc = sum exp(s_j - m) v_j). When a new block raises the max to m',
# the old terms were scaled by exp(-m) and must be scaled by exp(-m'):
# multiply l and acc by alpha = exp(m - m'). At the end O = acc / l.
# We also store LSE = m + log(l) per row: it is all the backward needs to
# rebuild P = exp(S - LSE) exactly, without storing P (T x T) in the forward.
#
# Implementation notes:
# - exp2 instead of exp: exp(x) = exp2(x * log2(e)). The scale 1/sqrt(D) and
#   log2(e) are folded into one multiplier, and LSE is kept in base-2 units.
# - Causal block skipping: query block i only needs key blocks 0..i. Blocks
#   strictly left of the diagonal need no mask at all; only the diagonal block
#   pays for the `row >= col` comparison. Hence two stages per kernel.
# - GQA: query head h reads key/value head h // GROUP_SIZE directly; the
#   repeated K/V of version 1 are never built.
# - Head sizes that are not a power of two (e.g. 96) are padded to BLOCK_D in
#   registers; the padded columns load as zeros and are never stored.
@triton.jit
def _load_rows(base, stride, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """Load the tile base[rows, cols] (rows `stride` apart, columns contiguous).

    Only what can run out of bounds is masked: rows past the sequence end when
    CHECK_ROWS, columns when the head size was padded to BLOCK_D. Both are
    compile-time constants, so an in-bounds tile is loaded with no mask at all.
    """
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if CHECK_ROWS:
        if BLOCK_D != HEAD_DIM:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if BLOCK_D != HEAD_DIM:
            tile = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_rows(base, stride, value, rows, n_rows, cols, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if BLOCK_D != HEAD_DIM:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_d,
                    lo, hi, qk_scale, N_CTX,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running softmax of one query block."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        # Off-diagonal key blocks lie entirely before this query block, so they
        # are in bounds; only the diagonal block can reach past the sequence end.
        k = _load_rows(k_base, stride_kt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if ON_DIAGONAL:  # causal mask; it also hides keys past the sequence end
            qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        # P goes back to the input precision for the tensor cores; acc stays fp32.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, LSE,
                     stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                     stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                     num_heads, N_CTX, qk_scale,
                     GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when torch.compile launches us (see RMSNorm)
    # Causal: the last query blocks see the most keys. Handing out the
    # blocks last-first starts the long programs early and shortens the tail.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)  # 64-bit offsets: big tensors overflow int32
    h = pid_bh % num_heads
    kv_h = h // GROUP_SIZE
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh

    q = _load_rows(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: key blocks left of the diagonal - no masks.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, 0, diag, qk_scale, N_CTX,
                                    HEAD_DIM, BLOCK_D, BLOCK_N, False, DOT_PRECISION)
    # Stage 2: the diagonal block, causal mask on. Every row keeps at least key
    # `diag` (<= its own index), so no row is all -inf and nothing becomes NaN.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                    offs_m, offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX),
                                    qk_scale, N_CTX, HEAD_DIM, BLOCK_D, BLOCK_N, True,
                                    DOT_PRECISION)
    o = acc / l_i[:, None]
    _store_rows(O + b * stride_ob + h * stride_oh, stride_ot, o.to(O.dtype.element_ty), offs_m,
                N_CTX, offs_d, HEAD_DIM, BLOCK_D)
    tl.store(LSE + pid_bh * N_CTX + offs_m, m_i + tl.log2(l_i), mask=offs_m < N_CTX)


# Backward. With S = scale * Q K^T, P = softmax(S), O = P V and dO given:
#   dV = P^T dO        dP = dO V^T        dS = P * (dP - delta)
#   dQ = scale * dS K  dK = scale * dS^T Q
# where delta_i = sum_j P_ij dP_ij = sum_d O_id dO_id (one number per row).
# P is *recomputed* from Q, K and the saved LSE: recomputing costs FLOPs,
# storing it would cost T^2 memory. Two kernels share the work without
# atomics: one program per query block accumulates dQ over every key block,
# and one program per key block accumulates dK, dV over every query block (and
# every query head of its GQA group). The dQ kernel runs first: it loads its
# rows of dO anyway, so it also computes their delta and stores it for the
# dK/dV kernel - no separate "preprocess" kernel (one launch less).
@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qt, stride_dot, offs_n, offs_d, lo, hi, qk_scale, N_CTX,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add the contribution of query blocks [lo, hi) to one key block's dK, dV.

    Works on transposed tiles (keys along rows) so dK and dV come out as rows.
    Query rows past the sequence end load as zeros (dO = 0, delta = 0, LSE = 0),
    which makes their P^T dO and dS^T exactly zero: no extra mask is needed.
    """
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(q_base, stride_qt, offs_m, N_CTX, offs_d, HEAD_DIM, BLOCK_D, True)
        do = _load_rows(do_base, stride_dot, offs_m, N_CTX, offs_d, HEAD_DIM, BLOCK_D, True)
        lse = tl.load(lse_base + offs_m, mask=offs_m < N_CTX, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_CTX, other=0.0)
        # Recompute P^T for this tile from the saved log-sum-exp.
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t = tl.exp2(qk_t * qk_scale - lse[None, :])
        if ON_DIAGONAL:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                          stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                          stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                          stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
                          num_kv_heads, N_CTX, sm_scale, qk_scale,
                          GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_n = tl.program_id(0)  # low key blocks see the most queries and run first
    pid_bkv = tl.program_id(1)
    b = (pid_bkv // num_kv_heads).to(tl.int64)
    kv_h = pid_bkv % num_kv_heads
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # This key/value block stays in registers while every query block streams past.
    k = _load_rows(K + b * stride_kb + kv_h * stride_kh, stride_kt, offs_n, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    v = _load_rows(V + b * stride_vb + kv_h * stride_vh, stride_vt, offs_n, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    diag = start_n * BLOCK_N
    num_heads = num_kv_heads * GROUP_SIZE
    for g in range(GROUP_SIZE):  # GQA: every query head that shares this K/V head
        h = kv_h * GROUP_SIZE + g
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        row0 = (b * num_heads + h) * N_CTX
        # Causal: only queries at or after this key block attend to it.
        # Stage 1: the diagonal block (mask on). Stage 2: every block below it.
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0,
                                      stride_qt, stride_dot, offs_n, offs_d,
                                      diag, tl.minimum(diag + BLOCK_N, N_CTX), qk_scale, N_CTX,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, True, DOT_PRECISION)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0,
                                      stride_qt, stride_dot, offs_n, offs_d,
                                      diag + BLOCK_N, N_CTX, qk_scale, N_CTX,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, False, DOT_PRECISION)
    dk *= sm_scale  # the chain rule through S = scale * Q K^T
    _store_rows(DK + b * stride_dkb + kv_h * stride_dkh, stride_dkt, dk.to(DK.dtype.element_ty),
                offs_n, N_CTX, offs_d, HEAD_DIM, BLOCK_D)
    _store_rows(DV + b * stride_dvb + kv_h * stride_dvh, stride_dvt, dv.to(DV.dtype.element_ty),
                offs_n, N_CTX, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt,
                       offs_m, offs_d, lo, hi, qk_scale, N_CTX,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                       ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add the contribution of key blocks [lo, hi) to one query block's dQ."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, stride_kt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        v = _load_rows(v_base, stride_vt, cols, N_CTX, offs_d, HEAD_DIM, BLOCK_D, ON_DIAGONAL)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        if ON_DIAGONAL:
            p = tl.where(offs_m[:, None] >= cols[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, O, DO, DQ, LSE, DELTA,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                        stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                        stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
                        num_heads, N_CTX, sm_scale, qk_scale,
                        GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    sm_scale, qk_scale = tl.cast(sm_scale, tl.float32), tl.cast(qk_scale, tl.float32)  # see RMSNorm
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # long rows first, as in the forward
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = pid_bh % num_heads
    kv_h = h // GROUP_SIZE
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(Q + b * stride_qb + h * stride_qh, stride_qt, offs_m, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    do = _load_rows(DO + b * stride_dob + h * stride_doh, stride_dot, offs_m, N_CTX, offs_d,
                    HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + pid_bh * N_CTX + offs_m, mask=offs_m < N_CTX, other=0.0)
    o = _load_rows(O + b * stride_ob + h * stride_oh, stride_ot, offs_m, N_CTX, offs_d,
                   HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # rows past the end: 0
    tl.store(DELTA + pid_bh * N_CTX + offs_m, delta, mask=offs_m < N_CTX)  # for dK/dV
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = start_m * BLOCK_M
    # Stage 1: the diagonal block (mask on). Stage 2: every key block left of it.
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, diag, tl.minimum(diag + BLOCK_M, N_CTX), qk_scale, N_CTX,
                            HEAD_DIM, BLOCK_D, BLOCK_N, True, DOT_PRECISION)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_d, 0, diag, qk_scale, N_CTX,
                            HEAD_DIM, BLOCK_D, BLOCK_N, False, DOT_PRECISION)
    dq *= sm_scale
    _store_rows(DQ + b * stride_dqb + h * stride_dqh, stride_dqt, dq.to(DQ.dtype.element_ty),
                offs_m, N_CTX, offs_d, HEAD_DIM, BLOCK_D)


_LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: true fp32 ('ieee') unless PyTorch allows TF32 for matmuls too."""
    if dtype == torch.float32 and backend() == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def _check_attention_inputs(q, k, v) -> None:
    _check_device(q)
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"flash_attention wants q (B, H, T, D), k and v (B, H_kv, T, D); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {k.shape[1]}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q.shape[-1]} is not supported (1..{MAX_HEAD_DIM})")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if INTERPRET and q.dtype == torch.bfloat16:
        raise ValueError("Triton's CPU interpreter computes bf16 tl.dot wrongly: "
                         "use fp32 or fp16 on the CPU")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _attention_outputs(q: torch.Tensor):
    """O is laid out (B, T, H, D) in memory and returned as a (B, H, T, D) view,
    so the model's `o.transpose(1, 2).reshape(B, T, H * D)` is free (no copy).
    Shared by the real op and its fake, so both report the same strides."""
    B, H, T, D = q.shape
    o = _empty((B, T, H, D), q.dtype, q.device).transpose(1, 2)
    return o, _empty((B, H, T), torch.float32, q.device)


def _attention_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    return tuple(_empty(t.shape, t.dtype, t.device) for t in (q, k, v))


def _strides(t: torch.Tensor):
    return t.stride()[:3]  # batch, head, position (the head dim has stride 1)


def _tuning_key(q: torch.Tensor, meta: dict) -> tuple:
    """What the best attention config depends on: sequence length, head size, GQA
    group, dtype (and fp32's dot precision) - not batch or head count."""
    return q.shape[2], q.dtype, *meta.values()


def _head_meta(q, k) -> dict:
    D = q.shape[-1]
    return dict(GROUP_SIZE=q.shape[1] // k.shape[1], HEAD_DIM=D,
                BLOCK_D=max(16, _next_power_of_2(D)), DOT_PRECISION=_dot_precision(q.dtype))


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal flash attention forward. Returns (o, lse); lse is in log2 units."""
    _check_attention_inputs(q, k, v)
    q, k, v = map(_last_dim_contiguous, (q, k, v))
    B, H, T, D = q.shape
    o, lse = _attention_outputs(q)
    if o.numel() == 0:
        return o, lse
    meta = _head_meta(q, k)
    _launch("attn_fwd", lambda c: (_cdiv(T, c["BLOCK_M"]), B * H), _tuning_key(q, meta),
            q, k, v, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
            H, T, sm_scale * _LOG2_E, width=D, elem_bytes=q.element_size(), **meta)
    return o, lse


def attention_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor,
                       sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal flash attention backward. Returns (dq, dk, dv)."""
    grad_o, q, k, v = map(_last_dim_contiguous, (grad_o, q, k, v))
    B, H, T, D = q.shape
    H_kv = k.shape[1]
    dq, dk, dv = _attention_grads(q, k, v)
    if q.numel() == 0:
        return dq, dk, dv
    meta = _head_meta(q, k)
    key, size = _tuning_key(q, meta), dict(width=D, elem_bytes=q.element_size())
    delta = _empty(lse.shape, torch.float32, lse.device)  # written by the dQ kernel
    _launch("attn_bwd_dq", lambda c: (_cdiv(T, c["BLOCK_M"]), B * H), key,
            q, k, v, o, grad_o, dq, lse, delta, *_strides(q), *_strides(k), *_strides(v),
            *_strides(o), *_strides(grad_o), *_strides(dq), H, T, sm_scale, sm_scale * _LOG2_E,
            **size, **meta)
    _launch("attn_bwd_dkdv", lambda c: (_cdiv(T, c["BLOCK_N"]), B * H_kv), key,
            q, k, v, grad_o, dk, dv, lse, delta, *_strides(q), *_strides(k), *_strides(v),
            *_strides(grad_o), *_strides(dk), *_strides(dv), H_kv, T, sm_scale,
            sm_scale * _LOG2_E, **size, **meta)
    return dq, dk, dv


# =============================================================================
# 4. Rotary embedding (RoPE), forward and backward
# =============================================================================
# RoPE rotates each pair of channels (i, i + D/2) of q and k by an angle that
# depends on the position t:   y1 = x1*cos - x2*sin,   y2 = x2*cos + x1*sin.
# Version 2 writes that as x.float(), a slice, a negation, a cat, two multiplies,
# an add and a cast - eight kernels, each reading and writing the whole tensor,
# for q and again for k. Here one program loads a position's heads once, rotates
# them in fp32 registers and stores them once, and q and k go through together:
# in the QKV GEMM's output their heads sit side by side.
# Backward: a rotation is linear and its inverse is the rotation by -angle, so
# the gradient is the same kernel with sin negated (INVERSE).
@triton.jit
def _rope_kernel(X, COS, SIN, Y, seq_len, n_heads, stride_xb, stride_xt, stride_xh,
                 stride_yb, stride_yt, stride_yh, stride_table,
                 INVERSE: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_HALF: tl.constexpr):
    pid = tl.program_id(0)  # one (batch, position) per program
    b, t = (pid // seq_len).to(tl.int64), pid % seq_len
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (cols < HALF)
    # The tables are full width (cos, cos) as in version 2: read the first half.
    cos = tl.load(COS + t * stride_table + cols, mask=cols < HALF, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_table + cols, mask=cols < HALF, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    x = X + b * stride_xb + t * stride_xt + heads * stride_xh + cols
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
    y = Y + b * stride_yb + t * stride_yt + heads * stride_yh + cols
    tl.store(y, (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=mask)
    tl.store(y + HALF, (x2 * cos + x1 * sin).to(Y.dtype.element_ty), mask=mask)


def rope_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 inverse: bool = False) -> torch.Tensor:
    """Rotate x (B, T, heads, head_dim; any strides, last dim contiguous) by the
    tables cos/sin (>= T rows, full width). Returns a new contiguous tensor;
    inverse=True rotates backwards (the gradient)."""
    _check_device(x)
    B, T, H, D = x.shape
    if D % 2 or cos.shape[0] < T or cos.shape[-1] != D:
        raise ValueError(f"rope wants x (B, T, heads, even head_dim) and tables (>= T, head_dim); "
                         f"got {tuple(x.shape)} and {tuple(cos.shape)}")
    y = _empty((B, T, H, D), x.dtype, x.device)
    if y.numel() == 0:
        return y
    x = _last_dim_contiguous(x)
    # The key fixes every meta-parameter below: the launch is cached per key.
    _launch("rope", lambda c: (B * T,), (H, D, inverse), x, cos, sin, y, T, H, *x.stride()[:3],
            *y.stride()[:3], cos.stride(0), width=D, elem_bytes=x.element_size(),
            INVERSE=inverse, HALF=D // 2, BLOCK_H=_next_power_of_2(H),
            BLOCK_HALF=_next_power_of_2(D // 2))
    return y


_KERNELS = {"rmsnorm_fwd": _rmsnorm_fwd_kernel, "rmsnorm_bwd": _rmsnorm_bwd_kernel,
            "rope": _rope_kernel, "attn_fwd": _attn_fwd_kernel,
            "attn_bwd_dkdv": _attn_bwd_dkdv_kernel, "attn_bwd_dq": _attn_bwd_dq_kernel}


# =============================================================================
# 5. The PyTorch side: custom operators + autograd
# =============================================================================
# torch.library turns each launcher into a named operator
# (torch.ops.tinyllama_v3.*) that torch.compile and FlopCounterMode can see.
# Two flavours:
# - torch.library.triton_op (torch >= 2.6, on a GPU): torch.compile traces the
#   operator's body and finds our kernels in it (the launches go through
#   torch.library.wrap_triton), so Inductor launches them itself from its
#   generated code - no Python per call, and CUDA graphs can capture them. It
#   autotunes the attention candidates while it compiles.
# - torch.library.custom_op otherwise (older torch, Triton's CPU interpreter):
#   one opaque node; the compiled code calls back into Python for every kernel.
# Either way an operator call costs host time (dispatcher, schema checks: ~10-20
# us), paid for every kernel of every layer. So the autograd.Functions call the
# plain Python launchers in ordinary eager runs and go through the operators
# only when someone is watching: while torch.compile traces, or while a
# dispatch mode (FlopCounterMode, fake tensors, ...) is active. On torch older
# than 2.4 (no custom_op) the plain launchers are always used.
_HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")
try:  # is a triton_op body being traced (True) or run on real tensors (False)?
    from torch._library.triton import is_wrap_triton_enabled as _wrap_triton_enabled
except ImportError:
    def _wrap_triton_enabled() -> bool:
        return False
_USE_TRITON_OP = (hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
                  and not INTERPRET)  # wrap_triton cannot run interpreted kernels
_INSIDE_OPERATOR = False  # True while an operator's body runs (see _operator_body)
_INDUCTOR_RUNNERS: dict[tuple, object] = {}  # (kernel, its candidate configs) -> triton.autotune


def _launch_for_inductor(kernel: str, grid, args: tuple, meta: dict, width: int,
                         elem_bytes: int) -> None:
    """The launch as torch.compile records it: the kernel and its candidate configs
    (forced, by rule, or those the eager path would autotune) go to wrap_triton;
    Inductor times the candidates once, at compile time, and launches the winner."""
    configs, how = _candidates(kernel, width, elem_bytes)
    how = "autotuned by torch.compile" if how == "autotuned" else how
    # Inductor knows num_warps and num_stages; AMD's compiler options (waves_per_eu,
    # ...) it would take for kernel arguments (not tried on an AMD GPU): keep block
    # sizes, warps and stages only.
    configs = [{k: v for k, v in _usable_here(c).items() if k not in ("waves_per_eu",
                                                                       "matrix_instr_nonkdim")}
               for c in configs]
    runner_key = (kernel, tuple(_describe(c) for c in configs))
    runner = _INDUCTOR_RUNNERS.get(runner_key)
    if runner is None:
        runner = _INDUCTOR_RUNNERS[runner_key] = triton.autotune(
            configs=[_triton_config(c) for c in configs], key=[])(_KERNELS[kernel])
    _LAST_CONFIG[kernel] = f"{how}: " + (_describe(configs[0]) if len(configs) == 1
                                        else f"{len(configs)} candidates")
    torch.library.wrap_triton(runner)[grid](*args, **meta)


def _operator_body(launcher):
    """The launcher, marked as running inside an operator (so that, while
    torch.compile traces it, its launches go through wrap_triton)."""
    @functools.wraps(launcher)
    def body(*args, **kwargs):
        global _INSIDE_OPERATOR
        outer, _INSIDE_OPERATOR = _INSIDE_OPERATOR, True
        try:
            return launcher(*args, **kwargs)
        finally:
            _INSIDE_OPERATOR = outer
    return body


def _register_ops():
    lib = "tinyllama_v3"
    if hasattr(torch.ops, lib) and hasattr(getattr(torch.ops, lib), "attention_forward"):
        return getattr(torch.ops, lib)  # already registered (module imported twice)

    def define(name, fn, fake):
        if _USE_TRITON_OP:  # its fake is the body itself, run on fake tensors
            torch.library.triton_op(f"{lib}::{name}", mutates_args=())(_operator_body(fn))
            return
        op = torch.library.custom_op(f"{lib}::{name}", mutates_args=())(fn)
        op.register_fake(fake)

    define("rmsnorm_forward", rmsnorm_forward,
           lambda x, weight, eps, out_dtype=None: _rmsnorm_outputs(x, weight, out_dtype))
    define("rmsnorm_backward", rmsnorm_backward,
           lambda grad_y, x, weight, rstd: (_empty(x.shape, x.dtype, x.device),
                                            _empty(weight.shape, weight.dtype, weight.device)))
    define("rope", rope_forward,
           lambda x, cos, sin, inverse=False: _empty(x.shape, x.dtype, x.device))
    define("attention_forward", attention_forward,
           lambda q, k, v, sm_scale: _attention_outputs(q))
    define("attention_backward", attention_backward,
           lambda grad_o, q, k, v, o, lse, sm_scale: _attention_grads(q, k, v))
    ops = getattr(torch.ops, lib)
    _register_flop_formulas(ops)
    return ops


def _register_flop_formulas(ops) -> None:
    """Count attention like PyTorch counts SDPA (4*B*H*Tq*Tk*D forward, no causal
    discount, backward 2.5x), so V3 and V4 report the same FLOPs."""
    try:
        from torch.utils.flop_counter import register_flop_formula
    except ImportError:
        return

    def forward_flops(q_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, t_q, d = q_shape
        return 4 * b * h * t_q * k_shape[2] * d

    def backward_flops(grad_shape, q_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
        return int(2.5 * forward_flops(q_shape, k_shape))

    register_flop_formula(ops.attention_forward)(forward_flops)
    register_flop_formula(ops.attention_backward)(backward_flops)


if _HAS_CUSTOM_OP:
    _ops = _register_ops()


def _through_ops() -> bool:
    """Call the registered operators (True) or the plain launchers (False)?"""
    return _HAS_CUSTOM_OP and (torch.compiler.is_compiling()
                               or torch._C._len_torch_dispatch_stack() > 0)


class TritonRMSNorm(torch.autograd.Function):
    """y = rms_norm(x) * weight, with the Triton forward and backward kernels."""

    @staticmethod
    def forward(ctx, x, weight, eps, out_dtype=None):
        forward = _ops.rmsnorm_forward if _through_ops() else rmsnorm_forward
        y, rstd = forward(x, weight, eps, out_dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, rstd = ctx.saved_tensors
        backward = _ops.rmsnorm_backward if _through_ops() else rmsnorm_backward
        dx, dw = backward(grad_y, x, weight, rstd)
        return dx, dw, None, None


class TritonRoPE(torch.autograd.Function):
    """Rotary embedding of (B, T, heads, head_dim); backward = the inverse rotation."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        rope = _ops.rope if _through_ops() else rope_forward
        ctx.save_for_backward(cos, sin)
        return rope(x, cos, sin, False)

    @staticmethod
    def backward(ctx, grad_y):
        cos, sin = ctx.saved_tensors
        rope = _ops.rope if _through_ops() else rope_forward
        return rope(grad_y, cos, sin, True), None, None


class FlashAttention(torch.autograd.Function):
    """Causal softmax(Q K^T * scale) V with the Triton kernels; saves only O and LSE."""

    @staticmethod
    def forward(ctx, q, k, v, sm_scale):
        forward = _ops.attention_forward if _through_ops() else attention_forward
        o, lse = forward(q, k, v, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        backward = _ops.attention_backward if _through_ops() else attention_backward
        dq, dk, dv = backward(grad_o, q, k, v, o, lse, ctx.sm_scale)
        return dq, dk, dv, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm over the last dimension (Triton forward + backward)."""
    return TritonRMSNorm.apply(x, weight, eps, out_dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Triton forward + backward). x: (B, T, heads, head_dim);
    cos, sin: (>= T, head_dim) tables as version 2 builds them. Same maths as
    version 1's apply_rope (in fp32, result in x's dtype), on the other layout."""
    return TritonRoPE.apply(x, cos, sin)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    sm_scale: float | None = None) -> torch.Tensor:
    """Causal attention. q: (B, H, T, D); k, v: (B, H_kv, T, D), H % H_kv == 0.

    Same result as F.scaled_dot_product_attention(q, k, v, is_causal=True,
    enable_gqa=True). The output is a (B, H, T, D) view of (B, T, H, D) memory.
    """
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return FlashAttention.apply(q, k, v, scale)
