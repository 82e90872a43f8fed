"""Version 3 (V2 + Triton RMSNorm and flash attention) is the same model as V1.

V1's state_dict loads through plain load_state_dict; logits and the gradient of
every V1 parameter match V1: to ~1e-5 of each tensor's scale in fp32 (on a CPU
the kernels run in Triton's interpreter), and in bf16 autocast on a GPU within
2x of V1's own bf16 error. Through the command line, the gradient guard passes
and the loss curve on real text follows V1's.
"""
import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_GPU, REPO, load_version, run_cli
from harness import ModelConfig
from harness.config import PRESETS
from version3_triton.spec import LARGE_VOCABULARY

pytest.importorskip("triton", reason="version 3 needs triton")
DEVICE = "cuda" if HAS_GPU else "cpu"
VOCAB = 97  # odd on purpose
SCRIPTS = {"v1": REPO / "version1_baseline/tiny_llama_v1.py",
           "v3": REPO / "version3_triton/tiny_llama_v3.py"}


@pytest.fixture(autouse=True)
def no_autotuning(monkeypatch):
    """One launch config per kernel: autotuning each test shape on a GPU costs minutes."""
    load_version("v3")
    from version3_triton.kernels import configs
    monkeypatch.setattr(configs, "AUTOTUNE", False)


def config(heads=4, kv_heads=2, head_dim=16, tied=False) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, hidden_dim=heads * head_dim, num_layers=2, num_heads=heads,
                       num_kv_heads=kv_heads, max_seq_len=128, tie_embeddings=tied)


def logits_and_grads(model, ids, targets, autocast_dtype=None):
    """Logits and {V1 parameter name: gradient} after one cross-entropy backward."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=autocast_dtype or torch.float32,
                        enabled=autocast_dtype is not None):
        logits = model(ids)
    F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1)).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    to_v1 = getattr(model, "to_v1_layout", None)
    return logits.detach().float(), to_v1(grads) if to_v1 else grads


def v1_and_v3(cfg, **options):
    """V1 with fresh weights and V3 loaded from them by plain load_state_dict."""
    torch.manual_seed(0)
    reference = load_version("v1").build_model(cfg).to(DEVICE)
    model = load_version("v3").build_model(cfg, **options).to(DEVICE)
    model.load_state_dict(reference.state_dict())
    return reference, model


def errors(a: dict, b: dict) -> dict:
    return {name: (a[name] - b[name]).abs().max().item() for name in b}


def scales(tensors: dict) -> dict:
    """Each tensor's largest |value|; tensors that are ~0 (q/k grads at seq 1) use the overall one."""
    overall = max(t.abs().max().item() for t in tensors.values())
    return {n: max(t.abs().max().item(), 1e-3 * overall) for n, t in tensors.items()}


def results(reference, model, batch, seq, autocast_dtype=None):
    g = torch.Generator().manual_seed(1)
    ids, targets = (torch.randint(0, VOCAB, (batch, seq), generator=g).to(DEVICE) for _ in "it")
    ref_logits, ref_grads = logits_and_grads(reference, ids, targets)
    logits, grads = logits_and_grads(model, ids, targets, autocast_dtype)
    assert grads.keys() == ref_grads.keys()
    return {"logits": ref_logits, **ref_grads}, {"logits": logits, **grads}


@pytest.mark.parametrize("batch, seq, heads, kv_heads, head_dim, tied", [
    pytest.param(1, 1, 4, 4, 32, False, id="b1-t1-mha-d32"),
    pytest.param(3, 19, 4, 2, 16, True, id="b3-t19-gqa2-d16-tied"),
    pytest.param(2, 67, 4, 1, 32, False, id="b2-t67-gqa4-d32", marks=pytest.mark.slow),
])
def test_fp32_logits_and_every_gradient_match_v1(batch, seq, heads, kv_heads, head_dim, tied):
    reference, model = v1_and_v3(config(heads, kv_heads, head_dim, tied))
    want, got = results(reference, model, batch, seq)
    scale = scales(want)
    for name, err in errors(got, want).items():
        assert err <= 1e-5 * scale[name], f"{name}: max error {err:.3g} vs scale {scale[name]:.3g}"


def _switches(options: dict, slow: bool = False):
    return pytest.param(options, id=",".join(f"{k}={v}" for k, v in options.items()),
                        marks=[pytest.mark.slow] if slow else [])


# make test: one switch of each kind (a kernel, two kernels together, V2's fusions); the
# others in make test-slow
@pytest.mark.parametrize("options", [
    _switches({"triton_attention": False}), _switches({"triton_rmsnorm": False}),
    _switches({"triton_rope": False}, slow=True), _switches({"rope_in_attention": True}, slow=True),
    _switches({"fused_residual_norm": False}, slow=True),
    _switches({"fused_qkv_grad": False}, slow=True), _switches({"triton_swiglu": False}, slow=True),
    _switches({"recompute_swiglu": True}), _switches({"recompute_rope": True}, slow=True),
    _switches({"recompute_norm": True}, slow=True),
    _switches({"recompute_norm": True, "recompute_rope": True, "recompute_swiglu": True,
               "fused_linear_ce": True}, slow=True),
    _switches({"triton_attention": False, "triton_rmsnorm": False}),
    _switches({"fused_qkv": False, "fused_gate_up": False})])
def test_every_switch_keeps_the_maths(options):
    reference, model = v1_and_v3(config(), **options)
    want, got = results(reference, model, 2, 21)
    scale = scales(want)
    assert all(err <= 1e-5 * scale[n] for n, err in errors(got, want).items())


@pytest.mark.slow
def test_fused_linear_ce_gives_the_loss_and_gradients_of_the_logits_path():
    """--fused-linear-ce: forward(ids, targets) returns the mean loss the harness computes from
    the logits, and every parameter gets the same gradient - lm_head's too, tied to the
    embedding here, so both of its gradients add up in one tensor."""
    reference, model = v1_and_v3(config(tied=True), fused_linear_ce=True)
    assert model.loss_in_forward
    g = torch.Generator().manual_seed(1)
    ids, targets = (torch.randint(0, VOCAB, (2, 13), generator=g).to(DEVICE) for _ in "it")
    logits, want = logits_and_grads(reference, ids, targets)
    model.zero_grad(set_to_none=True)
    loss = model(ids, targets)
    loss.backward()
    got = model.to_v1_layout({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)),
                               rtol=1e-5, atol=1e-6)
    scale = scales(want)
    assert all(err <= 1e-5 * scale[n] for n, err in errors(got, want).items())
    torch.testing.assert_close(model(ids), logits, rtol=1e-5, atol=1e-5)  # no targets: logits


@pytest.mark.slow
def test_flop_counter_sees_the_attention_kernels_inside_flop_counting():
    """Eager V3 calls its kernels' launchers directly, which FlopCounterMode cannot see;
    inside `model.flop_counting()` (what `--profile flopcounter` enters) the same calls
    go through the operators and the counter sees every FLOP of the analytic model."""
    from torch.utils.flop_counter import FlopCounterMode
    from harness import flops

    cfg = config()
    model = load_version("v3").build_model(cfg).to(DEVICE)
    batch, seq = 1, 12
    ids = torch.randint(0, VOCAB, (batch, seq), device=DEVICE)

    def count(scope) -> FlopCounterMode:
        with scope, FlopCounterMode(display=False) as counter:
            logits_and_grads(model, ids, ids)
        return counter

    counted = count(model.flop_counting())
    per_layer = 4 * batch * cfg.num_heads * seq * seq * cfg.head_dim  # SDPA's convention
    attention = {str(op): n for op, n in counted.get_flop_counts()["Global"].items()
                 if "attention" in str(op)}
    # The backward is qkv_attention's: it writes the QKV gradient whole.
    assert attention == {"tinyllama_v3.attention_forward": cfg.num_layers * per_layer,
                         "tinyllama_v3.qkv_attention_backward": int(2.5 * cfg.num_layers
                                                                    * per_layer)}
    # The analytic model counts attention's backward as 2 forwards, SDPA's formula as
    # 2.5 (it recomputes P): the half forward is the only difference.
    recompute = cfg.num_layers * per_layer // 2
    assert counted.get_total_flops() == flops.step_flops(cfg, batch, seq) + recompute
    plain = count(contextlib.nullcontext())  # ordinary eager runs: launchers, no operators
    assert plain.get_total_flops() == counted.get_total_flops() - sum(attention.values())


def test_without_triton_every_kernel_switched_off_builds_v2s_model(monkeypatch):
    """No Triton installed: V3 with every kernel off is V2's maths and still builds."""
    v3 = load_version("v3")
    monkeypatch.setattr(v3, "kernels", None)
    off = dict(triton_rmsnorm=False, triton_attention=False, triton_rope=False,
               rope_in_attention=False, fused_residual_norm=False, fused_qkv_grad=False,
               triton_swiglu=False, fused_linear_ce=False)
    model = v3.build_model(config(tied=True), **off)
    assert not any(isinstance(m, v3.TritonRMSNorm) for m in model.modules())


def test_v1_checkpoint_round_trips_and_norms_are_triton():
    v3 = load_version("v3")
    reference, model = v1_and_v3(config(tied=True))
    back = model.to_v1_layout(model.state_dict())
    assert back.keys() == reference.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in reference.state_dict().items())
    norms = [m for m in model.modules() if isinstance(m, v3.TritonRMSNorm)]
    assert len(norms) == 2 * model.config.num_layers + 1
    assert all(isinstance(block.attn, v3.TritonAttention) for block in model.layers)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_autocast_error_within_2x_of_v1s_own(dtype):
    """Against V1 in fp32: V3 in autocast is at most ~2x as far off as V1 in autocast."""
    cfg = config(heads=8, kv_heads=2, head_dim=64)
    reference, model = v1_and_v3(cfg)
    exact, ours = results(reference, model, 4, 100, dtype)
    _, theirs = results(reference, reference, 4, 100, dtype)
    assert_within_2x(exact, ours, theirs, "V3", "V1")


def train_bf16(tmp_path, mode, *flags) -> dict:
    out = tmp_path / f"run{len(flags)}.json"
    proc = run_cli([SCRIPTS["v3"], "--preset", "tiny", "--precision", "bf16", "--num-steps", "6",
                    "--warmup-steps", "2", "--quiet", "--output", out, *mode, *flags])
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """train_bf16 without switches, once per mode for the whole module: each switch's
    test compares against it (a compiled run costs tens of seconds of GPU time)."""
    runs = {}

    def run(mode) -> dict:
        if tuple(mode) not in runs:
            runs[tuple(mode)] = train_bf16(tmp_path_factory.mktemp("default"), mode)
        return runs[tuple(mode)]
    return run


GPU_MODES = pytest.mark.parametrize(
    "mode", [[], ["--compile", "--compile-mode", "reduce-overhead"],
             ["--compile", "--compile-mode", "reduce-overhead", "--optimizer", "master"]],
    ids=["eager", "graphs", "graphs-master"])


@pytest.mark.gpu
@GPU_MODES
def test_gpu_fused_linear_ce_trains_like_the_logits_path(tmp_path, default_run, mode):
    """bf16, eager and compiled with graphs (the loss runs outside the compiled graph): the
    same losses as the default run within bf16's rounding, and every gradient flows."""
    plain, fused = default_run(mode), train_bf16(tmp_path, mode, "--fused-linear-ce")
    assert fused["options"]["fused_linear_ce"] and fused["gradient_guard"]["passed"]
    assert fused["losses"] == pytest.approx(plain["losses"], rel=2e-2)


@pytest.mark.gpu
@GPU_MODES
@pytest.mark.parametrize("switch", ["recompute_norm", "recompute_rope", "recompute_swiglu"])
def test_gpu_a_recomputation_trains_like_the_default(tmp_path, default_run, mode, switch):
    """The same losses (within bf16's rounding: compiled code may fuse differently), every
    gradient flowing, in eager mode and with graphs (with and without master weights)."""
    plain = default_run(mode)
    recomputed = train_bf16(tmp_path, mode, "--" + switch.replace("_", "-"))
    assert recomputed["options"][switch] and recomputed["gradient_guard"]["passed"]
    assert recomputed["losses"] == pytest.approx(plain["losses"], rel=2e-2)


def assert_within_2x(exact: dict, ours: dict, theirs: dict, we: str, they: str) -> None:
    """Every tensor of `ours` is at most ~2x as far from `exact` as `theirs` is."""
    scale = scales(exact)
    ours, theirs = errors(ours, exact), errors(theirs, exact)
    for name in exact:
        assert ours[name] <= 2 * theirs[name] + 1e-3 * scale[name], \
            f"{name}: {we} {ours[name]:.3g} vs {they} {theirs[name]:.3g} (scale {scale[name]:.3g})"


# ---- through the command line ----------------------------------------------------
def train(tmp_path, version, *extra, env=None):
    out = tmp_path / f"{version}.json"
    proc = run_cli([SCRIPTS[version], "--preset", "tiny", "--num-layers", "1", "--device", DEVICE,
                    "--precision", "fp32", "--data", "text", "--batch-size", "2", "--num-steps", "8",
                    "--warmup-steps", "2", "--learning-rate", "3e-3", "--quiet", "--output", out,
                    *extra],
                   env={"V3_AUTOTUNE": "0", **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.slow  # ~30 s of training in the interpreter: make test-slow (the parity tests check V3's logits and gradients here)
def test_loss_curve_follows_v1_and_gradient_guard_passes(tmp_path):
    """Same seed, same text: V3 trains V1's model to V1's losses. A forced launch
    configuration (the exercise knob) is used and recorded in the results."""
    load_version("v3")
    v1 = train(tmp_path, "v1")
    v3 = train(tmp_path, "v3", env={"V3_ATTN_FWD_CONFIG": "BLOCK_M=32,BLOCK_N=16"})
    assert v3["gradient_guard"]["passed"] and v3["gradient_guard"]["checked_params"] > 0
    v1_losses = torch.tensor(v1["losses"])
    assert v1_losses[-1] < v1_losses[0] - 0.3  # it learns
    diff = (torch.tensor(v3["losses"]) - v1_losses).abs().max().item()
    assert diff < 2e-3, f"V3's loss curve differs from V1's by {diff:.2e}"
    assert all(v3["options"][k] for k in ("triton_rmsnorm", "triton_attention", "triton_rope",
                                          "fused_residual_norm"))
    forced = v3["options"]["kernel_configs"]
    assert list(forced) == ["attn_fwd"] and forced["attn_fwd"]["BLOCK_M"] == 32
    assert forced["attn_fwd"]["BLOCK_N"] == 16 and "num_warps" in forced["attn_fwd"]


@pytest.mark.slow  # torch.compile builds C++ on a CPU (~20 s): make test-slow
def test_fused_linear_ce_under_compile_runs_the_loss_outside_the_graph(tmp_path):
    """--fused-linear-ce --compile: the compiled model hands the final norm's output to the
    chunked loss, which runs eagerly outside the graph; the losses are the eager default
    run's and every gradient flows."""
    plain = train(tmp_path, "v3")
    fused = train(tmp_path, "v3", "--fused-linear-ce", "--compile")
    assert fused["options"]["fused_linear_ce"] and fused["gradient_guard"]["passed"]
    assert fused["losses"] == pytest.approx(plain["losses"], rel=1e-4)


@pytest.mark.parametrize("args, env, message", [
    (["--device", "cpu", "--precision", "bf16"], {}, "cannot run bf16 attention"),
    ([], {"V3_ATTN_BWD_DQ_CONFIG": "BLOCK_M=huge"}, "V3_ATTN_BWD_DQ_CONFIG: bad item"),
    ([], {"V3_ATTN_FWD_CONFIG": "BLOCK_M=16,BLOCK_N=32"}, "must be a multiple of BLOCK_N"),
    (["--rope-in-attention", "--recompute-rope"], {}, "nothing to recompute"),
], ids=["bf16-on-cpu", "unparsable-config", "impossible-config", "recompute-rope-in-attention"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, env, message):
    v3 = load_version("v3")
    if HAS_GPU and "cpu" in args:
        pytest.skip("on a GPU machine --device cpu has no interpreter: another message")
    from version3_triton.kernels import configs
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # the preflight copies the variables into the process's pins: this test's stay with it
    monkeypatch.setattr(configs, "FORCED_CONFIGS", configs.ForcedConfigs())
    out = tmp_path / "r.json"
    code = v3.main(["--preset", "tiny", "--num-steps", "2", "--warmup-steps", "1",
                    "--output", str(out), *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize("flags, settled", [
    ([], {}),
    (["--no-fused-gate-up"], {"fused_gate_up": False, "triton_swiglu": False}),
    (["--no-fused-qkv"], {"fused_qkv": False, "triton_rope": False, "fused_qkv_grad": False}),
    (["--no-triton-rmsnorm"], {"triton_rmsnorm": False, "fused_residual_norm": False}),
    (["--no-triton-attention"], {"triton_attention": False, "fused_qkv_grad": False}),
    (["--no-triton-attention", "--rope-in-attention"], {"triton_attention": False,
                                                        "fused_qkv_grad": False}),
    (["--rope-in-attention"], {"rope_in_attention": True}),
    (["--recompute-swiglu", "--no-triton-swiglu"], {"triton_swiglu": False}),
    (["--recompute-rope", "--no-fused-qkv-grad"], {"fused_qkv_grad": False}),
    (["--recompute-norm", "--no-triton-rope"], {"triton_rope": False, "fused_qkv_grad": False}),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_switches_are_settled_in_one_place_and_recorded_as_run(flags, settled):
    """What the results record is what the model runs: a switch that cannot take effect
    (the SwiGLU kernel without the one gate/up GEMM, ...) is recorded off."""
    from training import cli
    v3 = load_version("v3")
    args = cli.build_parser("v3", "", v3.SPEC.add_arguments).parse_args(flags)
    defaults = {**dict.fromkeys(("fused_qkv", "fused_gate_up", "fused_rmsnorm", "fused_swiglu",
                                 "triton_rmsnorm", "triton_attention", "triton_rope",
                                 "fused_residual_norm", "fused_qkv_grad", "triton_swiglu"), True),
                "rope_in_attention": False, "recompute_rope": False, "recompute_swiglu": False,
                "recompute_norm": False, "fused_linear_ce": False}
    assert v3.SPEC.options(args, PRESETS["medium"].model) == {**defaults, **settled}


@pytest.mark.parametrize("preset, flags, on", [
    ("medium", [], False), ("large", [], True),  # 1,000 words: nothing to save; 32k: it pays
    ("medium", ["--fused-linear-ce"], True), ("large", ["--no-fused-linear-ce"], False),
    ("large", ["--no-fused-residual-norm"], False),  # its needs still settle it off
])
def test_the_fused_loss_is_on_by_default_where_the_vocabulary_is_large(preset, flags, on):
    """--fused-linear-ce's default is a function of the model: on from LARGE_VOCABULARY
    words, which the help says; a flag given either way wins; without a model to ask,
    settling refuses rather than guess."""
    from training import cli
    v3 = load_version("v3")
    parser = cli.build_parser("v3", "", v3.SPEC.add_arguments)
    assert v3.SPEC.options(parser.parse_args(flags), PRESETS[preset].model)["fused_linear_ce"] is on
    assert f"{LARGE_VOCABULARY:,} words" in " ".join(parser.format_help().split())
    with pytest.raises(TypeError, match="depends on the model"):
        v3.SPEC.settle({})


@pytest.mark.parametrize("vocab, on", [(LARGE_VOCABULARY, True), (LARGE_VOCABULARY - 1, False)])
def test_the_command_line_settles_the_fused_loss_for_the_model_it_builds(monkeypatch, tmp_path, vocab, on):
    """V3's command line asks the model it will build (preset and overrides) for the fused
    loss's default, and hands the settled switches to the run (not started here)."""
    from training import trainer
    seen = {}
    monkeypatch.setattr(trainer, "run", lambda settings, *a: seen.update(settings.options))
    argv = ["--preset", "tiny", "--vocab-size", str(vocab), "--device", "cpu", "--precision", "fp32",
            "--output", str(tmp_path / "r.json")]
    assert load_version("v3").main(argv) == 0 and seen["fused_linear_ce"] is on
