"""qkv_attention: RoPE + flash attention on the QKV GEMM's output, one autograd step whose
backward writes the QKV gradient in one piece (kernels/qkv_attention.py).

It must compute what the separate steps compute (the RoPE kernel, then flash_attention,
with autograd gathering q's, k's and v's gradients into the QKV gradient), checked against
float64 PyTorch and against those steps in the same dtype, and the gather must be gone.
On a CPU the kernels run in Triton's interpreter: fp32 and fp16, tiny ragged shapes.
The QKV gradient is filled with NaN before the kernels write it (POISON_OUTPUTS).
"""
import pytest
import torch

from conftest import aten_ops_of

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common  # noqa: E402
from test_attention_rope import (SHAPES, assert_compiles_like_eager,  # noqa: E402
                                    assert_matches_fp64_and_the_separate_steps, counted_flops,
                                    forward_backward, max_error, qkv_inputs, reference, unfused)

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


def whole(qkv, cos, sin, heads, kv_heads):
    return tk.qkv_attention(qkv, cos, sin, heads)


@pytest.mark.parametrize("shape, dtype", [  # make test-slow: the sequences past one tile
    pytest.param(shape, dtype, id="b{}-h{}-kv{}-t{}-d{}-".format(*shape) + name,
                 marks=[pytest.mark.slow] if shape[3] > 17 else [])
    for shape in SHAPES + [(2, 4, 1, 67, 32)]
    for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16"))])
def test_qkv_attention_matches_fp64_and_the_separate_steps(shape, dtype):
    assert_matches_fp64_and_the_separate_steps(whole, shape, dtype)


def backward_ops(fn) -> set:
    qkv, grad, cos, sin = qkv_inputs(1, 4, 2, 9, 16)
    out = fn(qkv.requires_grad_(), cos, sin, 4, 2)
    return aten_ops_of(lambda: out.backward(grad))


def test_the_backward_gathers_nothing():
    """The separate steps' backward gathers the QKV gradient (slice_backward: a zero-filled
    QKV-shaped buffer and a copy per slice; add: their sum); the one step allocates it
    and lets the kernels write it. (Triton's CPU interpreter adds copies of its own to
    both, so copies are not counted.)"""
    gather = {"add", "zeros", "new_zeros", "slice_backward", "cat", "index_put_"}
    assert backward_ops(unfused) & gather, "the reference path no longer gathers: test is moot"
    assert not backward_ops(whole) & gather, backward_ops(whole) & gather


def test_the_flop_counter_counts_attention_once_each_way():
    """Inside eager_operators() the forward is RoPE's and attention's operators; the
    backward is one operator carrying attention's backward FLOP formula."""
    counts, forward = counted_flops(whole)
    assert counts == {"tinyllama_v3.attention_forward": forward,
                      "tinyllama_v3.qkv_attention_backward": 2.5 * forward}


def test_the_flop_counter_counts_the_recomputing_backward_the_same():
    """recompute_rope's backward is an operator of its own (it rotates q and k inside):
    the same attention FLOPs, the rotation adding none."""
    counts, forward = counted_flops(
        lambda qkv, cos, sin, heads, kv_heads: tk.qkv_attention(qkv, cos, sin, heads, recompute_rope=True))
    assert counts == {"tinyllama_v3.attention_forward": forward,
                      "tinyllama_v3.qkv_attention_backward_rotating": 2.5 * forward}


@pytest.mark.slow
def test_torch_compile_traces_through_qkv_attention():
    assert_compiles_like_eager(lambda qkv, cos, sin: tk.qkv_attention(qkv * 0.5, cos, sin, 2))


@pytest.mark.parametrize("operators", [False, True], ids=["eager", "operators"])
def test_recompute_rope_gives_the_same_bits_and_keeps_no_rotated_q_k(operators):
    """recompute_rope: the backward rotates q and k again with the same kernel, so output and
    gradient are identical; autograd keeps qkv, O, LSE and the tables, not the rotated q and k."""
    qkv, grad, cos, sin = qkv_inputs(1, 4, 2, 9, 16)

    def run(recompute):
        leaf = qkv.clone().requires_grad_()
        saved = []
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t,
                                                         lambda t: t)
        with hooks, (common.eager_operators() if operators else torch.enable_grad()):
            out = tk.qkv_attention(leaf, cos, sin, 4, recompute_rope=recompute)
            out.backward(grad)
        return out.detach(), leaf.grad, saved

    (out, d_qkv, kept), (out_r, d_qkv_r, kept_r) = run(False), run(True)
    assert torch.equal(out, out_r) and torch.equal(d_qkv, d_qkv_r)
    rotated = (1, 9, 4 + 2, 16)  # (B, T, q and k heads, D)
    assert rotated in kept and rotated not in kept_r, (kept, kept_r)


def test_recompute_rope_keeps_no_rotated_q_k_under_torch_compile():
    """Compiled, the backward's rotation must stay in the backward: a computation that needs
    nothing of the backward the compiler may move into the forward (or merge with the
    forward's identical call) and keep its output, as if recompute_rope were off. What the
    compiled forward hands its backward (the saved tensors) must hold no rotated q and k.
    (On a CPU the operators are opaque custom_ops; the GPU test below covers triton_op.)"""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    qkv, _, cos, sin = qkv_inputs(1, 4, 2, 9, 16)
    rotated = (1, 9, 4 + 2, 16)  # (B, T, q and k heads, D)

    def kept_by_forward(recompute):
        torch._dynamo.reset()
        backend = AotEagerAndRecordGraphs()
        fn = torch.compile(lambda x: tk.qkv_attention(x, cos, sin, 4, recompute_rope=recompute),
                           backend=backend, fullgraph=True)
        fn(qkv.clone().requires_grad_()).sum().backward()
        (output,) = [n for n in backend.fw_graphs[0].graph.nodes if n.op == "output"]
        return [tuple(a.meta["val"].shape) for a in output.args[0] if "val" in a.meta]

    assert rotated in kept_by_forward(False), "the default keeps them: test is moot"
    assert rotated not in kept_by_forward(True)


def test_bad_head_counts_are_refused():
    qkv, _, cos, sin = qkv_inputs(1, 2, 1, 5, 16)  # 2 + 2 * 1 heads
    with pytest.raises(ValueError, match="qkv_attention wants"):
        tk.qkv_attention(qkv, cos, sin, 3)  # 1 head left: not k and v of equal count


def test_gradient_slots_are_checked():
    """A kernel writes a gradient into a whole tensor from a given head on: it must fit."""
    import importlib

    fa = importlib.import_module("version3_triton.kernels.flash_attention_backward")
    like, base = torch.empty(1, 2, 5, 16), torch.empty(1, 5, 4, 16)  # (B, heads, T, D), (B, T, heads, D)
    tensor, strides, head0 = fa._grad_slot((base, 2), like)
    assert tensor is base and strides == (320, 16, 64) and head0 == 2
    with pytest.raises(ValueError, match="no room for heads 3..4"):
        fa._grad_slot((base, 3), like)
    with pytest.raises(ValueError, match="shape"):
        fa._grad_slot(torch.empty(1, 2, 6, 16), like)


@pytest.mark.slow
def test_the_backward_ops_tool_shows_the_gather_and_its_absence(capsys):
    """benchmarks/backward_ops.py (exercise V3-6) lists each backward's operators."""
    import importlib

    assert importlib.import_module("benchmarks.backward_ops").main() == 0
    lines = {line.split("  ")[1].strip(): line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "slice_backward" in lines["attention on QKV, separate steps"]
    assert "slice_backward" not in lines["attention on QKV, qkv_attention"]
    assert "cat" in lines["SwiGLU, silu_mul on the halves"]
    assert "cat" not in lines["SwiGLU, swiglu"] and "slice_backward" not in lines["SwiGLU, swiglu"]


# ---- GPU only ------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_qkv_attention_low_precision_error_within_2x_pytorch():
    """bf16: the error against float64 is at most ~2x that of version 2's PyTorch maths."""
    shape = (2, 8, 2, 333, 64)
    qkv, grad, cos, sin = qkv_inputs(*shape)
    want = forward_backward(reference, qkv, grad, cos, sin, 8, 2, torch.float64)
    ours = forward_backward(whole, qkv, grad, cos, sin, 8, 2, torch.bfloat16)
    theirs = forward_backward(reference, qkv, grad, cos, sin, 8, 2, torch.bfloat16)
    for name, a, b, ref in zip(["out", "dq", "dk", "dv"], ours, theirs, want):
        e_ours, e_theirs = max_error(a, ref), max_error(b, ref)
        assert e_ours <= 2 * e_theirs + 1e-3 * ref.abs().max().item(), \
            f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


def test_an_opaque_operator_runs_its_body_as_eager_code(monkeypatch):
    """The compiled code calls an opaque operator's body at run time - under CUDA graphs,
    while they capture - so the body launches as eager code does (kernels bound, tuned
    before), never through wrap_triton, whose autotuner would time candidates mid-capture."""
    from version3_triton.kernels import operators
    seen = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(operators.IN_OPERATOR)
        return x * 2

    monkeypatch.setattr(operators, "USE_TRITON_OP", True)  # as on a GPU: opaque decides
    op = operators.define_op("opaque_probe_for_tests", probe, lambda x: torch.empty_like(x),
                             opaque=True)
    x = torch.ones(3)
    assert torch.equal(op(x), x * 2)
    assert torch.equal(torch.compile(lambda t: op(t) + 1, backend="aot_eager")(x), x * 2 + 1)
    assert seen == [False, False]
    # registered with the dispatcher itself: no custom_op's layers of Python around each call
    assert isinstance(op, torch._ops.OpOverload)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Autograd")


@pytest.mark.gpu
def test_gpu_inductor_launches_qkv_attention_itself():
    """Under torch.compile Inductor launches the RoPE and attention kernels of the
    backward from its own code, with no gather of the QKV gradient around them."""
    if not common.USE_TRITON_OP:
        pytest.skip(f"torch {torch.__version__} has no torch.library.triton_op")
    from torch._inductor.utils import run_and_get_code

    qkv, grad, cos, sin = qkv_inputs(2, 4, 2, 130, 64)
    want = forward_backward(whole, qkv, grad, cos, sin, 4, 2, torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(whole, fullgraph=True)
    got, codes = run_and_get_code(forward_backward, compiled, qkv, grad, cos, sin, 4, 2,
                                  torch.bfloat16)
    code = "\n".join(codes)
    for kernel in ("_rope_kernel", "_attn_fwd_kernel", "_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"):
        assert kernel in code, f"{kernel} is not launched by Inductor's code"
    assert "torch.ops.tinyllama_v3" not in code, "the compiled code calls back into Python"
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_compiled_recompute_rope_holds_no_rotated_q_k():
    """Compiled by Inductor (the triton_op path, which traces into the operators), the step
    from forward to backward holds exactly one copy of q and k less with recompute_rope: the
    rotation stays in the backward (kernels/qkv_attention.py says why that takes an opaque
    operator)."""
    B, T, H, H_kv, D = 2, 256, 8, 4, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, T, H + 2 * H_kv, D, device="cuda", dtype=torch.bfloat16,
                      generator=g).requires_grad_()
    cos, sin = (torch.randn(T, D, device="cuda", generator=g) for _ in range(2))

    def held_after_forward(recompute):
        torch._dynamo.reset()
        fn = torch.compile(lambda t: tk.qkv_attention(t * 2, cos, sin, H, recompute_rope=recompute))
        fn(qkv).float().sum().backward()  # compiles both graphs
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = fn(qkv)
        held = torch.cuda.memory_allocated() - before
        out.float().sum().backward()
        return held

    rotated = B * T * (H + H_kv) * D * 2  # bytes of the rotated q and k, bf16
    assert held_after_forward(False) - held_after_forward(True) == pytest.approx(rotated, rel=0.01)
