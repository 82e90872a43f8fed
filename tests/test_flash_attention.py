"""Causal flash attention (kernels/flash_attention.py and flash_attention_backward.py) against
float64 PyTorch, forward and backward: GQA, odd lengths, head sizes 16..128, strided views.
On a GPU also: bf16/fp16 error at most ~2x PyTorch's own, and every launch configuration of
this vendor's table. Outputs start as NaN (POISON_OUTPUTS): an element a kernel forgets to
write fails the comparison."""
import pytest
import torch

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs  # noqa: E402
from kernel_checks import (  # noqa: E402
    ATTENTION_SHAPES, DEVICE, TOLERANCE, assert_matches, attention_inputs, attention_reference, forward_backward, pytorch_error)

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "b{}-h{}-kv{}-t{}-d{}".format(*s))
def test_flash_attention_forward_and_backward_match_fp64(shape, dtype):
    inputs, grad = attention_inputs(*shape)
    got = forward_backward(tk.flash_attention, inputs, grad, dtype)
    want = forward_backward(attention_reference, inputs, grad, torch.float64)
    assert_matches(got, want, TOLERANCE[dtype], ["out", "dq", "dk", "dv"])


def test_flash_attention_takes_strided_views_and_writes_bthd_memory():
    """The model passes v as a transposed view of the QKV GEMM's output; the output
    comes back as (B, H, T, D) over (B, T, H, D) memory so o_proj needs no copy."""
    B, H, T, D = 2, 4, 19, 32
    qkv = torch.randn(B, T, 3 * H * D, device=DEVICE)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
    grad = torch.randn(B, H, T, D, device=DEVICE)
    got = forward_backward(tk.flash_attention, [q, k, v], grad)
    want = forward_backward(attention_reference, [q, k, v], grad, torch.float64)
    assert_matches(got, want, TOLERANCE[torch.float32], ["out", "dq", "dk", "dv"])
    assert got[0].transpose(1, 2).is_contiguous()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 333, 64), (1, 4, 4, 256, 128), (2, 4, 1, 97, 96)],
                         ids=lambda s: "b{}-h{}-kv{}-t{}-d{}".format(*s))
def test_gpu_attention_low_precision_error_within_2x_pytorch(shape, dtype):
    inputs, grad = attention_inputs(*shape)
    reference = forward_backward(attention_reference, inputs, grad, torch.float64)
    ours = pytorch_error(tk.flash_attention, inputs, grad, dtype, reference)
    theirs = pytorch_error(attention_reference, inputs, grad, dtype, reference)
    for name, e_ours, e_theirs, ref in zip(["out", "dq", "dk", "dv"], ours, theirs, reference):
        floor = 1e-3 * ref.abs().max().item()  # both tiny: no ratio to speak of
        assert e_ours <= 2 * e_theirs + floor, f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kernel", ["attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"])
def test_gpu_every_config_of_this_vendor_is_correct(monkeypatch, kernel, head_dim):
    """Each autotuning candidate, forced in turn, on a ragged GQA shape in bf16."""
    inputs, grad = attention_inputs(2, 4, 2, 200, head_dim)
    reference = forward_backward(attention_reference, inputs, grad, torch.float64)
    bound = [2 * e + 1e-3 * r.abs().max().item() for e, r in zip(
        pytorch_error(attention_reference, inputs, grad, torch.bfloat16, reference), reference)]
    for config in configs.candidates(configs.SPECS[kernel], common.current_target(), head_dim, 2):
        configs.FORCED_CONFIGS[kernel] = dict(config)
        errors = pytorch_error(tk.flash_attention, inputs, grad, torch.bfloat16, reference)
        assert all(e <= b for e, b in zip(errors, bound)), (config, errors, bound)
