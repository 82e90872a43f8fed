"""The launch configurations (kernels/configs.py): forced configurations (the exercise knob,
from Python and from the environment), the rule of the memory-bound kernels, refused
configurations, one choice per key. Attention's tables: test_attention_tables.py."""
import pytest
import torch

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import common, configs  # noqa: E402
from version3_triton.kernels.swiglu import swiglu_reference  # noqa: E402
from kernel_checks import (  # noqa: E402
    DEVICE, KERNELS, SMALL_BLOCKS, TOLERANCE, assert_matches, attention_inputs,
    attention_reference, forward_backward, rms_norm_reference, rope_inputs, rope_reference)

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


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
    assert not set(ruled) & {kernel for kernel, _ in common._TUNERS}
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
