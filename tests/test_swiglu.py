"""swiglu: silu(gate) * up on the gate/up GEMM's output, forward and backward Triton kernels
(kernels/swiglu.py), whose backward writes the GEMM output's gradient whole.

Checked against float64 PyTorch and against version 2's silu_mul on the two halves (whose
gradients autograd gathers), on a CPU in Triton's interpreter (fp32, fp16; ragged widths,
one and two column blocks). Outputs are filled with NaN before the kernels write them.
"""
import pytest
import torch

from conftest import HAS_GPU, aten_ops_of

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common  # noqa: E402
from version3_triton.kernels.swiglu import swiglu_reference  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


pytestmark = pytest.mark.usefixtures("poisoned_kernels")


def v2_silu_mul(gate_up):
    """Version 2's maths on the two halves, as its MLP hands them over (views)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def forward_backward(fn, gate_up, grad, dtype):
    leaf = gate_up.detach().to(dtype).requires_grad_()
    out = fn(leaf)
    out.backward(grad.to(out.dtype))
    return out.detach(), leaf.grad


def inputs(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up = 2 * torch.randn(*shape, generator=g)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
    return gate_up.to(DEVICE), grad.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(3, 7, 40), (2, 5, 2 * 1100), (1, 1, 2)],
                         ids=lambda s: "x".join(map(str, s)))
def test_swiglu_matches_fp64_and_version_2(shape, dtype):
    gate_up, grad = inputs(*shape)
    got = forward_backward(tk.swiglu, gate_up, grad, dtype)
    want = forward_backward(swiglu_reference, gate_up, grad, torch.float64)
    v2 = forward_backward(v2_silu_mul, gate_up, grad, dtype)
    for name, a, b, c in zip(["out", "d gate_up"], got, want, v2):
        assert torch.isfinite(a).all(), f"{name}: non-finite values (unwritten output?)"
        scale = b.abs().max().item()
        assert (a.double() - b).abs().max().item() <= TOLERANCE[dtype] * scale, name
        assert (a.double() - c.double()).abs().max().item() <= 2 * TOLERANCE[dtype] * scale, name


def backward_ops(fn) -> set:
    gate_up, grad = inputs(2, 3, 32)
    out = fn(gate_up.requires_grad_())
    return aten_ops_of(lambda: out.backward(grad))


def test_the_backward_gathers_nothing():
    """Version 2's halves come back as two gradients that autograd gathers (slice_backward,
    add, or a cat); the kernel writes [d gate | d up] itself."""
    gather = {"add", "zeros", "new_zeros", "slice_backward", "cat", "index_put_"}
    assert backward_ops(v2_silu_mul) & gather, "the reference path no longer gathers: test is moot"
    assert not backward_ops(tk.swiglu) & gather, backward_ops(tk.swiglu) & gather


def test_the_operators_and_torch_compile_trace_it():
    """Inside eager_operators() the calls go through torch.ops.tinyllama_v3; aot_eager
    (dynamo + fake tensors + AOT autograd) traces them."""
    gate_up, grad = inputs(2, 3, 48)
    eager = forward_backward(tk.swiglu, gate_up, grad, torch.float32)
    with common.eager_operators():
        through_ops = forward_backward(tk.swiglu, gate_up, grad, torch.float32)
    torch._dynamo.reset()
    compiled = forward_backward(torch.compile(lambda t: tk.swiglu(t * 0.5), backend="aot_eager",
                                              fullgraph=True), gate_up, grad, torch.float32)
    halved = forward_backward(lambda t: tk.swiglu(t * 0.5), gate_up, grad, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(eager, through_ops))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(compiled, halved))


def test_an_odd_width_is_refused():
    with pytest.raises(ValueError, match="an even size"):
        tk.swiglu(torch.randn(2, 5, device=DEVICE))


# ---- GPU only ------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_swiglu_low_precision_error_within_2x_pytorch():
    """bf16: the error against float64 is at most ~2x that of version 2's maths in bf16."""
    gate_up, grad = inputs(4, 512, 2 * 2816)
    want = forward_backward(swiglu_reference, gate_up, grad, torch.float64)
    ours = forward_backward(tk.swiglu, gate_up, grad, torch.bfloat16)
    theirs = forward_backward(v2_silu_mul, gate_up, grad, torch.bfloat16)
    for name, a, b, ref in zip(["out", "d gate_up"], ours, theirs, want):
        e_ours, e_theirs = ((t.double() - ref).abs().max().item() for t in (a, b))
        assert e_ours <= 2 * e_theirs + 1e-3 * ref.abs().max().item(), \
            f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


@pytest.mark.gpu
def test_gpu_inductor_launches_swiglu_itself():
    if not common.USE_TRITON_OP:
        pytest.skip(f"torch {torch.__version__} has no torch.library.triton_op")
    from torch._inductor.utils import run_and_get_code

    gate_up, grad = inputs(2, 130, 2 * 704)
    want = forward_backward(tk.swiglu, gate_up, grad, torch.bfloat16)
    torch._dynamo.reset()
    got, codes = run_and_get_code(forward_backward, torch.compile(tk.swiglu, fullgraph=True),
                                  gate_up, grad, torch.bfloat16)
    code = "\n".join(codes)
    for kernel in ("_swiglu_fwd_kernel", "_swiglu_bwd_kernel"):
        assert kernel in code, f"{kernel} is not launched by Inductor's code"
    assert "torch.ops.tinyllama_v3" not in code, "the compiled code calls back into Python"
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
