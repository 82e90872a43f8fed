"""Causal flash attention (kernels/flash_attention.py and flash_attention_backward.py) against
float64 PyTorch, forward and backward: GQA, odd lengths, head sizes 16..128, strided views.
On a GPU also: bf16/fp16 error at most ~2x PyTorch's own, and every launch configuration of
this vendor's table. Outputs start as NaN (POISON_OUTPUTS): an element a kernel forgets to
write fails the comparison."""
import warnings

import pytest
import torch

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs, launch_args  # noqa: E402
from kernel_checks import (  # noqa: E402
    ATTENTION_SHAPES, DEVICE, TOLERANCE, assert_matches, attention_inputs, attention_reference, forward_backward,
    max_error, pytorch_error, rope_inputs)

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


# ---- the Hopper path (attention_hopper.py): Gluon kernels at head sizes 64 and 128 on sm_90 --
hopper = tk.attention_hopper


def test_hopper_path_reads_the_models_layout_and_pytorchs():
    """TMA reads a 2D view: a row per token (the model's q, k, v, slices of the QKV output)
    or a row per head and position (contiguous); any other layout takes the portable path."""
    B, H, H_kv, T, D = 2, 4, 2, 64, 128
    qkv = torch.randn(B, T, H + 2 * H_kv, D, dtype=torch.bfloat16)
    q, v = qkv[:, :, :H].transpose(1, 2), qkv[:, :, H + H_kv:].transpose(1, 2)
    assert hopper.by_token(q) is True and hopper.by_token(v) is True
    assert hopper.by_token(torch.randn(B, H, T, D)) is False
    if hopper.AVAILABLE:  # the 2D views the TMA descriptors move tiles of
        as_2d = lambda d: (d.shape, d.strides)  # noqa: E731
        assert as_2d(hopper._descriptor(v, True)) == ([B * T, H_kv * D], [(H + 2 * H_kv) * D, 1])
        contiguous = qkv.new_zeros(B, H, T, D)
        assert as_2d(hopper._descriptor(contiguous, False)) == ([B * H * T, D], [D, 1])
    assert hopper.by_token(torch.randn(B, H, D, T).transpose(2, 3)) is None  # D not contiguous
    assert hopper.by_token(torch.randn(B, T, H, 2 * D)[..., :D].transpose(1, 2)) is None
    assert not hopper.supported(q, q, q)  # no GPU here, or not this one's tensors


def test_hopper_check_compiles_without_a_warning(monkeypatch):
    """A compiled V3 asks whether the GPU is a Hopper while torch.compile traces: the answer is
    a constant to it, read once, with no warning on the attendee's screen."""
    monkeypatch.setattr(hopper, "_capability", lambda index: (9, 0))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = torch.compile(lambda x: x + 1 if hopper._is_hopper(0) else x - 1,
                                 fullgraph=True, backend="eager")
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))


def test_hopper_kernels_leave_outputs_tma_cannot_write_to_the_portable_ones():
    """The Hopper kernels write O, dQ, dK and dV by TMA: an output in a layout TMA cannot
    write (or dK and dV in two layouts) makes them decline before any launch, so the caller
    runs the portable kernels, and the Hopper path stays on for the next call."""
    q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 64)
    odd = torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16).transpose(2, 3)  # D not contiguous
    by_token = torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert hopper.by_token(odd) is None and hopper.by_token(by_token) is True
    assert hopper.forward(q, q, q, odd, lse, 0.1) is False
    for dq, dk, dv in ((odd, q.clone(), q.clone()), (q.clone(), odd, odd),
                       (q.clone(), q.clone(), by_token)):
        assert hopper.backward(q, q, q, q, q, lse, 0.1, dq, dk, dv, lse.clone()) is False
    assert hopper.ENABLED


@pytest.mark.parametrize("n_kv, group", [(64, 2), (16, 1), (12, 4), (7, 2), (3, 1)])
def test_hopper_grid_runs_every_head_in_sets_of_kv_heads(n_kv, group):
    """The launch order: sets of at most SET_HEADS kv heads, each with its query heads, on
    program_id axes 0 (the set's heads) and 2 (the sets): every (batch, head) row once."""
    heads, blocks, sets = hopper._grid(n_kv, 512, group)
    assert blocks == 512 // hopper.BLOCK and heads * sets == n_kv * group
    size = heads // group  # the largest set that divides the kv heads evenly
    assert heads % group == 0 and n_kv % size == 0 and size <= hopper.SET_HEADS
    assert all(n_kv % larger for larger in range(size + 1, min(n_kv, hopper.SET_HEADS) + 1))


def test_hopper_kernels_that_do_not_build_hand_over_to_the_portable_ones(monkeypatch):
    if not hopper.AVAILABLE:
        pytest.skip("this Triton has no Gluon")

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("unsupported operation")
            return launch

    monkeypatch.setattr(hopper, "ENABLED", True)
    monkeypatch.setattr(hopper, "_attn_fwd", Broken())
    q = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(1, 2, 64)
    with pytest.warns(UserWarning, match="using the portable Triton kernels"):
        assert hopper.forward(q, q, q, o, lse, 0.1) is False
    assert hopper.ENABLED is False
    # the backward's too, with dO in another layout than q's (copied before its descriptor)
    monkeypatch.setattr(hopper, "ENABLED", True)
    monkeypatch.setattr(hopper, "_attn_bwd_dq", Broken())
    grad_o = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.warns(UserWarning, match="using the portable Triton kernels"):
        assert hopper.backward(grad_o, q, q, q, o, lse, 0.1, *(torch.empty_like(q),) * 3,
                               torch.empty_like(lse)) is False
    assert hopper.ENABLED is False


def test_hopper_descriptors_take_their_own_bound_entries():
    """The Hopper kernels launch bound (common.launch_fixed) with TMA descriptors among their
    arguments: one is keyed by what its tensor map encodes (dtype, tile, shape, strides), so
    a call with other tensors of the same kind reuses the entry, any other map takes its own."""
    if not hopper.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    t = torch.zeros(2, 4, 128, 128, dtype=torch.bfloat16)

    def key(x, rows=64):
        descriptor = hopper._descriptor(x, hopper.by_token(x), rows)
        return common._bound_key(hopper._attn_fwd, 0, [descriptor], {})[0]

    others = [key(t.half()), key(t, 128), key(t[:1]), key(_by_token(t)),
              key(t.new_zeros(2, 4, 256, 128))]
    assert len({key(t), *others}) == len(others) + 1
    assert key(torch.ones_like(t)) == key(t)


def _on_hopper(shape):
    inputs, grad = attention_inputs(*shape)
    if not hopper.supported(*(t.to(torch.bfloat16) for t in inputs)):
        pytest.skip("the Hopper path runs on an sm_90 GPU with Gluon")
    return inputs, grad


def _by_token(t):
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.gpu
def test_gpu_hopper_kernels_replay_their_plans_bitwise():
    """A warm call replays the Hopper kernels' launch plans (each tensor map encoded once, no
    descriptor built): the same bits as the calls before it, through flash_attention and
    through qkv_attention (its gradient slots are views into one QKV-shaped tensor)."""
    inputs, grad = _on_hopper((2, 8, 4, 256, 128))
    qkv, cos, sin = rope_inputs(2, 256, 16, 128)
    qkv = qkv.to(torch.bfloat16).requires_grad_()
    common.forget_plans()

    def step():
        out = forward_backward(tk.flash_attention, inputs, grad, torch.bfloat16)
        o = tk.qkv_attention(qkv, cos, sin, 8)
        (d_qkv,) = torch.autograd.grad(o, qkv, torch.ones_like(o))
        return [*out, o.detach(), d_qkv]

    runs = [step() for _ in range(3)]  # Triton's launch, bound and recorded, replayed
    if not any(isinstance(entry[0], launch_args.MapLaunch) for entry in common._BOUND.values()):
        pytest.skip("this Triton's launcher is not the one MapLaunch calls: no Hopper plans")
    assert {key[0] for key in common.PLANS} >= {"attn_fwd", "attn_bwd", "attn_bwd_into"}
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["by head", "by token"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 4, 4, 256, 128), (2, 8, 4, 192, 128), (1, 2, 1, 64, 128),
                                   (2, 4, 2, 256, 64)],
                         ids=lambda s: "b{}-h{}-kv{}-t{}-d{}".format(*s))
def test_gpu_hopper_kernels_error_within_2x_pytorch(shape, dtype, layout):
    """The Gluon kernels ran (chosen_configs says so), their error at most ~2x PyTorch's
    own in this dtype, in both layouts TMA reads, GQA included."""
    inputs, grad = _on_hopper(shape)
    arrange = _by_token if layout == "by token" else (lambda t: t)

    def attention(q, k, v):
        return tk.flash_attention(*(arrange(t) for t in (q, k, v)))

    reference = forward_backward(attention_reference, inputs, grad, torch.float64)
    ours = pytorch_error(attention, inputs, grad, dtype, reference)
    assert all(how == hopper.HOW for how, _ in (common._LAST[name] for name in
                                                 ("attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv")))
    theirs = pytorch_error(attention_reference, inputs, grad, dtype, reference)
    for name, e_ours, e_theirs, ref in zip(["out", "dq", "dk", "dv"], ours, theirs, reference):
        floor = 1e-3 * ref.abs().max().item()
        assert e_ours <= 2 * e_theirs + floor, f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


@pytest.mark.gpu
def test_gpu_hopper_kernels_bound_match_triton_s_launch(monkeypatch):
    """The Hopper kernels launched bound (their second call on) give the bits Triton's own
    launch gives."""
    inputs, grad = _on_hopper((2, 4, 2, 256, 128))
    inputs = [t.to(torch.bfloat16) for t in inputs]

    def run():
        q, k, v = (_by_token(t).detach().requires_grad_() for t in inputs)
        out = tk.flash_attention(q, k, v)
        out.backward(grad.to(out.dtype))
        return [out.detach(), q.grad, k.grad, v.grad]

    monkeypatch.setattr(common, "BIND", False)
    through_triton = run()
    monkeypatch.setattr(common, "BIND", True)
    common.forget_plans()
    run()  # binds
    assert all(torch.equal(a, b) for a, b in zip(run(), through_triton))
    assert common._LAST["attn_bwd_dkdv"][0] == hopper.HOW


@pytest.mark.gpu
@pytest.mark.parametrize("forced", ["attn_fwd", "attn_bwd_dkdv"])
def test_gpu_a_forced_tile_turns_off_the_hopper_kernels_of_its_direction_only(monkeypatch, forced):
    """Exercise V3-3 forces the forward's tile and reads the forward's time: the forward then
    runs the portable kernel with that tile and the backward stays on the Hopper kernels (and
    the reverse), the two mixed still within ~2x PyTorch's error."""
    inputs, grad = _on_hopper((2, 4, 2, 256, 64))
    tile = (dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2) if forced == "attn_fwd"
            else dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2))
    monkeypatch.setitem(configs.FORCED_CONFIGS, forced, tile)
    reference = forward_backward(attention_reference, inputs, grad, torch.float64)
    ours = pytorch_error(tk.flash_attention, inputs, grad, torch.bfloat16, reference)
    theirs = pytorch_error(attention_reference, inputs, grad, torch.bfloat16, reference)
    assert tk.chosen_configs()[forced].startswith("forced")
    hopper_side = "attn_bwd_dkdv" if forced == "attn_fwd" else "attn_fwd"
    assert common._LAST[hopper_side][0] == hopper.HOW
    for name, e_ours, e_theirs, ref in zip(["out", "dq", "dk", "dv"], ours, theirs, reference):
        assert e_ours <= 2 * e_theirs + 1e-3 * ref.abs().max().item(), name


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_hopper_path_on_qkv_error_within_2x_the_portable_kernels(D):
    """V3's default call: RoPE and attention on the QKV output, its gradient written in
    place (dv into qkv's v slots, dO arriving in another layout than q's), with the Hopper
    kernels and without, against PyTorch in fp64."""
    import test_attention_rope as rope_checks
    B, H, H_kv, T = 2, 8, 4, 256
    _on_hopper((B, H, H_kv, T, D))
    qkv, grad, cos, sin = rope_checks.qkv_inputs(B, H, H_kv, T, D)

    def run(fn, dtype):
        return rope_checks.forward_backward(fn, qkv, grad, cos, sin, H, H_kv, dtype)

    def whole(qkv, cos, sin, heads, kv_heads):
        return tk.qkv_attention(qkv, cos, sin, heads)

    reference = run(rope_checks.reference, torch.float64)
    with hopper.portable():
        portable = [max_error(a, b) for a, b in zip(run(whole, torch.bfloat16), reference)]
    ours = [max_error(a, b) for a, b in zip(run(whole, torch.bfloat16), reference)]
    assert common._LAST["attn_bwd_dkdv"][0] == hopper.HOW
    for name, e_ours, e_portable, ref in zip(["out", "dq", "dk", "dv"], ours, portable, reference):
        floor = 1e-3 * ref.abs().max().item()
        assert e_ours <= 2 * e_portable + floor, f"{name}: {e_ours:.3g} vs {e_portable:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("recompute_rope, D", [(False, 128), (True, 128), (False, 64)],
                         ids=["kept", "recomputed", "kept-d64"])
def test_gpu_compiled_step_runs_the_hopper_kernels(recompute_rope, D):
    """Under torch.compile with CUDA graphs (V3's best mode) attention on the QKV output
    calls the Hopper kernels' opaque operators: they run (chosen_configs says so), and the
    output and gradient match the eager call's."""
    import test_attention_rope as rope_checks
    B, H, H_kv, T = 2, 8, 4, 256
    _on_hopper((B, H, H_kv, T, D))
    qkv, grad, cos, sin = rope_checks.qkv_inputs(B, H, H_kv, T, D)

    def step(qkv, cos, sin, heads, kv_heads):
        return tk.qkv_attention(qkv, cos, sin, heads, recompute_rope=recompute_rope)

    eager = rope_checks.forward_backward(step, qkv, grad, cos, sin, H, H_kv, torch.bfloat16)
    compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)  # shared by both D
    common._LAST.clear()
    for _ in range(3):  # warm-up, capture, replay
        ours = rope_checks.forward_backward(compiled, qkv, grad, cos, sin, H, H_kv, torch.bfloat16)
    assert all(common._LAST[name][0] == hopper.HOW for name in ("attn_fwd", "attn_bwd_dkdv"))
    for name, a, b in zip(["out", "dq", "dk", "dv"], ours, eager):
        assert max_error(a, b) <= 1e-2 * b.abs().max().item(), name

