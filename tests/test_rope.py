"""RoPE (kernels/rope.py) against version 1's rotation in float64, forward and backward, on
the (B, T, heads, D) layout and on the q and k heads of the QKV GEMM's output; on a GPU,
bf16/fp16 error at most ~2x PyTorch's own."""
import pytest
import torch

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from kernel_checks import (  # noqa: E402
    ROPE_SHAPES, TOLERANCE, assert_matches, forward_backward, pytorch_error, rope_inputs, rope_reference)

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=lambda s: "b{}-t{}-h{}-d{}".format(*s))
def test_rope_forward_and_backward_match_fp64(shape, dtype):
    x, cos, sin = rope_inputs(*shape)
    grad = torch.randn_like(x)
    got = forward_backward(lambda t: tk.rope(t, cos, sin), [x], grad, dtype)
    want = forward_backward(lambda t: rope_reference(t, cos.double(), sin.double()), [x], grad,
                            torch.float64)
    assert_matches(got, want, TOLERANCE[dtype], ["out", "dx"])


def test_rope_takes_the_q_and_k_heads_of_the_qkv_output():
    """The model hands over a slice of the QKV GEMM's output (heads not contiguous
    across positions); q and k come back rotated, v is not touched."""
    B, T, H, D = 2, 9, 4, 32
    x, cos, sin = rope_inputs(B, T, 3 * H, D)
    qk = x[:, :, :2 * H]
    got = forward_backward(lambda t: tk.rope(t, cos, sin), [qk], torch.ones_like(qk))
    want = forward_backward(lambda t: rope_reference(t, cos.double(), sin.double()), [qk],
                            torch.ones_like(qk), torch.float64)
    assert_matches(got, want, TOLERANCE[torch.float32], ["out", "dx"])
    with pytest.raises(ValueError, match="rope wants"):
        tk.rope_forward(x[..., :D - 1], cos, sin)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_rope_low_precision_error_within_2x_pytorch(dtype):
    x, cos, sin = rope_inputs(4, 300, 24, 64)
    grad = torch.randn_like(x)
    reference = forward_backward(lambda t: rope_reference(t, cos.double(), sin.double()), [x],
                                 grad, torch.float64)
    ours = pytorch_error(lambda t: tk.rope(t, cos, sin), [x], grad, dtype, reference)
    theirs = pytorch_error(lambda t: rope_reference(t, cos, sin), [x], grad, dtype, reference)
    for name, e_ours, e_theirs in zip(["y", "dx"], ours, theirs):
        assert e_ours <= 2 * e_theirs + 1e-6, f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"
