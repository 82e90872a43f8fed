"""What the kernel tests share (tests/test_<kernel file>.py): float64 references - the
textbook maths of version 1 - the inputs the kernels run on, and how a result is compared.

On a CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1): fp32
and fp16 (the interpreter has no bf16 tl.dot) on tiny odd shapes. On a GPU the same tests
run there, plus the test_gpu_* ones: bf16/fp16 error at most ~2x the error of PyTorch's
own same-precision maths, every launch configuration of this vendor's table, bit-identical
repeated runs. Every output buffer starts as NaN (POISON_OUTPUTS), so an element a kernel
forgets to write fails the comparison.
"""
import math

import torch

from conftest import HAS_GPU
import version3_triton.kernels as tk  # the test files importorskip it first
from version3_triton.kernels import attention_tables, common, configs

DEVICE = "cuda" if HAS_GPU else "cpu"
KERNELS = list(tk.KERNEL_NAMES)


def attention_reference(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    T = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).float().softmax(-1).to(q.dtype)
    return probs @ v


def rms_norm_reference(x, weight, eps=1e-5):
    x32 = x.float() if x.dtype != torch.float64 else x
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def forward_backward(fn, inputs, grad_out, dtype=None):
    """fn's output and the gradients of its inputs, every input cast to `dtype` first."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out.to(out.dtype))
    return [out.detach(), *(t.grad for t in leaves)]


def max_error(actual, expected) -> float:
    return (actual.double() - expected.double()).abs().max().item()


def assert_matches(results, reference, tol, names):
    """Each |error| <= tol * the tensor's scale. Gradients that are exactly 0 in
    exact maths (seq 1, hidden 1) are compared with the largest tensor's scale."""
    floor = max(want.abs().max().item() for want in reference)
    for name, got, want in zip(names, results, reference):
        scale = want.abs().max().item()
        scale = scale if scale > 1e-3 * floor else floor
        assert torch.isfinite(got).all(), f"{name}: non-finite values (unwritten output?)"
        assert max_error(got, want) <= tol * scale, \
            f"{name}: max error {max_error(got, want):.3g} vs scale {scale:.3g}"


def attention_inputs(batch, heads, kv_heads, seq, head_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, head_dim, generator=g)
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=g)
    v = torch.randn(batch, kv_heads, seq, head_dim, generator=g)
    grad = torch.randn(batch, heads, seq, head_dim, generator=g)
    return [t.to(DEVICE) for t in (q, k, v)], grad.to(DEVICE)


# fp32 is exact maths up to summation order; fp16 rounds P and dS to 11 bits.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3}


# batch, heads, kv_heads, seq, head_dim: seq 1/17/67, GQA 1/2/4, head_dim 16..64
# (24 is padded to 32 inside the kernel, 16 is the tiny preset's head size).
ATTENTION_SHAPES = [(1, 1, 1, 1, 32), (2, 2, 1, 17, 32), (1, 4, 1, 67, 64),
                    (1, 2, 2, 67, 24), (2, 4, 2, 33, 16), (1, 2, 1, 17, 128)]


ROPE_SHAPES = [(1, 1, 1, 2), (2, 17, 3, 32), (1, 7, 6, 64), (2, 5, 4, 96)]  # (B, T, heads, D)


def rope_reference(x, cos, sin):
    """Version 1's apply_rope (half tables, (B, heads, T, D)) on (B, T, heads, D)."""
    from version1_baseline.tiny_llama_v1 import apply_rope
    T, half = x.shape[1], x.shape[-1] // 2
    return apply_rope(x.transpose(1, 2), cos[:T, :half], sin[:T, :half]).transpose(1, 2)


def rope_inputs(B, T, H, D, extra_rows=3):
    from version1_baseline.tiny_llama_v1 import rope_tables
    g = torch.Generator().manual_seed(T * 7 + D)
    cos, sin = rope_tables(D, T + extra_rows, 10000.0)  # tables longer than the sequence
    cos, sin = torch.cat((cos, cos), -1).to(DEVICE), torch.cat((sin, sin), -1).to(DEVICE)
    return torch.randn(B, T, H, D, generator=g).to(DEVICE), cos, sin


NORM_SHAPES = [(1, 1), (3, 37), (7, 100), (2, 5, 64)]  # rows not a multiple of the block


SMALL_BLOCKS = {"attn_fwd": dict(BLOCK_M=32, BLOCK_N=16), "attn_bwd_dq": dict(BLOCK_M=32, BLOCK_N=16),
                "attn_bwd_dkdv": dict(BLOCK_M=16, BLOCK_N=32), "rmsnorm_fwd": dict(BLOCK_ROWS=4),
                "rmsnorm_bwd": dict(BLOCK_ROWS=1), "rope": dict(num_warps=1),
                "swiglu_fwd": dict(num_warps=2), "swiglu_bwd": dict(num_warps=8),
                "cross_entropy": dict(num_warps=2)}


ATTENTION_KERNELS = list(attention_tables.ATTENTION_CONFIGS)


def triton_next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def family_configs(kernel: str, family: str) -> list[dict]:
    table = attention_tables.ATTENTION_CONFIGS[kernel][family]
    return table if isinstance(table, list) else sum(table.values(), [])


TARGETS = {"sm_90": common.nvidia_target(90), "sm_80": common.nvidia_target(80),
           "sm_86": common.nvidia_target(86), "sm_100": common.nvidia_target(100),
           "gfx90a": common.amd_target("gfx90a"), "gfx942": common.amd_target("gfx942"),
           "gfx950": common.amd_target("gfx950"), "gfx906": common.amd_target("gfx906")}


def pytorch_error(fn, inputs, grad, dtype, reference):
    """Error of fn run in `dtype` against the fp64 reference, per output/gradient."""
    return [max_error(a, b) for a, b in zip(forward_backward(fn, inputs, grad, dtype), reference)]
