"""What the kernel families share: the launch and the operator registration (the target
GPU is target.py, re-exported here). Which launch configuration a kernel may run with on which
target - the candidate lists, the prune, the forced-config hook - is configs.py.

`launch` runs a memory-bound kernel with the one configuration its rule gives (computed
once per shape), and hands the others (attention) to Triton's autotuner with the
candidates and the prune of configs.py; `chosen_configs()` tells which configuration each
kernel ran with last.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional  # noqa: F401 (define_op's schema reads the launchers' annotations here)

import torch
import triton

from . import configs
from .configs import (ATTENTION_CONFIGS, SPECS, TUNED_AMD, KernelSpec,  # noqa: F401 (re-exported)
                      attention_configs, attention_warning, candidates, check_config,
                      config_family, forced_config, usable_on)
from .target import (INTERPRET, Target, amd_target, backend, current_target,  # noqa: F401
                     next_power_of_2, nvidia_target)

POISON_OUTPUTS = False  # tests set True: outputs start as NaN, so unwritten elements show


# ---- launching --------------------------------------------------------------------------
_TUNERS: dict[str, object] = {}
_TUNED_UNDER: dict[str, tuple] = {}  # kernel -> the knobs its tuner's choices were made under
_LAST: dict[str, tuple] = {}         # kernel -> (how it was chosen, triton.Config)


_RULED: dict[tuple, tuple] = {}      # (kernel, size, forced setting) -> (config, its one-config tuner)


def launch(spec: KernelSpec, fn, key: list, grid, *args, **constexprs) -> None:
    """Launch `fn` over grid(config): by its rule (memory-bound kernels) or with the
    configuration its autotuner picks. Inside a torch.library.triton_op, wrap_triton
    lets torch.compile see the launch (Inductor then launches the kernel itself)."""
    if spec.rule is not None:
        _launch_by_rule(spec, fn, grid, args, constexprs)
        return
    tuner = _TUNERS.get(spec.name)
    if tuner is None:
        target = current_target()
        listed = [configs.triton_config(usable_on(c, target)) for c in spec.configs(target)]
        # The autotuner calls the prune only when it holds more than one config.
        assert len(listed) > 1, f"{spec.name}: give the autotuner two configs or more"
        tuner = _TUNERS[spec.name] = triton.autotune(
            listed, key=key,
            prune_configs_by={"early_config_prune": configs.early_prune(spec, target)})(fn)
    # The autotuner remembers its choice per key; changing a forced config or the
    # AUTOTUNE switch in a running Python session empties that memory.
    forced = configs.forced_setting(spec.name)
    knobs = (configs.AUTOTUNE, repr(forced))
    if _TUNED_UNDER.get(spec.name) != knobs:
        tuner.cache.clear()
        _TUNED_UNDER[spec.name] = knobs
    run = torch.library.wrap_triton(tuner) if _IN_OPERATOR and USE_TRITON_OP else tuner
    run[grid](*args, **constexprs)
    how = ("forced" if forced else "autotuned" if configs.AUTOTUNE and not INTERPRET
           else "first candidate")
    _LAST[spec.name] = (how, getattr(tuner, "best_config", None))


def _launch_by_rule(spec: KernelSpec, fn, grid, args, constexprs) -> None:
    """A memory-bound kernel has nothing to time: its rule (or a forced config) gives
    the configuration, worked out once per row width and dtype. Each eager call is then
    one dictionary lookup and the kernel's own launch, no autotuner in between; under
    torch.compile a tuner holding just that configuration hands it to Inductor."""
    forced = configs.forced_setting(spec.name)
    size = spec.size(dict(zip(fn.arg_names, args)), constexprs)
    ruled = _RULED.get((spec.name, size, repr(forced)))
    if ruled is None:
        config = configs.allowed(spec, current_target(), *size)[0]
        tuner = triton.autotune([configs.triton_config(config)], key=[])(fn)
        ruled = _RULED[(spec.name, size, repr(forced))] = (config, tuner)
    config, tuner = ruled
    if _IN_OPERATOR and USE_TRITON_OP:
        torch.library.wrap_triton(tuner)[grid](*args, **constexprs)
    else:
        fn[grid(config)](*args, **constexprs, **config)
    _LAST[spec.name] = ("forced" if forced else "rule", config)


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


def as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """t as a (rows, n_cols) matrix whose rows the kernels step through by one stride."""
    return last_dim_contiguous(t.reshape(-1, n_cols))


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
