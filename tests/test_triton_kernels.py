"""Version 3's Triton kernels against float64 PyTorch references, forward and backward.

On a CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1):
fp32 and fp16 (the interpreter has no bf16 tl.dot) on tiny odd shapes. On a GPU the
same tests run there, plus the test_gpu_* ones: bf16/fp16 error at most ~2x the
error of PyTorch's own same-precision maths, every launch configuration of this
vendor's table, and bit-identical repeated runs. Every output buffer is filled with
NaN before the kernels run (POISON_OUTPUTS), so an element a kernel forgets to
write fails the comparison.
"""
import contextlib
import json
import math

import pytest
import torch

from conftest import HAS_GPU

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs, rmsnorm  # noqa: E402
from version3_triton.kernels.swiglu import swiglu_reference  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
KERNELS = list(tk.KERNEL_NAMES)


pytestmark = pytest.mark.usefixtures("poisoned_kernels")


# ---- references (float64, the textbook maths of version 1) -----------------------
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


NORM_SHAPES = [(1, 1), (3, 37), (7, 100), (2, 5, 64)]  # rows not a multiple of the block


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


# ---- launch configurations: the exercise knob, AMD's LDS budget -------------------
SMALL_BLOCKS = {"attn_fwd": dict(BLOCK_M=32, BLOCK_N=16), "attn_bwd_dq": dict(BLOCK_M=32, BLOCK_N=16),
                "attn_bwd_dkdv": dict(BLOCK_M=16, BLOCK_N=32), "rmsnorm_fwd": dict(BLOCK_ROWS=4),
                "rmsnorm_bwd": dict(BLOCK_ROWS=1), "rope": dict(num_warps=1),
                "swiglu_fwd": dict(num_warps=2), "swiglu_bwd": dict(num_warps=8),
                "cross_entropy": dict(num_warps=2)}


def test_forced_configs_change_the_kernels_that_run(monkeypatch):
    """Blocks of different sizes for forward/dQ and dK/dV (so the diagonal spans
    several tiles), set from Python and from the environment, still give the maths."""
    configs.FORCED_CONFIGS.update({k: SMALL_BLOCKS[k] for k in KERNELS if k != "attn_fwd"})
    monkeypatch.setenv("V3_ATTN_FWD_CONFIG", "BLOCK_M=32, BLOCK_N=16, num_warps=4")
    configs.read_environment()  # as V3's preflight does; a launch never reads it
    inputs, grad = attention_inputs(1, 2, 1, 45, 32)
    got = forward_backward(tk.flash_attention, inputs, grad)
    want = forward_backward(attention_reference, inputs, grad, torch.float64)
    assert_matches(got, want, TOLERANCE[torch.float32], ["out", "dq", "dk", "dv"])
    x, w = torch.randn(9, 40, device=DEVICE), torch.randn(40, device=DEVICE)
    got = forward_backward(tk.rms_norm, [x, w], torch.ones_like(x))
    assert_matches(got, forward_backward(rms_norm_reference, [x, w], torch.ones_like(x),
                                         torch.float64), 2e-5, ["y", "dx", "dweight"])
    x, cos, sin = rope_inputs(2, 5, 3, 16)
    got = forward_backward(lambda t: tk.rope(t, cos, sin), [x], torch.ones_like(x))
    assert_matches(got, forward_backward(lambda t: rope_reference(t, cos.double(), sin.double()),
                                         [x], torch.ones_like(x), torch.float64), 2e-5,
                   ["out", "dx"])
    gate_up = torch.randn(3, 2 * 40, device=DEVICE)
    got = forward_backward(tk.swiglu, [gate_up], torch.ones(3, 40, device=DEVICE))
    assert_matches(got, forward_backward(swiglu_reference, [gate_up], torch.ones(3, 40, device=DEVICE),
                                         torch.float64), 2e-5, ["out", "d gate_up"])
    chosen = tk.chosen_configs()
    assert chosen["swiglu_bwd"].startswith("forced: num_warps=8")
    assert chosen["rope"].startswith("forced: num_warps=1")
    assert chosen["attn_fwd"].startswith("forced: BLOCK_M=32, BLOCK_N=16, num_warps=4")
    assert chosen["attn_bwd_dkdv"].startswith("forced: BLOCK_M=16, BLOCK_N=32")
    assert chosen["rmsnorm_fwd"].startswith("forced: BLOCK_ROWS=4")
    monkeypatch.delenv("V3_ATTN_FWD_CONFIG")  # unforced again: the autotuner chooses anew
    configs.read_environment()
    forward_backward(tk.flash_attention, inputs, grad)
    assert not tk.chosen_configs()["attn_fwd"].startswith("forced")


def test_memory_bound_kernels_launch_by_their_rule_without_an_autotuner():
    """RMSNorm, RoPE and SwiGLU have nothing to time: each launches with its rule's
    configuration, worked out once per shape, and never goes through Triton's autotuner."""
    from version3_triton.kernels import common
    x, w = torch.randn(9, 40, device=DEVICE), torch.randn(40, device=DEVICE)
    forward_backward(tk.rms_norm, [x, w], torch.ones_like(x))
    gate_up = torch.randn(3, 2 * 40, device=DEVICE)
    forward_backward(tk.swiglu, [gate_up], torch.ones(3, 40, device=DEVICE))
    ruled = ("rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd", "swiglu_bwd")
    chosen = tk.chosen_configs()
    assert all(chosen[k].startswith("rule: ") for k in ruled), chosen
    assert not set(ruled) & set(common._TUNERS)
    assert all(configs.SPECS[k].configs is None for k in (*ruled, "rope"))


@pytest.mark.parametrize("kernel, config, message", [
    ("attn_fwd", dict(BLOCK_M=16, BLOCK_N=32), "must be a multiple of BLOCK_N"),
    ("attn_bwd_dkdv", dict(BLOCK_M=32, BLOCK_N=16), "must be a multiple of BLOCK_M"),
    ("rmsnorm_fwd", dict(num_warps=4), "needs BLOCK_ROWS"),
])
def test_impossible_forced_configs_are_refused(monkeypatch, kernel, config, message):
    configs.FORCED_CONFIGS[kernel] = config
    inputs = [t.requires_grad_() for t in attention_inputs(1, 2, 1, 8, 16)[0]]
    with pytest.raises(ValueError, match=message):
        if kernel.startswith("attn"):
            tk.flash_attention(*inputs).sum().backward()
        else:
            tk.rms_norm(inputs[0], torch.ones(16, device=DEVICE))


def test_config_text_from_the_environment(monkeypatch):
    monkeypatch.setenv("V3_ATTN_BWD_DQ_CONFIG", "BLOCK_M=64,BLOCK_N=32,num_warps=8,num_stages=3")
    configs.read_environment()  # once, at import and in V3's preflight: launches never read it
    assert tk.forced_config("attn_bwd_dq") == dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=3)
    monkeypatch.setenv("V3_ATTN_BWD_DQ_CONFIG", "BLOCK_M=big")
    configs.read_environment()
    with pytest.raises(ValueError, match="V3_ATTN_BWD_DQ_CONFIG: bad item"):
        tk.forced_config("attn_bwd_dq")


ATTENTION_KERNELS = list(configs.ATTENTION_CONFIGS)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_amd_configs_fit_in_64_kib_of_lds(kernel):
    """MI200/MI300 give a workgroup 64 KiB of LDS (H100: 227 KiB). Every AMD candidate
    fits at the workshop's head size 64 in bf16, and whatever the prune lets the
    autotuner pick for any head size (16..128) and dtype stays within 64 KiB."""
    target, spec = common.amd_target("gfx942"), configs.SPECS[kernel]
    for config in configs.attention_configs(kernel, target):
        need = spec.shared_bytes(config, 64, 2)
        assert need <= target.shared_bytes, f"{config} needs {need} bytes"
    for width in (16, 32, 64, 96, 128):
        for elem_bytes in (2, 4):
            allowed = configs.candidates(spec, target, width, elem_bytes)
            assert allowed, (width, elem_bytes)
            for config in allowed:
                assert spec.shared_bytes(config, width, elem_bytes) <= target.shared_bytes


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


def triton_next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def family_configs(kernel: str, family: str) -> list[dict]:
    table = configs.ATTENTION_CONFIGS[kernel][family]
    return table if isinstance(table, list) else sum(table.values(), [])


TARGETS = {"sm_90": common.nvidia_target(90), "sm_80": common.nvidia_target(80),
           "sm_86": common.nvidia_target(86), "sm_100": common.nvidia_target(100),
           "gfx90a": common.amd_target("gfx90a"), "gfx942": common.amd_target("gfx942"),
           "gfx950": common.amd_target("gfx950"), "gfx906": common.amd_target("gfx906")}


def test_configs_are_legal_block_shapes_per_family():
    """Every family's lists: whole tiles on the diagonal, AMD-only compiler options in
    the AMD lists only, and on the GPUs of tests/test_codegen.py (and MI50) two
    candidates or more that fit in shared memory for every head size up to 128."""
    families = {"sm_90", "sm_80", "cdna2", "cdna3", "hip", "interpreter"}
    assert {configs.config_family(t) for t in TARGETS.values()} == families - {"interpreter"}
    for kernel, tables in configs.ATTENTION_CONFIGS.items():
        assert set(tables) == families
        for family in families:
            for c in family_configs(kernel, family):
                m, n = c["BLOCK_M"], c["BLOCK_N"]
                assert (n % m if kernel == "attn_bwd_dkdv" else m % n) == 0, (kernel, c)
                amd_only = {"waves_per_eu", "matrix_instr_nonkdim"} & set(c)
                assert not amd_only or family in ("cdna2", "cdna3", "hip"), (kernel, family, c)
        for name in ("sm_90", "sm_80", "gfx90a", "gfx942", "gfx950", "gfx906"):
            target, spec = TARGETS[name], configs.SPECS[kernel]
            for head_dim in (16, 64, 96, 128):
                assert len(configs.candidates(spec, target, head_dim, 2)) >= 2, (name, head_dim)
    mi50 = configs.usable_on(family_configs("attn_fwd", "hip")[0], common.amd_target("gfx906"))
    assert "matrix_instr_nonkdim" not in mi50 and "waves_per_eu" in mi50  # no MFMA on an MI50


def test_head_size_picks_the_list():
    """Head sizes up to 64 use a family's first list, 65..128 the second; without a
    head size, every candidate of the family (what the autotuner is built with)."""
    h100, fwd = TARGETS["sm_90"], configs.ATTENTION_CONFIGS["attn_fwd"]["sm_90"]
    assert configs.attention_configs("attn_fwd", h100, 64) == fwd[64]
    assert configs.attention_configs("attn_fwd", h100, 32) == fwd[64]
    assert configs.attention_configs("attn_fwd", h100, 96) == fwd[128]
    union = configs.attention_configs("attn_fwd", h100)
    assert all(c in union for c in fwd[64] + fwd[128]) and len(union) == len(fwd[64])


# ---- what PyTorch sees: custom ops, FlopCounterMode, torch.compile ----------------
def test_ops_are_registered_and_counted_by_flop_counter():
    """The operators carry SDPA's FLOP formula. torch.compile traces them; eager calls
    of flash_attention use them only inside common.eager_operators() (elsewhere they
    call the launchers directly, without the operators' host cost, unseen by the counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    (q, k, v), grad = attention_inputs(1, 4, 2, 16, 32)
    ops = torch.ops.tinyllama_v3
    forward = 4 * 1 * 4 * 16 * 16 * 32  # PyTorch's SDPA convention: 4*B*H*Tq*Tk*D
    expected = {"tinyllama_v3.attention_forward": forward,
                "tinyllama_v3.attention_backward": 2.5 * forward}

    def counts(run, scope=contextlib.nullcontext()) -> dict:
        with scope, FlopCounterMode(display=False) as counter:
            run()
        return {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()}

    def operators():
        o, lse = ops.attention_forward(q, k, v, 0.25)
        ops.attention_backward(torch.ones_like(o), q, k, v, o, lse, 0.25)

    def autograd():
        forward_backward(tk.flash_attention, [q, k, v], grad)

    assert counts(operators) == expected
    assert counts(autograd, common.eager_operators()) == expected
    assert counts(autograd) == {}  # eager: the launchers, unseen


def test_each_config_is_chosen_once_per_key(monkeypatch):
    """The autotuner remembers its choice per key (sizes, dtypes): a second call with
    the same key prunes nothing and times nothing."""
    (q, k, v), grad = attention_inputs(1, 2, 1, 9, 16)
    x, w = torch.randn(3, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    forward_backward(tk.flash_attention, [q, k, v], grad)  # first call: configs chosen
    forward_backward(tk.rms_norm, [x, w], x)

    def no_choosing(*args, **kwargs):
        raise AssertionError("a launch configuration was chosen again for a known key")

    monkeypatch.setattr(configs, "candidates", no_choosing)
    forward_backward(tk.flash_attention, [q, k, v], grad)
    forward_backward(tk.rms_norm, [x, w], x)


def test_torch_compile_traces_through_the_custom_ops():
    """aot_eager: dynamo + fake tensors + AOT autograd, without generating C++ code."""
    (q, k, v), grad = attention_inputs(1, 2, 1, 17, 16)
    w = torch.randn(16, device=DEVICE)

    def block(q, k, v, w):
        return tk.flash_attention(tk.rms_norm(q, w), k, v)

    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    got = forward_backward(compiled, [q, k, v, w], grad)
    want = forward_backward(block, [q, k, v, w], grad)
    assert_matches(got, want, 1e-6, ["out", "dq", "dk", "dv", "dw"])


# ---- GPU only ------------------------------------------------------------------------
def pytorch_error(fn, inputs, grad, dtype, reference):
    """Error of fn run in `dtype` against the fp64 reference, per output/gradient."""
    return [max_error(a, b) for a, b in zip(forward_backward(fn, inputs, grad, dtype), reference)]


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


@pytest.mark.gpu
def test_gpu_repeated_runs_are_bit_identical():
    """No atomics, no races: the same inputs give the same bits, every time."""
    inputs, grad = attention_inputs(4, 8, 2, 300, 64)
    first = forward_backward(tk.flash_attention, inputs, grad, torch.bfloat16)
    x, w = torch.randn(4096, 1024, device=DEVICE), torch.randn(1024, device=DEVICE)
    norm_grad = torch.randn_like(x)
    norm_first = forward_backward(tk.rms_norm, [x, w], norm_grad, torch.bfloat16)
    for _ in range(3):
        again = forward_backward(tk.flash_attention, inputs, grad, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        norm_again = forward_backward(tk.rms_norm, [x, w], norm_grad, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(norm_first, norm_again))
    y, cos, sin = rope_inputs(4, 300, 24, 64)
    rope_first = forward_backward(lambda t: tk.rope(t, cos, sin), [y], y, torch.bfloat16)
    rope_again = forward_backward(lambda t: tk.rope(t, cos, sin), [y], y, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(rope_first, rope_again))


@pytest.mark.gpu
def test_gpu_inductor_launches_the_kernels_itself():
    """With triton_op, torch.compile (Inductor) traces into the operators: its
    generated code launches our Triton kernels directly (no call back into the
    tinyllama_v3 operators) and computes what eager mode computes."""
    if not common.USE_TRITON_OP:
        pytest.skip(f"torch {torch.__version__} has no torch.library.triton_op")
    from torch._inductor.utils import run_and_get_code

    (q, k, v), grad = attention_inputs(2, 4, 2, 130, 64)
    w = torch.randn(64, device=DEVICE)

    def block(q, k, v, w):
        return tk.flash_attention(tk.rms_norm(q, w, 1e-5, torch.bfloat16), k, v)

    inputs = [t.to(torch.bfloat16) for t in (q, k, v)] + [w]
    want = forward_backward(block, inputs, grad.to(torch.bfloat16))
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    got, codes = run_and_get_code(forward_backward, compiled, inputs, grad.to(torch.bfloat16))
    code = "\n".join(codes)
    for kernel in ("_rmsnorm_fwd_kernel", "_attn_fwd_kernel", "_rmsnorm_bwd_kernel",
                   "_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"):
        assert kernel in code, f"{kernel} is not launched by Inductor's code"
    assert "torch.ops.tinyllama_v3" not in code, "the compiled code calls back into Python"
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow  # the kernel benchmark end to end in the interpreter: make test-slow
def test_bench_kernels_quick_runs_and_reports_host_overhead(tmp_path, capsys):
    """The kernel benchmark's smoke mode (interpreter on a CPU, tiny shapes on a GPU)
    writes every timing column, including the host-overhead ones."""
    from version3_triton import bench_kernels

    out = tmp_path / "k.json"
    assert bench_kernels.main(["--quick", "--output", str(out)]) == 0
    assert "Host overhead per forward+backward call" in capsys.readouterr().out
    result = json.loads(out.read_text())
    for row in result["rmsnorm"] + result["attention"]:
        assert {"fwd_bwd_extra_ms", "fwd_bwd_host_ms", "fwd_bwd_graph_ms",
                "fwd_bwd_graph_error"} <= row.keys()
    assert set(tk.KERNEL_NAMES) - {"rope", "cross_entropy"} <= set(result["kernel_configs"])  # not benched
