"""recompute.py: a kernel and the GEMM after it in one autograd step that rebuilds the GEMM's
input in the backward instead of keeping it (add_rms_norm_linear, swiglu_linear).

Each must give the bits of the two calls it replaces (the same kernels and GEMMs; the
weight cast as autocast casts it) and keep only the kernel's input and the weight. On a CPU
the kernels run in Triton's interpreter (fp32, and bf16 elementwise under autocast).
"""
import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_GPU

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
EPS = 1e-5

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


def randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def gemm_dtype(autocast: bool, t: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if autocast else t.dtype


# Each case: (the recomputing call, the two calls it replaces, its inputs). Inputs and
# weights are leaves; the weights stay fp32 under autocast, as parameters do.
def norm_cases(autocast: bool, with_delta: bool):
    x, g, w = randn(2, 5, 32, seed=0), randn(32, seed=1), randn(24, 32, seed=2)
    delta = randn(2, 5, 32, seed=3, dtype=torch.bfloat16 if autocast else torch.float32)

    def plain(x, delta, g, w):
        if delta is None:
            return x, F.linear(tk.rms_norm(x, g, EPS, gemm_dtype(autocast, x)), w)
        h, y = tk.add_rms_norm(x, delta, g, EPS, gemm_dtype(autocast, delta))
        return h, F.linear(y, w)

    def recomputing(x, delta, g, w):
        return tk.add_rms_norm_linear(x, delta, g, w, EPS)

    return recomputing, plain, (x, delta if with_delta else None, g, w)


def swiglu_cases(autocast: bool, dtype: torch.dtype):
    gate_up, w = randn(2, 5, 2 * 24, seed=0, dtype=dtype), randn(16, 24, seed=1)
    return tk.swiglu_linear, lambda gu, w: F.linear(tk.swiglu(gu), w), (gate_up, w)


def run(fn, inputs, autocast: bool, saved: list | None = None):
    """Outputs and every input's gradient; the loss weighs every output (h too)."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    hooks = torch.autograd.graph.saved_tensors_hooks(
        lambda t: (saved.append(t.shape) if saved is not None else None) or t, lambda t: t)
    with hooks, torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o.float() * randn(*o.shape, seed=7 + i)).sum() for i, o in enumerate(outs))
    loss.backward()
    return [o.detach() for o in outs] + [t.grad for t in leaves if t is not None]


CASES = {
    "norm, fp32": lambda: norm_cases(False, True),
    "norm, autocast": lambda: norm_cases(True, True),
    "first norm (no add), autocast": lambda: norm_cases(True, False),
    "swiglu, fp32": lambda: swiglu_cases(False, torch.float32),
    "swiglu, autocast, bf16 input": lambda: swiglu_cases(True, torch.bfloat16),
    "swiglu, autocast, fp32 input": lambda: swiglu_cases(True, torch.float32),
}


@pytest.mark.parametrize("case", CASES)
def test_the_same_bits_as_the_two_calls_and_only_the_input_kept(case):
    recomputing, plain, inputs = CASES[case]()
    autocast = "autocast" in case
    saved = []
    got, want = run(recomputing, inputs, autocast, saved), run(plain, inputs, autocast)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output/gradient {i} differs"
    # the kernel's input (h: x itself, or x + delta), the norm's weight, the GEMM's weight
    kept = [inputs[0].shape, *(t.shape for t in inputs[2:])] if "norm" in case else \
        [t.shape for t in inputs]
    assert sorted(saved) == sorted(kept), saved


@pytest.mark.parametrize("case", ["norm, fp32", "swiglu, fp32"])
def test_the_operators_and_torch_compile(case):
    recomputing, _, inputs = CASES[case]()
    eager = run(recomputing, inputs, False)
    with common.eager_operators():
        through_ops = run(recomputing, inputs, False)
    torch._dynamo.reset()
    compiled = run(torch.compile(recomputing, backend="aot_eager", fullgraph=True), inputs, False)
    assert all(torch.equal(a, b) for a, b in zip(eager, through_ops))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(compiled, eager))
