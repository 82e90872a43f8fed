"""RoPE on load: flash_attention_rope(q, k, v, cos, sin) rotates q and k inside
the attention kernels, forward and backward, so the model needs no RoPE pass.

What it must compute: kernels/rope.py's reference rotation, then attention - checked
against float64 PyTorch, and against the unfused path (the RoPE kernel, then
flash_attention) in the same dtype. On a CPU the kernels run in Triton's interpreter
(conftest sets TRITON_INTERPRET=1): fp32 and fp16, tiny ragged shapes. q, k and v
come in as the model hands them over: strided views of the QKV GEMM's output.
"""
import importlib

import pytest
import torch

from conftest import HAS_GPU

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import attention_tables, common, configs  # noqa: E402
from version3_triton.kernels.rope import rope_reference  # noqa: E402

# The package exports a function named like the module: import the module itself.
fa = importlib.import_module("version3_triton.kernels.flash_attention")

DEVICE = "cuda" if HAS_GPU else "cpu"
ATTENTION_KERNELS = ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")


pytestmark = pytest.mark.usefixtures("poisoned_kernels")


# ---- inputs: the QKV GEMM's output, the tables ------------------------------------
def tables(head_dim, rows, dtype=torch.float32):
    """Version 2's full-width tables (cos, cos) and (sin, sin), `rows` positions."""
    from version1_baseline.tiny_llama_v1 import rope_tables
    cos, sin = rope_tables(head_dim, rows, 10000.0)
    return (torch.cat((t, t), -1).to(DEVICE, dtype) for t in (cos, sin))


def qkv_inputs(batch, heads, kv_heads, seq, head_dim, seed=0):
    """A (B, T, heads + 2 kv_heads, D) tensor like the QKV GEMM writes; tables three
    positions longer than the sequence; the gradient of the attention output."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, seq, heads + 2 * kv_heads, head_dim, generator=g)
    grad = torch.randn(batch, heads, seq, head_dim, generator=g)
    cos, sin = tables(head_dim, seq + 3)
    return qkv.to(DEVICE), grad.to(DEVICE), cos, sin


def split_heads(qkv, heads, kv_heads):
    """(B, T, heads, D) memory seen as (B, heads, T, D): views, no copies - as the model does."""
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def fused(qkv, cos, sin, heads, kv_heads):
    return tk.flash_attention_rope(*split_heads(qkv, heads, kv_heads), cos, sin)


def unfused(qkv, cos, sin, heads, kv_heads):
    """Today's model: the RoPE kernel rotates the q and k heads, then flash_attention."""
    qk = tk.rope(qkv[:, :, :heads + kv_heads], cos, sin)
    v = qkv[:, :, heads + kv_heads:].transpose(1, 2)
    return tk.flash_attention(qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), v)


def reference(qkv, cos, sin, heads, kv_heads):
    """rope.py's reference rotation of the q and k heads, then attention_reference:
    PyTorch, in qkv's dtype."""
    qk = rope_reference(qkv[:, :, :heads + kv_heads], cos, sin)
    v = qkv[:, :, heads + kv_heads:].transpose(1, 2)
    return fa.attention_reference(qk[:, :, :heads].transpose(1, 2),
                                  qk[:, :, heads:].transpose(1, 2), v)


def forward_backward(fn, qkv, grad, cos, sin, heads, kv_heads, dtype):
    """The output and the gradients of q, k and v (read from the QKV tensor's gradient)."""
    leaf = qkv.detach().to(dtype).requires_grad_()
    tables_ = (cos.double(), sin.double()) if dtype == torch.float64 else (cos, sin)
    out = fn(leaf, *tables_, heads, kv_heads)
    out.backward(grad.to(out.dtype))
    dq, dk, dv = split_heads(leaf.grad, heads, kv_heads)
    return [out.detach(), dq, dk, dv]


def max_error(actual, expected) -> float:
    return (actual.double() - expected.double()).abs().max().item()


def assert_matches(results, wanted, tol, what):
    """Each |error| <= tol * the scale of the wanted tensor."""
    for name, got, want in zip(["out", "dq", "dk", "dv"], results, wanted):
        scale = want.abs().max().item()
        assert torch.isfinite(got).all(), f"{name}: non-finite values (unwritten output?)"
        assert max_error(got, want) <= tol * scale, \
            f"{name} vs {what}: max error {max_error(got, want):.3g}, scale {scale:.3g}"


# fp32 is exact maths up to summation order; fp16 rounds the rotated q, k, P and dS.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3}
# batch, heads, kv_heads, seq, head_dim: GQA groups 1 and 2, ragged seq 17 and 33 (the
# interpreter's 32-row tiles: one block, or a second one past the end), head sizes
# 32 and 64, and 16 (the tiny preset's: each half, 8 wide, is padded to 16 columns).
SHAPES = [(1, 2, 2, 17, 32), (2, 4, 2, 33, 64), (1, 4, 2, 17, 16)]


@pytest.mark.parametrize("shape, dtype", [
    pytest.param(shape, dtype, id="b{}-h{}-kv{}-t{}-d{}-".format(*shape) + name,
                 marks=[pytest.mark.slow] if shape == SHAPES[1] and name == "fp16" else [])
    for shape in SHAPES for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16"))])
def test_rope_in_attention_matches_fp64_and_the_unfused_path(shape, dtype):
    assert_matches_fp64_and_the_separate_steps(fused, shape, dtype)


def assert_matches_fp64_and_the_separate_steps(fn, shape, dtype):
    """fn(qkv, cos, sin, heads, kv_heads) against float64 PyTorch and against the RoPE
    kernel + flash_attention in the same dtype; its output laid out as (B, T, H, D)."""
    qkv, grad, cos, sin = qkv_inputs(*shape)
    heads, kv_heads = shape[1:3]
    got = forward_backward(fn, qkv, grad, cos, sin, heads, kv_heads, dtype)
    want = forward_backward(reference, qkv, grad, cos, sin, heads, kv_heads, torch.float64)
    assert_matches(got, want, TOLERANCE[dtype], "float64")
    separate = forward_backward(unfused, qkv, grad, cos, sin, heads, kv_heads, dtype)
    assert_matches(got, separate, TOLERANCE[dtype], "RoPE kernel + flash_attention")
    assert got[0].transpose(1, 2).is_contiguous()  # (B, T, H, D) memory, as flash_attention's


def test_rope_in_attention_across_several_tiles(monkeypatch):
    """Small forced blocks: the diagonal spans several tiles and most key tiles are
    off the diagonal (loaded and rotated without row masks); head size 24 pads each
    half (12) to 16 columns and the head (24) to 32."""
    configs.FORCED_CONFIGS.update({
        "attn_fwd": dict(BLOCK_M=32, BLOCK_N=16), "attn_bwd_dq": dict(BLOCK_M=32, BLOCK_N=16),
        "attn_bwd_dkdv": dict(BLOCK_M=16, BLOCK_N=32)})
    for shape in [(1, 2, 1, 45, 32), (1, 2, 1, 45, 24)]:
        qkv, grad, cos, sin = qkv_inputs(*shape, seed=1)
        got = forward_backward(fused, qkv, grad, cos, sin, 2, 1, torch.float32)
        want = forward_backward(reference, qkv, grad, cos, sin, 2, 1, torch.float64)
        assert_matches(got, want, TOLERANCE[torch.float32], f"float64, {shape}")


def test_rope_tables_are_checked():
    q, k, v = split_heads(qkv_inputs(1, 2, 1, 9, 16)[0], 2, 1)
    cos, sin = tables(16, 9)
    with pytest.raises(ValueError, match="wants an even head_dim and tables"):
        tk.flash_attention_rope(q, k, v, cos[:8], sin[:8])  # shorter than the sequence
    with pytest.raises(ValueError, match="wants an even head_dim and tables"):
        tk.flash_attention_rope(q, k, v, cos[:, :8], sin[:, :8])  # not full width


# ---- launch configurations ---------------------------------------------------------
TARGETS = {"sm_90": common.nvidia_target(90), "sm_80": common.nvidia_target(80),
           "gfx90a": common.amd_target("gfx90a"), "gfx942": common.amd_target("gfx942"),
           "gfx950": common.amd_target("gfx950"), "gfx906": common.amd_target("gfx906")}


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_rope_configs_are_legal_and_fit(kernel):
    """The rotating kernels' own lists: whole tiles on the diagonal, AMD-only options
    in AMD lists only, and for every GPU and head size candidates that fit in shared
    memory."""
    spec = configs.SPECS[kernel]
    for family, table in attention_tables.ATTENTION_ROPE_CONFIGS[kernel].items():
        for c in sum(table.values(), []):
            m, n = c["BLOCK_M"], c["BLOCK_N"]
            assert (n % m if kernel == "attn_bwd_dkdv" else m % n) == 0, (family, c)
            amd_only = {"waves_per_eu", "matrix_instr_nonkdim"} & set(c)
            assert family.startswith("cdna") or not amd_only, (family, c)
    for name, target in TARGETS.items():
        for head_dim in (16, 64, 96, 128):
            rope = configs.candidates(spec, target, head_dim, 2, "rope")
            assert rope, (name, head_dim)
            assert all(spec.shared_bytes(c, head_dim, 2) <= target.shared_bytes for c in rope)


# ---- what PyTorch sees: the operators, FlopCounterMode, torch.compile -----------------
def counted_flops(fn) -> tuple[dict, int]:
    """FlopCounterMode's counts per operator for fn's forward + backward inside
    eager_operators(), and attention's forward FLOPs by PyTorch's SDPA convention
    (4*B*H*Tq*Tk*D); the operators compute what the eager launchers compute."""
    from torch.utils.flop_counter import FlopCounterMode

    qkv, grad, cos, sin = qkv_inputs(1, 4, 2, 16, 32)
    with common.eager_operators(), FlopCounterMode(display=False) as counter:
        got = forward_backward(fn, qkv, grad, cos, sin, 4, 2, torch.float32)
    eager = forward_backward(fn, qkv, grad, cos, sin, 4, 2, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(got, eager))  # same kernels either way
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return counts, 4 * 1 * 4 * 16 * 16 * 32


def test_rope_in_attention_through_the_operators_and_the_flop_counter():
    """The variant's operators take the tables; the FLOP count is attention's alone (RoPE's
    multiplies are elementwise: PyTorch counts none for version 2's RoPE either)."""
    counts, forward = counted_flops(fused)
    assert counts == {"tinyllama_v3.attention_rope_forward": forward,
                      "tinyllama_v3.attention_rope_backward": 2.5 * forward}


def assert_compiles_like_eager(block):
    """aot_eager (dynamo + fake tensors + AOT autograd) traces block(qkv, cos, sin), with the
    tables as operator inputs, and the compiled block computes what the eager one does."""
    qkv, grad, cos, sin = qkv_inputs(1, 2, 1, 17, 16)

    def run(fn):
        leaf = qkv.detach().requires_grad_()
        out = fn(leaf, cos, sin)
        out.backward(grad)
        return [out.detach(), leaf.grad]

    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    for got, want in zip(run(compiled), run(block)):
        assert max_error(got, want) <= 1e-6 * want.abs().max().item()


def test_torch_compile_traces_through_rope_in_attention():
    def block(qkv, cos, sin):
        q, k, v = split_heads(qkv * 0.5, 2, 1)
        return tk.flash_attention_rope(q, k, v, cos, sin)

    assert_compiles_like_eager(block)


# ---- GPU only ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_rope_in_attention_low_precision_error_within_2x_pytorch(dtype):
    """bf16/fp16: the fused kernels' error against float64 is at most ~2x that of
    version 2's PyTorch maths (RoPE, then attention) in the same dtype."""
    shape = (2, 8, 2, 333, 64)
    qkv, grad, cos, sin = qkv_inputs(*shape)
    want = forward_backward(reference, qkv, grad, cos, sin, 8, 2, torch.float64)
    ours = forward_backward(fused, qkv, grad, cos, sin, 8, 2, dtype)
    theirs = forward_backward(reference, qkv, grad, cos, sin, 8, 2, dtype)
    for name, a, b, ref in zip(["out", "dq", "dk", "dv"], ours, theirs, want):
        e_ours, e_theirs = max_error(a, ref), max_error(b, ref)
        assert e_ours <= 2 * e_theirs + 1e-3 * ref.abs().max().item(), \
            f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_gpu_every_config_rotates_correctly(monkeypatch, kernel):
    """Each autotuning candidate of this GPU, forced in turn, with RoPE on load, bf16:
    within 2x PyTorch's own bf16 error (plus a floor), as the plain kernels are."""
    qkv, grad, cos, sin = qkv_inputs(2, 4, 2, 200, 64)
    want = forward_backward(reference, qkv, grad, cos, sin, 4, 2, torch.float64)
    pytorch = forward_backward(reference, qkv, grad, cos, sin, 4, 2, torch.bfloat16)
    bound = [2 * max_error(p, w) + 1e-3 * w.abs().max().item() for p, w in zip(pytorch, want)]
    for config in configs.candidates(configs.SPECS[kernel], common.current_target(), 64, 2,
                                     "rope"):
        configs.FORCED_CONFIGS[kernel] = dict(config)
        got = forward_backward(fused, qkv, grad, cos, sin, 4, 2, torch.bfloat16)
        errors = [max_error(g, w) for g, w in zip(got, want)]
        assert all(e <= b for e, b in zip(errors, bound)), (config, errors, bound)


@pytest.mark.slow
def test_the_model_switch_refuses_compile_with_one_line(tmp_path):
    """--rope-in-attention runs eager; with --compile it is a usage error (exit 2), said in
    one line before anything runs, and no results file is written."""
    from conftest import REPO, run_cli

    out = tmp_path / "r.json"
    proc = run_cli([REPO / "version3_triton/tiny_llama_v3.py", "--preset", "tiny", "--device", "cpu",
                    "--precision", "fp32", "--num-steps", "1", "--warmup-steps", "0",
                    "--rope-in-attention", "--compile", "--output", out])
    assert proc.returncode == 2, proc.stderr
    assert "--rope-in-attention runs eager only" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
