"""RMSNorm (kernels/rmsnorm.py) against float64 PyTorch, forward and backward: the plain norm
(rows not a multiple of the block, fp16 with an fp32 weight, the autocast dtype written
directly, its launch rule) and the residual add in front of it (add_rms_norm): h = x + delta,
y = rms_norm(h) * w and the gradients of x, delta and w, with and without a gradient
arriving at h along the residual path, delta in another dtype than x (the bf16/fp16 branch
output of an autocast GEMM added to the fp32 residual stream). Outputs start as NaN, so an
element a kernel forgets to write shows. The weight gradient, summed inside the backward
kernel by the last programs to finish, counts every row once in ragged groups and leaves
its counters at 0. V3's `--fused-residual-norm` model gives V1's logits and V1's gradient
for every parameter, as the switch-off model does; through the command line the switch is
accepted and recorded. On a GPU: bf16/fp16 error at most ~2x PyTorch's own, and the weight
gradient bitwise the same every run and on two streams at once.
"""
import json

import pytest
import torch

from conftest import HAS_GPU, load_version
from test_v3_model import (assert_within_2x, config, errors,  # noqa: F401
                           no_autotuning, results, scales, v1_and_v3)

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs, rmsnorm, row_sums  # noqa: E402
from kernel_checks import (  # noqa: E402
    NORM_SHAPES, assert_matches, forward_backward, max_error, pytorch_error, rms_norm_reference,
    triton_next_power_of_2)

pytestmark = pytest.mark.usefixtures("poisoned_kernels")
DEVICE = "cuda" if HAS_GPU else "cpu"
F32, F16 = torch.float32, torch.float16


def inputs(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, delta, grad_h, grad_y = (torch.randn(*shape, generator=g).to(DEVICE) for _ in range(4))
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE)
    return x, delta, w, grad_h, grad_y


def outputs_and_grads(fn, x, delta, w, grad_h, grad_y):
    """[h, y, dx, ddelta, dw] after backward from y, and from h too when grad_h is given."""
    leaves = [t.detach().requires_grad_() for t in (x, delta, w)]
    h, y = fn(*leaves)
    if grad_h is None:  # h unused: only the norm's gradient
        y.backward(grad_y.to(y.dtype))
    else:
        torch.autograd.backward([h, y], [grad_h.to(h.dtype), grad_y.to(y.dtype)])
    return [h.detach(), y.detach(), *(t.grad for t in leaves)]


@pytest.mark.parametrize("x_dtype, delta_dtype, out_dtype", [
    (F32, F32, None), (F32, F16, F16), (F16, F16, None)],
    ids=["fp32", "fp32-stream-fp16-branch", "fp16"])
@pytest.mark.parametrize("shape", [(3, 17, 48), (2, 5, 1000)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual_grad", [True, False], ids=["grad_h", "no-grad_h"])
def test_add_rms_norm_matches_fp64(shape, x_dtype, delta_dtype, out_dtype, residual_grad):
    x, delta, w, grad_h, grad_y = inputs(shape)
    x, delta = x.to(x_dtype), delta.to(delta_dtype)
    grad_h = grad_h if residual_grad else None

    def kernel(x_, delta_, w_):
        return tk.add_rms_norm(x_, delta_, w_, 1e-5, out_dtype)

    def reference(x_, delta_, w_):  # float64 throughout
        return rmsnorm.add_rms_norm_reference(x_.double(), delta_.double(), w_.double())

    got = outputs_and_grads(kernel, x, delta, w, grad_h, grad_y)
    want = outputs_and_grads(reference, x, delta, w, grad_h, grad_y)
    # h keeps x's dtype (the residual stream), y the requested one; each gradient
    # has its input's dtype - delta's written by the backward kernel's second store.
    assert [t.dtype for t in got] == [x_dtype, out_dtype or torch.promote_types(x_dtype, F32),
                                      x_dtype, delta_dtype, F32]
    tol = 2e-5 if x_dtype == delta_dtype == F32 else 5e-3
    assert_matches(got, want, tol, ["h", "y", "dx", "ddelta", "dweight"])


def test_nothing_to_add_is_the_plain_norm():
    x, _, w, _, _ = inputs((4, 24))
    h, y = tk.add_rms_norm(x, None, w)
    assert h is x and torch.equal(y, tk.rms_norm(x, w))


def test_backward_keeps_only_its_input_and_the_weight():
    """Saved for backward: the norm's input and the weight - with the residual add, h (an
    output, kept anyway), not x and delta; no 1/rms per row (the backward recomputes it)."""
    x, delta, w, _, _ = inputs((3, 5, 32))
    x, delta, w = (t.requires_grad_() for t in (x, delta, w))
    for norm, first in ((lambda: tk.add_rms_norm(x, delta, w)[0], None),
                        (lambda: tk.rms_norm(x, w), x)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                      lambda t: t):
            out = norm()
        assert len(saved) == 2 and saved[0] is (first if first is not None else out)
        assert saved[1] is w


def test_delta_of_another_shape_is_refused():
    x, delta, w, _, _ = inputs((3, 16))
    with pytest.raises(ValueError, match="not x's shape"):
        tk.add_rms_norm(x, delta[:2], w)


def test_torch_compile_traces_through_the_operators():
    """aot_eager: the two operators under dynamo and AOT autograd, as in --compile."""
    x, delta, w, grad_h, grad_y = inputs((2, 7, 40))
    delta = delta.to(F16)

    def fn(x_, delta_, w_):
        return tk.add_rms_norm(x_, delta_, w_, 1e-5, F16)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = outputs_and_grads(compiled, x, delta, w, grad_h, grad_y)
    want = outputs_and_grads(fn, x, delta, w, grad_h, grad_y)
    assert_matches(got, want, 1e-6, ["h", "y", "dx", "ddelta", "dweight"])


# ---- the model -----------------------------------------------------------------------
@pytest.fixture
def v3():
    return load_version("v3")


@pytest.mark.slow  # V3's defaults (this fusion on) match V1 in test_v3_model.py in make test
def test_model_with_fused_residual_norm_matches_v1_and_the_unfused_model(v3):
    """Same V1 weights: the fused model, the unfused one and V1 give the same logits
    and the same gradient for every parameter (in V1's layout)."""
    cfg = config(tied=True)
    reference, fused = v1_and_v3(cfg)
    _, unfused = v1_and_v3(cfg, fused_residual_norm=False)
    assert isinstance(fused, v3.ResidualNormLlama) and not isinstance(unfused, v3.ResidualNormLlama)
    assert fused.state_dict().keys() == unfused.state_dict().keys()
    want, got = results(reference, fused, 2, 21)
    _, got_unfused = results(reference, unfused, 2, 21)
    scale = scales(want)
    for other in (want, got_unfused):
        for name, err in errors(got, other).items():
            assert err <= 1e-5 * scale[name], f"{name}: error {err:.3g}, scale {scale[name]:.3g}"


@pytest.mark.slow
def test_model_in_low_precision_autocast_matches_the_unfused_model(v3):
    """Under autocast each branch output (an autocast GEMM's) is bf16/fp16 while the
    residual stream stays fp32: the fused model is as close to V1 in fp32 as the
    unfused one (within 2x). The CPU runs fp16: Triton's interpreter rounds fp32 to
    bf16 its own way, not to nearest-even as PyTorch and the GPU compilers do."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    cfg = config()
    reference, fused = v1_and_v3(cfg)
    _, unfused = v1_and_v3(cfg, fused_residual_norm=False)
    exact, ours = results(reference, fused, 2, 13, dtype)
    _, theirs = results(reference, unfused, 2, 13, dtype)
    assert_within_2x(exact, ours, theirs, "fused", "unfused")


@pytest.mark.slow  # ~15 s of command lines: make test-slow
def test_switch_is_accepted_and_recorded(tmp_path, v3, monkeypatch, capsys):
    """--no-fused-residual-norm through V3's main (the command line's parser, in this process):
    the results JSON records it and the gradient guard passes (the default run: test_v3_model's
    loss curve; the same losses either way:
    test_model_with_fused_residual_norm_matches_v1_and_the_unfused_model)."""
    monkeypatch.setenv("V3_AUTOTUNE", "0")
    out = tmp_path / "off.json"
    code = v3.main(["--preset", "tiny", "--device", DEVICE, "--precision", "fp32", "--batch-size", "2",
                    "--num-steps", "3", "--warmup-steps", "1", "--quiet", "--output", str(out),
                    "--no-fused-residual-norm"])
    assert code == 0, capsys.readouterr().err
    off = json.loads(out.read_text())
    assert off["options"]["fused_residual_norm"] is False and off["gradient_guard"]["passed"]


@pytest.mark.slow
def test_blocks_stay_modules_for_checkpointing_and_hooks(v3):
    """The fused model still calls each block as a module: --grad-checkpoint's wrapper
    (training.trainer) recomputes it in backward and profiler hooks see it."""
    from training.trainer import enable_grad_checkpointing

    cfg = config()
    reference, fused = v1_and_v3(cfg)
    want, _ = results(reference, fused, 2, 13)
    calls = []
    fused.layers[0].register_forward_hook(lambda *_: calls.append("block 0"))
    enable_grad_checkpointing(fused)
    _, got = results(reference, fused, 2, 13)
    assert calls, "block 0 was never called as a module"
    scale = scales(want)
    for name, err in errors(got, want).items():
        assert err <= 1e-5 * scale[name], f"{name}: error {err:.3g} with checkpointing"


# ---- the plain norm ------------------------------------------------------------------
@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.float32, torch.float32),
                                              (torch.float16, torch.float16),
                                              (torch.float16, torch.float32)],
                         ids=["fp32", "fp16", "fp16-fp32weight"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_forward_and_backward_match_fp64(shape, x_dtype, w_dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g).to(DEVICE)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE)
    grad = torch.randn(*shape, generator=g).to(DEVICE)

    def kernel(x_, w_):
        return tk.rms_norm(x_.to(x_dtype), w_.to(w_dtype))

    got = forward_backward(kernel, [x, w], grad)
    want = forward_backward(rms_norm_reference, [x, w], grad, torch.float64)
    # The output has the dtype PyTorch's x * weight would have (version 1's rule).
    assert got[0].dtype == torch.promote_types(x_dtype, w_dtype)
    tol = 2e-5 if x_dtype == w_dtype == torch.float32 else 5e-3
    assert_matches(got, want, tol, ["y", "dx", "dweight"])


def test_rms_norm_can_write_the_autocast_dtype():
    x, w = torch.randn(5, 48, device=DEVICE), torch.randn(48, device=DEVICE)
    y = tk.rms_norm(x, w, 1e-5, torch.float16)
    assert y.dtype == torch.float16
    assert max_error(y, rms_norm_reference(x.double(), w.double())) <= 2e-3 * y.abs().max().item()


@pytest.mark.parametrize("kernel", ["rmsnorm_fwd", "rmsnorm_bwd"])
def test_rmsnorm_rule_gives_whole_rows_and_sane_warps(kernel):
    """The RMSNorm rule (no autotuning): a tile holds whole rows, ~8+ elements per
    thread, 1..16 warps, for hidden sizes 1..64k; 1024 gets one row per forward program."""
    nvidia = common.nvidia_target(90)
    for n_cols in (1, 37, 64, 1000, 1024, 4096, 65536):
        config = rmsnorm.rmsnorm_config(kernel, n_cols, nvidia)
        tile = config["BLOCK_ROWS"] * triton_next_power_of_2(n_cols)
        assert 1 <= config["num_warps"] <= 16 and config["BLOCK_ROWS"] >= 1
        assert config["num_warps"] in (1, 16) or tile // (32 * config["num_warps"]) >= 8, config
        assert tk.check_config(kernel, config, n_cols, 2)  # a legal forced config too
        assert configs.candidates(configs.SPECS[kernel], nvidia, n_cols, 2) == [config]
    assert rmsnorm.rmsnorm_config("rmsnorm_fwd", 1024, nvidia)["BLOCK_ROWS"] == 1


def test_rmsnorm_backward_rule_gives_wide_fp32_rows_32_elements_a_thread():
    """The rule's one measured exception: the backward of fp32 rows of 2048+ on NVIDIA holds
    32 elements a thread (the large preset's residual stream); bf16 rows, 1024-wide rows,
    the forward and AMD (32-lane Radeon too) keep the general rule. A launch reports x's
    element size to it."""
    nvidia, amd, radeon = (common.nvidia_target(90), common.amd_target("gfx942"),
                           common.amd_target("gfx1100"))
    wide = rmsnorm.rmsnorm_config("rmsnorm_bwd", 2048, nvidia, 4)
    assert wide == dict(BLOCK_ROWS=1, num_warps=2, num_stages=1)
    assert rmsnorm.rmsnorm_config("rmsnorm_bwd", 4096, nvidia, 4)["num_warps"] == 4
    assert rmsnorm.rmsnorm_config("rmsnorm_bwd", 2048, nvidia, 2)["num_warps"] == 4
    for kernel, n_cols, target in (("rmsnorm_bwd", 1024, nvidia), ("rmsnorm_fwd", 2048, nvidia),
                                   ("rmsnorm_bwd", 2048, amd), ("rmsnorm_bwd", 4096, amd),
                                   ("rmsnorm_bwd", 2048, radeon)):
        assert (rmsnorm.rmsnorm_config(kernel, n_cols, target, 4)
                == rmsnorm.rmsnorm_config(kernel, n_cols, target, 2)), (kernel, n_cols, target)
    spec = configs.SPECS["rmsnorm_bwd"]
    assert configs.candidates(spec, nvidia, 2048, 4) == [wide]
    assert spec.size({"X": torch.zeros(2, 2048)}, {"BLOCK_COLS": 2048}) == (2048, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_rms_norm_low_precision_error_within_2x_pytorch(dtype):
    x = torch.randn(1000, 1024, device=DEVICE)
    w = 1 + 0.1 * torch.randn(1024, device=DEVICE)
    grad = torch.randn_like(x)
    reference = forward_backward(rms_norm_reference, [x, w], grad, torch.float64)
    ours = pytorch_error(tk.rms_norm, [x, w], grad, dtype, reference)
    theirs = pytorch_error(rms_norm_reference, [x, w], grad, dtype, reference)
    for name, e_ours, e_theirs in zip(["y", "dx", "dweight"], ours, theirs):
        assert e_ours <= 2 * e_theirs + 1e-6, f"{name}: {e_ours:.3g} vs PyTorch {e_theirs:.3g}"


# ---- dw summed inside the backward kernel ---------------------------------------------
@pytest.mark.parametrize("programs", [1, 7], ids=lambda p: f"{p}-programs")
def test_weight_gradient_sums_every_program_row_in_ragged_groups(monkeypatch, programs):
    """The last program of each group (groups of ~sqrt(programs), the last one short) sums
    its group, the last of those sums the groups (row_sums.py): dw counts every row once,
    and the counters are left at 0 for the next launch."""
    monkeypatch.setattr(rmsnorm, "_programs",
                        lambda device, n_rows, n_cols: (programs, -(-n_rows // programs)))
    x, _, w, _, grad = inputs((23, 48), seed=3)
    partial, tickets = kept = row_sums.scratch(x, programs, 48)  # one set for every launch
    assert tickets.numel() == -(-programs // row_sums.group_size(programs)) + 1
    monkeypatch.setattr(row_sums, "scratch", lambda like, programs, n_cols: kept)
    for _ in range(2):  # the counters are back at 0, ready for the next launch
        got = forward_backward(tk.rms_norm, [x, w], grad)
        assert tickets.eq(0).all()
        assert_matches(got, forward_backward(rms_norm_reference, [x, w], grad, torch.float64),
                       2e-5, ["y", "dx", "dweight"])


@pytest.mark.parametrize("n_rows, wave, tile, want", [
    (1024, 528, 4, (256, 4)),   # the small preset: 2 rows a program would fill half a tile
    (8192, 528, 2, (512, 16)),  # the medium preset: 16 rows, already whole tiles
    (8192, 528, 1, (512, 16)),
    (1001, 528, 4, (251, 4)),   # the last chunk short
    (3, 528, 4, (1, 4)),        # fewer rows than one tile
])
def test_backward_chunks_are_whole_tiles_covering_every_row_once(n_rows, wave, tile, want):
    programs, rows_each = rmsnorm._chunks(n_rows, wave, tile)
    assert (programs, rows_each) == want
    assert rows_each % tile == 0 and programs <= wave
    assert (programs - 1) * rows_each < n_rows <= programs * rows_each


@pytest.mark.gpu
def test_gpu_weight_gradient_is_the_same_every_run_and_on_two_streams():
    """Many programs race to draw the last ticket; whoever wins sums the rows in the same
    order, so dw is bitwise the same every run - also with two streams launching at once,
    each with its own counters."""
    x, _, w, _, grad = inputs((4096, 1024), seed=4)
    x, grad = x.bfloat16(), grad.bfloat16()
    want = tk.rmsnorm_backward(grad, x, w, 1e-5)[1]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for _ in range(50):
        got = []
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                got.append(tk.rmsnorm_backward(grad, x, w, 1e-5)[1])
        torch.cuda.synchronize()
        for dw in got:
            assert torch.equal(dw, want)
    reference = forward_backward(rms_norm_reference, [x.float(), w], grad.float(), torch.float64)
    assert max_error(want, reference[2]) <= 1e-3 * reference[2].abs().max().item()
