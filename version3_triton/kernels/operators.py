"""The torch.library operators: what torch.compile (and FlopCounterMode) sees of V3's
launchers, and when an eager call goes through them (kernels/common.py launches)."""
from __future__ import annotations

import contextlib
import functools
from typing import Optional  # noqa: F401 (define_op's schema reads the launchers' annotations here)

import torch

from .target import INTERPRET

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
IN_OPERATOR = False  # True while a triton_op's body runs: its launches go through wrap_triton
_EAGER_OPERATORS = 0  # > 0 inside eager_operators(): eager calls go through the operators
USE_TRITON_OP = (hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
                 and not INTERPRET)  # wrap_triton cannot run interpreted kernels


def define_op(name: str, fn, fake, opaque: bool = False):
    """Register the launcher `fn` as the operator tinyllama_v3::name. opaque: one node that
    torch.compile does not trace into, even where triton_op exists (_define_opaque)."""
    if hasattr(getattr(torch.ops, LIBRARY), name):  # registered already (module imported twice)
        return getattr(getattr(torch.ops, LIBRARY), name)
    # An opaque operator's body (and a custom_op's) is never traced: compiled code calls it at
    # run time - under CUDA graphs also while they capture, where wrap_triton's autotuner would
    # time its candidates and fail - so it launches as eager code does (kernels tuned in warm-up).
    if opaque:
        return _define_opaque(name, fn, fake)
    if not USE_TRITON_OP:
        op = torch.library.custom_op(f"{LIBRARY}::{name}", mutates_args=())(fn)
        op.register_fake(fake)
        return op

    @functools.wraps(fn)
    def body(*args, **kwargs):
        global IN_OPERATOR
        outer, IN_OPERATOR = IN_OPERATOR, True
        try:
            return fn(*args, **kwargs)
        finally:
            IN_OPERATOR = outer

    _launch_statically()
    # its fake is the body itself, run on fake tensors
    return torch.library.triton_op(f"{LIBRARY}::{name}", mutates_args=())(body)


@functools.cache
def _launch_statically() -> None:
    """Inductor launches the kernels it writes through its static launcher (C++), but the
    kernels it finds in a triton_op through Triton's own (Python), unless this switch says
    otherwise. A compiled V3 step launches about ninety of ours (norms, RoPE, SwiGLU, each
    way), where its host has the least time to spare of the four versions. On one GPU the two
    launchers read alike (`bash benchmarks/reproduce.sh host` runs the pair: docs/PROFILING.md);
    the static one is C++, and a host with less to spare (one of several ranks) counts every
    launch. Only user-written Triton kernels see the switch, and V3's are the only ones in the
    project; a kernel the static launcher cannot take (one with launch attributes) falls back
    to Triton's launcher by itself."""
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "static_launch_user_defined_triton_kernels"):  # torch >= 2.8
        inductor_config.static_launch_user_defined_triton_kernels = True


# The opaque operators, registered with the dispatcher directly. Compiled code calls them at
# run time, once per layer and pass, and a custom_op would wrap each call in layers of Python
# (an autograd kernel that finds grad off, a redispatch, an alias check), 24 calls a medium
# step, where V3's compiled step leaves the host little slack (docs/MULTI_GPU.md, on four GPUs).
# Direct, each call costs the host about what calling its body does. Autograd passes them by (a
# fallthrough): only the autograd.Functions' forward and backward call them, where grad is
# off, and those Functions carry the gradients.
_OPAQUE = torch.library.Library(LIBRARY, "FRAGMENT")


def _define_opaque(name: str, fn, fake):
    _OPAQUE.define(name + torch.library.infer_schema(fn, mutates_args=()))
    for device in ("CPU", "CUDA"):  # ROCm's tensors are "CUDA" to the dispatcher too
        _OPAQUE.impl(name, fn, device)
    _OPAQUE.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"{LIBRARY}::{name}", fake, lib=_OPAQUE)
    return getattr(getattr(torch.ops, LIBRARY), name).default


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


# ---- calling an autograd.Function ---------------------------------------------------------
# Function.apply is a Python classmethod in front of the C function that does the work: it
# checks for functorch transforms (vmap, grad) and a setup_context, ~2 us of an H200 host's
# time per call. An eager call outside those goes straight to the C function; torch.compile
# (which traces Function.apply itself) and the transforms get the whole of it.
_C_APPLY = torch._C._FunctionBase.__dict__.get("apply")


def apply(function, *args):
    """function.apply(*args), for an autograd.Function without a setup_context."""
    if (_C_APPLY is None or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active()):
        return function.apply(*args)
    return _C_APPLY.__get__(None, function)(*args)
