"""What the kernel families share: the launch - bound to the compiled kernel, replayed from
a launch plan - and the helpers of the launchers (the target GPU is target.py, the operators
torch.compile sees operators.py, both re-exported here). Which launch configuration a kernel
may run with on which target - the rules, the prune, the forced-config hook - is configs.py;
attention's candidate lists are attention_tables.py.

`launch` runs a memory-bound kernel with the one configuration its rule gives (once per
shape) and hands the others (attention) to Triton's autotuner with the candidates and the
prune of configs.py; `chosen_configs()` tells which configuration each kernel ran with last."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from typing import Optional

import torch
import triton

from . import configs, launch_args, operators
from .attention_tables import (ATTENTION_CONFIGS, TUNED_AMD,  # noqa: F401 (re-exported)
                                attention_configs, attention_warning, config_family)
from .operators import (LIBRARY, USE_TRITON_OP, apply, define_op,  # noqa: F401 (re-exported)
                        eager_operators, through_operators)
from .configs import (SPECS, KernelSpec, as_dict, candidates,  # noqa: F401 (re-exported)
                      check_config, describe, forced_config, usable_on)
from .target import (INTERPRET, Target, amd_target, current_target,  # noqa: F401
                     next_power_of_2, nvidia_target, triton_backend)

POISON_OUTPUTS = False  # tests set True: outputs start as NaN, so unwritten elements show


# ---- launching --------------------------------------------------------------------------
# An eager call is host time before it is GPU time. Triton's `kernel[grid](...)` spends
# ~25 us of Python deciding *which* compiled kernel to run (binding the arguments, working
# out their specialisation, hashing a cache key, the autotuner's bookkeeping), on every
# call, for an answer that is the same for every call of a training step. So the first
# call with a given kind of arguments launches through Triton (compiling, autotuning),
# and keeps the CompiledKernel it ran; later calls look it up by a key built from the
# arguments and call it directly (`_BOUND`), through the C function under Triton's
# launcher where it can (below): about half the host time of Triton's own launch
# (benchmarks/host_overhead.py has both rows).
#
# The key must hold everything Triton specialises a kernel on, or a hit would run a
# kernel compiled for other arguments and compute wrong numbers without a word: each
# tensor's dtype and 16-byte alignment, each other argument by type and value (an int
# equal to 1 or divisible by 16 compiles differently), the constexprs by name, the
# current device, the forced configurations (their version) and the autotune switch.
# Ints by value are stricter than Triton needs (one entry per shape), never looser.
#
# Where the direct call is not known to work - Triton's CPU interpreter, a HIP build
# (its launcher also specialises tensors on buffer sizes), a Triton without the
# CompiledKernel API used here - or with V3_JIT_LAUNCH=1, every call goes through
# Triton's own launch. The direct call skips Triton's launch hooks (its `proton` profiler
# uses them); PyTorch's profiler, nsys, ncu and rocprof see the kernels either way.
_TUNERS: dict[tuple, object] = {}   # (kernel, its jit function's name) -> its autotuner
_TUNED_UNDER: dict[tuple, tuple] = {}  # the same key -> the knobs its choices were made under
_LAST: dict[str, tuple] = {}         # kernel -> (how it was chosen, triton.Config)
_RULED: dict[tuple, tuple] = {}      # (kernel, size, forced setting) -> (config, its one-config tuner)
_BOUND: dict[tuple, tuple] = {}      # the key above -> (launcher, head, tail, (how, config), fn)
_MAX_BOUND = 4096                    # forget them all past this many (shapes that keep changing)
_GRID_PAD = {1: (1, 1), 2: (1,), 3: ()}  # a grid of 1 or 2 dimensions, padded to 3


def _can_bind() -> bool:
    return (not INTERPRET and triton_backend() == "cuda"
            and os.environ.get("V3_JIT_LAUNCH", "0") != "1"
            and hasattr(torch._C, "_cuda_getCurrentRawStream"))


BIND = _can_bind()  # tests switch it to compare the two ways


def launch(spec: KernelSpec, fn, key: list, grid, *args, **constexprs) -> None:
    """Launch `fn` over grid(config): by its rule (memory-bound kernels) or with the
    configuration its autotuner picks; a call like one before runs the kernel that call
    ran, directly. Inside a torch.library.triton_op, wrap_triton lets torch.compile see
    the launch (Inductor then launches the kernel itself)."""
    if not BIND or operators.IN_OPERATOR:
        _launch_through_triton(spec, fn, key, grid, args, constexprs)
        return
    device = torch._C._cuda_getDevice()
    bound_key, call_args = _bound_key(fn, device, args, constexprs)
    bound = _BOUND.get(bound_key)
    if bound is None:
        kernel = _launch_through_triton(spec, fn, key, grid, args, constexprs)
        _bind(bound_key, spec, fn, kernel, len(args), constexprs)
        if _RECORDING is not None:
            _record(None)  # not bound yet: the next call records
        return
    launcher, head, tail, last, _ = bound
    _LAST[spec.name] = last
    g = grid(last[1])
    launcher(*g, *_GRID_PAD[len(g)], torch._C._cuda_getCurrentRawStream(device), *head,
             *call_args, *tail)
    if _RECORDING is not None:
        _record((launcher, (*g, *_GRID_PAD[len(g)]), head, args, tail, spec.name, last, device))


def _bound_key(fn, device: int, args: tuple, constexprs: dict) -> tuple[tuple, list]:
    """What a call must share with an earlier one to run the kernel that one ran (see
    above): an int by value, a tensor by dtype, 16-byte alignment and being on a GPU,
    anything else (bool, float, None) by type and value (True == 1 in Python, so a bool's
    type keeps it apart). The kernel goes in by id: hashing a JITFunction runs Python (its
    source's hash), and the entry keeps the function alive, so no other object can take its
    id meanwhile.

    Also returns the arguments for the direct call, each tensor as its address: given a
    tensor, Triton's C launcher calls its data_ptr() and asks the CUDA driver whether the
    address is a GPU one, on every launch (the key's is_cuda sends a CPU tensor through
    Triton's launch instead, which says so)."""
    key = [id(fn), device, configs.FORCED_CONFIGS.version, configs.AUTOTUNE, *constexprs.items()]
    call = []
    append, give = key.append, call.append
    for a in args:
        kind = a.__class__
        if kind is int:
            append(a)
            give(a)
        elif kind is torch.Tensor or isinstance(a, torch.Tensor):
            address = a.data_ptr()
            key += (a.dtype, not address & 15, a.is_cuda)
            give(address)
        elif hasattr(a, "block_shape"):  # a TMA descriptor (attention_hopper.py's kernels)
            append((kind, a.base.dtype, tuple(a.block_shape), tuple(a.shape), tuple(a.strides)))
            give(a)  # its tensor map: launch_args.MapLaunch encodes it
        else:
            append(kind)
            append(a)
            give(a)
    return tuple(key), call


def launch_fixed(fn, grid: tuple, args: list, chosen: tuple, **constexprs) -> None:
    """Launch a kernel that has one configuration (attention_hopper.py's), chosen: (its name,
    (how, config)) for chosen_configs(). Triton's own launch the first time, bound like
    `launch`'s kernels after that, and recorded into plans (TMA descriptors as tensor maps)."""
    _LAST[chosen[0]] = chosen[1]
    if not BIND or operators.IN_OPERATOR:
        fn[grid](*args, **constexprs)
        return
    device = torch._C._cuda_getDevice()
    bound_key, call_args = _bound_key(fn, device, args, constexprs)
    bound = _BOUND.get(bound_key)
    if bound is None:
        if _RECORDING is not None:
            _record(None)  # (first: a kernel that fails to build leaves no plan behind)
        _keep(bound_key, fn, fn[grid](*args, **constexprs), len(args), constexprs, None)
        return
    launcher, head, tail, _, _ = bound
    grid = (*grid, *_GRID_PAD[len(grid)])
    launcher(*grid, torch._C._cuda_getCurrentRawStream(device), *head, *call_args, *tail)
    if _RECORDING is not None:
        _record((launcher, grid, head, args, tail, *chosen, device))


def _bind(bound_key: tuple, spec: KernelSpec, fn, kernel, n_args: int, constexprs: dict) -> None:
    """Keep the CompiledKernel the call just ran, with the configuration it ran with."""
    how, config = _LAST[spec.name]
    config = as_dict(config)
    _keep(bound_key, fn, kernel, n_args, {**constexprs, **config}, (how, config))


def _keep(bound_key: tuple, fn, kernel, n_args: int, values: dict, last) -> None:
    """Keep a CompiledKernel with what a direct call needs: Triton's launcher takes every
    kernel parameter in order, constexprs included (`tail`, from `values`)."""
    global BIND
    try:
        tail = tuple(values[name] for name in fn.arg_names[n_args:])
        launcher, head = _direct_launch(kernel)
    except (AttributeError, KeyError, TypeError) as e:  # another Triton: its own launch it is
        BIND = False
        print(f"note: Triton {triton.__version__}'s compiled kernels cannot be called directly "
              f"here ({type(e).__name__}: {e}); V3 launches through Triton's JIT (more host time "
              f"per call)", file=sys.stderr)
        return
    if len(_BOUND) >= _MAX_BOUND:
        _BOUND.clear()
    _BOUND[bound_key] = (launcher, head, tail, last, fn)  # fn: see _bound_key


# ---- launch plans -------------------------------------------------------------------------
# A bound launch still builds its key from every argument, a fraction of a microsecond
# each, and attention's kernels take 24 to 32 of them. Yet every argument but the tensors'
# addresses follows from a few facts about the operation's inputs: their shapes, strides
# and dtypes, the scale, RoPE's tables or none. A launcher that names those facts - its
# plan key - records its launches the first time they all run bound (`recording`), and
# every later call with the same plan key replays them (`replay`): the same kernels, grids
# and arguments, with this call's addresses (a view's, a TMA descriptor's: launch_args.py).
# The plan key must hold whatever decides a non-address argument, a constexpr or the
# configuration (the forced configurations' version and the autotune switch included);
# the addresses' 16-byte alignment, which Triton specialises on, is checked at every
# replay - a misaligned tensor takes the launcher's own way, as does every call whose
# launches were given a tensor that is neither named nor a view the launcher made of a
# named one (a contiguous copy it made, say): those record no plan.
PLANS: dict[tuple, tuple] = {}    # plan key -> (device, aliases, the launches with address slots)
USE_PLANS = True                   # the host-overhead table switches it to show what plans save
_RECORDING: Optional[list] = None  # while a launcher records: each launch's arguments
_RECORDER = 0                      # the thread that records (another thread's launches are its own)


def plan_key(name: str, tensors: tuple, *values) -> Optional[tuple]:
    """The plan key of a call: the launcher's name, its input tensors' shapes, strides,
    dtypes and devices, the other values it launches by, and what every plan depends on
    (the current device, the forced configurations, the autotune switch). None where no
    plan runs: no bound launch here, or inside an operator (wrap_triton launches there)."""
    if not BIND or not USE_PLANS or operators.IN_OPERATOR:
        return None
    key = [name, torch._C._cuda_getDevice(), configs.FORCED_CONFIGS.version, configs.AUTOTUNE,
           *values]
    for t in tensors:  # a loop, not a comprehension: no frame of its own (Python < 3.12)
        key.append(None if t is None else (t.shape, t.stride(), t.dtype, t.get_device()))
    return tuple(key)


def replay(plan: tuple, tensors) -> bool:
    """Run the launches of a plan (PLANS[its plan key]) with these tensors (the launcher's
    named tensors, in its order; None where it has none). False: a misaligned tensor, or
    one tensor recorded in two places that are two tensors now."""
    device, same, launches = plan
    for first, other in same:  # one tensor in two places when recorded (a shared gradient)
        if tensors[first] is not tensors[other]:
            return False
    addresses = []
    for t in tensors:
        address = 0 if t is None else t.data_ptr()
        if address & 15:
            return False
        addresses.append(address)
    stream = torch._C._cuda_getCurrentRawStream(device)
    for launcher, grid, head, template, slots, tail, name, last in launches:
        args = template.copy()
        for at, which, offset, maps in slots:  # (launch_args.slots; inline: no frame)
            address = addresses[which] + offset
            args[at] = address if maps is None else maps[address]
        launcher(*grid, stream, *head, *args, *tail)
        _LAST[name] = last
    return True


@contextlib.contextmanager
def recording(plan_key: tuple, tensors: list):
    """Record the launches inside as the plan for plan_key, if they all ran bound and every
    tensor they were given is in `tensors` (which the launcher may fill inside, with the
    outputs it allocates)."""
    global _RECORDING, _RECORDER
    if plan_key is None or _RECORDING is not None or len(PLANS) >= _MAX_BOUND:
        yield
        return
    _RECORDER, _RECORDING = threading.get_ident(), []
    recorded = _RECORDING  # (the name outlives the global, reset below)
    try:
        yield
    finally:
        _RECORDING = None
    if (plan := _plan(recorded, tensors)) is not None:
        PLANS[plan_key] = plan


def _record(launch: Optional[tuple]) -> None:
    """Add a launch (None: one that did not run bound) to the plan being recorded, if this
    thread is the one recording it."""
    if threading.get_ident() == _RECORDER:
        _RECORDING.append(launch)


def _plan(recorded: list, tensors: list) -> Optional[tuple]:
    """The recorded launches with each tensor argument replaced by a slot that names its
    place in `tensors` (held alive by `recorded`, so ids are unique): launch_args.py."""
    where, same = {}, []
    for i, t in enumerate(tensors):
        if t is not None:
            if id(t) in where:  # a replay needs the same tensor in both places again
                same.append((where[id(t)], i))
            else:
                where[id(t)] = i
    launches, device = [], None
    for entry in recorded:
        if entry is None:
            return None
        launcher, grid, head, args, tail, name, last, device = entry
        found = launch_args.slots(args, where, launcher)
        if found is None:
            return None
        call, template, address_slots = found  # call: the C launch under a MapLaunch
        launches.append((call, grid, head, template, address_slots, tail, name, last))
    return (device, tuple(same), tuple(launches)) if launches else None


def forget_plans() -> None:
    """Drop every bound launch and plan (tests switch the ways of launching)."""
    _BOUND.clear()
    PLANS.clear()


# Triton's launcher (kernel.run) is a small Python __call__ around a compiled C function
# (kernel.run.launch): it asks for scratch buffers - none for these kernels - and passes
# the launch's flags, ~3 us of Python per call on an H200 host. Where that __call__ is
# the one written below (Triton 3.6's NVIDIA launcher is; 3.9's passes other arguments),
# the C function is called with the same arguments; any other launcher is called as
# Triton calls it.
_KNOWN_LAUNCHER_CALL = ("self.launch(gridX, gridY, gridZ, stream, function, "
                        "self.launch_cooperative_grid, self.launch_pdl, global_scratch, "
                        "profile_scratch, *args)")


@functools.lru_cache(maxsize=None)
def _launcher_is_known(launcher_class) -> bool:
    """Is this launcher's __call__ the one whose C call _direct_launch makes itself?"""
    try:
        source = " ".join(inspect.getsource(launcher_class.__call__).split())
    except (OSError, TypeError, AttributeError):
        return False
    source = source.replace("( ", "(").replace(" )", ")")  # however the call was wrapped
    return (source.startswith("def __call__(self, gridX, gridY, gridZ, stream, function, *args):")
            and source.count("self.launch(") == 1 and _KNOWN_LAUNCHER_CALL in source)


def _direct_launch(kernel) -> tuple:
    """(callable, the arguments between the stream and the kernel's own) for a bound call:
    the C launch where it is known to take these, else Triton's launcher."""
    run = kernel.run
    # Triton's packed launch metadata; launch_metadata and the enter/exit hooks: none.
    metadata = (kernel.packed_metadata, None, None, None)
    if (DIRECT_C_LAUNCH and _launcher_is_known(type(run))
            and run.global_scratch_size == 0 and run.profile_scratch_size == 0):
        # what the launcher's __call__ adds: its flags and no scratch buffers
        return launch_args.map_launch(run.launch), (kernel.function, run.launch_cooperative_grid,
                                                    run.launch_pdl, None, None, *metadata)
    return run, (kernel.function, *metadata)


DIRECT_C_LAUNCH = True  # tests switch it to compare the C launch with Triton's launcher


def launch_path() -> str:
    """How the eager launches of this process went, in words (for tables and logs)."""
    if not BIND:
        return "through Triton's JIT launch"
    if not _BOUND:
        return "bound (none yet)"
    c_launch = sum(1 for launcher, *_ in _BOUND.values() if not hasattr(launcher, "launch"))
    return f"bound: {c_launch} of {len(_BOUND)} kernels through the C launch directly"


def _launch_through_triton(spec: KernelSpec, fn, key: list, grid, args, constexprs):
    """Triton's own launch (binding, specialisation, cache lookup, compiling if new): by
    the kernel's rule or through its autotuner. Returns the CompiledKernel that ran."""
    if spec.rule is not None:
        return _launch_by_rule(spec, fn, grid, args, constexprs)
    tuner_key = (spec.name, fn.__name__)
    tuner = _TUNERS.get(tuner_key)
    if tuner is None:
        target = current_target()
        listed = [configs.triton_config(usable_on(c, target)) for c in spec.configs(target)]
        # The autotuner calls the prune only when it holds more than one config.
        assert len(listed) > 1, f"{spec.name}: give the autotuner two configs or more"
        tuner = _TUNERS[tuner_key] = triton.autotune(
            listed, key=key,
            prune_configs_by={"early_config_prune": configs.early_prune(spec, target)})(fn)
    # The autotuner remembers its choice per key; changing a forced config or the
    # AUTOTUNE switch in a running Python session empties that memory.
    forced = configs.forced_setting(spec.name)
    knobs = (configs.AUTOTUNE, repr(forced))
    if _TUNED_UNDER.get(tuner_key) != knobs:
        tuner.cache.clear()
        _TUNED_UNDER[tuner_key] = knobs
    run = torch.library.wrap_triton(tuner) if operators.IN_OPERATOR else tuner
    kernel = run[grid](*args, **constexprs)
    how = ("forced" if forced else "autotuned" if configs.AUTOTUNE and not INTERPRET
           else "first candidate")
    _LAST[spec.name] = (how, getattr(tuner, "best_config", None))
    return kernel


def _launch_by_rule(spec: KernelSpec, fn, grid, args, constexprs):
    """A memory-bound kernel has nothing to time: its rule (or a forced config) gives
    the configuration, worked out once per row width and dtype. Under torch.compile a
    tuner holding just that configuration hands it to Inductor."""
    forced = configs.forced_setting(spec.name)
    size = spec.size(dict(zip(fn.arg_names, args)), constexprs)
    ruled = _RULED.get((spec.name, size, repr(forced)))
    if ruled is None:
        config = configs.allowed(spec, current_target(), *size)[0]
        tuner = triton.autotune([configs.triton_config(config)], key=[])(fn)
        ruled = _RULED[(spec.name, size, repr(forced))] = (config, tuner)
    config, tuner = ruled
    _LAST[spec.name] = ("forced" if forced else "rule", config)
    if operators.IN_OPERATOR:
        return torch.library.wrap_triton(tuner)[grid](*args, **constexprs)
    return fn[grid(config)](*args, **constexprs, **config)


def chosen_configs() -> dict[str, str]:
    """Kernel name -> the configuration it last ran with (autotuned, by rule or forced)."""
    return {name: f"{how}: {describe(config) if config else 'chosen by torch.compile'}"
            for name, (how, config) in _LAST.items()}


# ---- helpers for the launchers --------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Every output buffer comes from here or from empty_like (see POISON_OUTPUTS)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def empty_strided(like: torch.Tensor, shape, strides, dtype=None) -> torch.Tensor:
    """A buffer on like's device (in like's dtype unless given) with these strides: like's
    method parses fewer arguments than torch.empty or torch.empty_strided, ~1 us per call."""
    t = (like.new_empty_strided(shape, strides) if dtype is None  # (dtype=None costs more)
         else like.new_empty_strided(shape, strides, dtype=dtype))
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def empty_like(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A contiguous buffer of t's shape (in dtype, default t's). torch.empty_like costs
    the host about half of torch.empty(shape, dtype=, device=), which parses more
    arguments; it keeps t's strides, so it serves only a contiguous t."""
    if not t.is_contiguous():
        return empty(t.shape, dtype or t.dtype, t.device)
    out = torch.empty_like(t, dtype=dtype)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


def check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not INTERPRET:
        raise RuntimeError("Triton kernels need a GPU tensor; on a CPU-only machine set "
                           "TRITON_INTERPRET=1 before importing triton (slow interpreter)")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def as_rows(t: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, int, int]:
    """(tensor, rows, row stride): t as a (rows, n_cols) matrix whose rows the kernels step
    through by one stride. A contiguous t goes as it is - the kernels see only its address
    and the strides - so the common case makes no view (each one costs the host a dispatch)."""
    if n_cols and t.is_contiguous():
        return t, t.numel() // n_cols, n_cols
    t = last_dim_contiguous(t.reshape(-1, n_cols))
    return t, t.shape[0], t.stride(0)
