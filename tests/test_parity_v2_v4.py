"""V2 (fused) and V4 (SDPA) are the same model as V1: same logits, same gradients.

With V1's weights loaded through plain load_state_dict, the logits and the
gradient of every V1 parameter (fused gradients split back into V1's names)
must match V1 in fp32 to ~1e-5 of the tensor's scale, on odd shapes too.
"""
import importlib
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, load_version, run_cli
from harness import ModelConfig
from training.cli import build_parser
from harness.config import VERSIONS

TOL = 1e-5  # fp32: only summation order differs between the versions

# batch, seq, heads, kv_heads, head_dim, tied: together every seq (1, 7, 123), batch (1, 3),
# GQA ratio (1, 2, 4), head_dim (32, 64, 128) and tied/untied embeddings.
SHAPES = [
    pytest.param(1, 1, 4, 4, 32, False, id="b1-t1-mha-d32"),
    pytest.param(3, 7, 4, 2, 64, True, id="b3-t7-gqa2-d64-tied"),
    pytest.param(1, 123, 4, 1, 128, False, id="b1-t123-gqa4-d128"),
    pytest.param(3, 123, 2, 1, 32, True, id="b3-t123-gqa2-d32-tied"),
    pytest.param(3, 7, 8, 2, 32, False, id="b3-t7-gqa4-d32"),
]
VOCAB = 97  # odd on purpose


def compare_versions():
    return importlib.import_module("benchmarks.compare_versions")


def config(heads, kv_heads, head_dim, tied) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, hidden_dim=heads * head_dim, num_layers=2,
                       num_heads=heads, num_kv_heads=kv_heads, max_seq_len=128,
                       tie_embeddings=tied)


def logits_and_grads(model, ids, targets):
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_close_to_scale(actual, expected, what, scale=None):
    """max |actual - expected| <= TOL * (largest |expected|, or `scale` where that is 0)."""
    ref = expected.abs().max().item() or scale
    err = (actual - expected).abs().max().item()
    assert err <= TOL * ref, f"{what}: max error {err:.3g} vs scale {ref:.3g}"


def check_matches_v1(version, cfg, batch, seq, **options):
    v1 = load_version("v1")
    torch.manual_seed(0)
    reference = v1.build_model(cfg)
    model = load_version(version).build_model(cfg, **options)
    model.load_state_dict(reference.state_dict())  # plain load: the pre-hook stacks q/k/v, gate/up
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())

    ids = torch.randint(0, VOCAB, (batch, seq))
    targets = torch.randint(0, VOCAB, (batch, seq))
    ref_logits, ref_grads = logits_and_grads(reference, ids, targets)
    logits, grads = logits_and_grads(model, ids, targets)
    grads = model.to_v1_layout(grads)

    assert_close_to_scale(logits, ref_logits, "logits")
    assert grads.keys() == ref_grads.keys()
    # With seq 1, q/k get exactly zero gradient in V1 (softmax over one key); those
    # are compared against the model's overall gradient scale instead.
    overall = max(g.abs().max().item() for g in ref_grads.values())
    for name, ref in ref_grads.items():
        assert_close_to_scale(grads[name], ref, f"grad of {name}", overall)


@pytest.mark.parametrize("batch, seq, heads, kv_heads, head_dim, tied", SHAPES)
@pytest.mark.parametrize("version", ["v2", "v4"])
def test_logits_and_every_gradient_match_v1(version, batch, seq, heads, kv_heads, head_dim, tied):
    check_matches_v1(version, config(heads, kv_heads, head_dim, tied), batch, seq)


@pytest.mark.parametrize("version, options", [
    ("v2", {"fused_qkv": False}), ("v2", {"fused_gate_up": False}),
    ("v2", {"fused_rmsnorm": False}), ("v2", {"fused_swiglu": False}),
    ("v4", {"fused_qkv": False, "fused_gate_up": False, "fused_rmsnorm": False,
            "fused_swiglu": False}),
    ("v4", {"sdpa_backend": "math"}), ("v4", {"sdpa_backend": "flash"}),
    ("v4", {"gqa": "repeat"}),
], ids=lambda o: o if isinstance(o, str) else ",".join(f"{k}={v}" for k, v in o.items()))
def test_every_switch_keeps_the_maths(version, options):
    check_matches_v1(version, config(4, 2, 32, False), 3, 19, **options)


@pytest.mark.parametrize("version", ["v2", "v4"])
def test_checkpoints_round_trip_between_layouts(version):
    """V1 -> Vn -> V1 layout gives back V1's state_dict exactly; Vn reloads its own."""
    cfg = config(4, 2, 32, True)
    reference = load_version("v1").build_model(cfg)
    model = load_version(version).build_model(cfg)
    model.load_state_dict(reference.state_dict())
    back = model.to_v1_layout(model.state_dict())
    assert back.keys() == reference.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in reference.state_dict().items())
    load_version(version).build_model(cfg).load_state_dict(model.state_dict())


def test_fusion_switches_reach_the_results_options():
    v2 = load_version("v2")
    parser = build_parser("v2", "", v2.SPEC.add_arguments)
    args = parser.parse_args(["--no-fused-qkv", "--no-fused-swiglu"])
    assert v2.SPEC.options(args) == {"fused_qkv": False, "fused_gate_up": True,
                                       "fused_rmsnorm": True, "fused_swiglu": False}


@pytest.mark.slow  # ~18 s of training: make test-slow (the logits and gradients are checked here)
def test_loss_curves_agree_and_gradient_guard_passes(tmp_path):
    """Same seed, same text: V1, V2 and V4 train the same model to the same losses."""
    for version in ("v2", "v4"):
        load_version(version)
    scripts = {v: VERSIONS[v].script for v in ("v1", "v2", "v4")}
    runs = {}
    for version, script in scripts.items():
        out = tmp_path / f"{version}.json"
        proc = run_cli([REPO / script, "--preset", "tiny", "--device", "cpu", "--data", "text",
                        "--num-steps", "20", "--warmup-steps", "2", "--learning-rate", "3e-3",
                        "--quiet", "--output", out])
        assert proc.returncode == 0, proc.stderr
        runs[version] = json.loads(out.read_text())
    for version, r in runs.items():
        assert r["gradient_guard"]["passed"] and r["gradient_guard"]["checked_params"] > 0, version
    v1_losses = torch.tensor(runs["v1"]["losses"])
    assert v1_losses[-1] < v1_losses[0] - 0.5  # it learns
    for version in ("v2", "v4"):
        diff = (torch.tensor(runs[version]["losses"]) - v1_losses).abs().max().item()
        assert diff < 1e-4, f"{version} loss curve differs from V1's by {diff:.2e}"
    assert runs["v2"]["options"] == {"fused_qkv": True, "fused_gate_up": True,
                                     "fused_rmsnorm": True, "fused_swiglu": True}
    assert runs["v4"]["options"]["sdpa_backend"] == "auto"
    assert runs["v4"]["options"]["sdpa_kernel"] in ("flash (cpu)", "math")
    assert runs["v4"]["options"]["gqa"] in ("native", "repeat")  # tiny has 4 heads, 2 kv heads


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_unavailable_sdpa_backend_is_one_line_exit_2(tmp_path, capsys, backend):
    v4 = load_version("v4")
    if torch.cuda.is_available():
        pytest.skip("on a GPU these backends may exist")
    out = tmp_path / "r.json"
    code = v4.main(["--preset", "tiny", "--device", "cpu", "--num-steps", "3", "--warmup-steps", "1",
                    "--sdpa-backend", backend, "--output", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert f"--sdpa-backend {backend} cannot run" in lines[0] and not out.exists()


@pytest.mark.slow  # ~15 s: make test-slow
def test_failing_compile_is_one_line_exit_2(tmp_path):
    """No working compiler: a clear line suggesting to run without --compile."""
    load_version("v4")
    if torch.cuda.is_available():
        pytest.skip("on a GPU torch.compile generates Triton kernels, not C++")
    proc = run_cli([REPO / "version4_sdpa/tiny_llama_v4.py", "--preset", "tiny", "--device", "cpu",
                    "--num-steps", "2", "--warmup-steps", "1", "--compile", "--quiet",
                    "--output", tmp_path / "r.json"], env={"CXX": "/nonexistent/c++"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "run without --compile" in lines[0] and not (tmp_path / "r.json").exists()


@pytest.mark.slow  # four runs in subprocesses: make test-slow (reproduce --quick also runs it)
def test_compare_versions_runs_on_cpu(tmp_path, capsys):
    """The benchmark script end to end on the tiny preset (eager only: seconds). Memory held
    before a run (here by the comparing process) is not counted in its peak, and the same
    pair measured twice reports the same peak within 5% (on a CPU the peak is the process's
    resident set, libraries and allocator caches included, which move by a few MB)."""
    leftover = torch.ones(200 * 2**20)  # 800 MB held by this process, as an earlier run's would be
    out = tmp_path / "compare.json"
    code = compare_versions().main(["--preset", "tiny", "--device", "cpu", "--versions", "v1,v4",
                                    "--modes", "eager", "--repeats", "2", "--num-steps", "4",
                                    "--warmup-steps", "1", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    for version in ("v1", "v4"):
        peaks = [r["peak_memory_mb"] for r in report["runs"] if r["version"] == version]
        assert len(peaks) == 2 and max(peaks) <= 1.05 * min(peaks), (version, peaks)
        assert max(peaks) < leftover.numel() * 4 / 2**20, (version, peaks)
    del leftover
    assert [(r["version"], r["mode"]) for r in report["summary"]] == [("v1", "eager"), ("v4", "eager")]
    assert len(report["runs"]) == 4 and all(r["exit_code"] == 0 for r in report["runs"])
    assert report["summary"][0]["x_v1_eager"] == pytest.approx(1.0)
    assert report["ceiling"]["matmul_tflops"] > 0
    stdout = capsys.readouterr().out
    assert "x V1" in stdout and "sdpa=" in stdout
    assert compare_versions().main(["--report", str(out)]) == 0  # the saved table, again
    assert capsys.readouterr().out.count("x V1") == 1


def test_compare_versions_rejects_unknown_names(capsys):
    assert compare_versions().main(["--versions", "v9"]) == 2
    assert "--versions: unknown v9 (choose from v1, v2, v3, v4, hf)" in capsys.readouterr().err


# ---- on a GPU ------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_cuda_graphs_train_without_skips(tmp_path):
    """--compile-mode reduce-overhead really replays CUDA/HIP graphs in the training loop."""
    load_version("v4")
    out = tmp_path / "r.json"
    proc = run_cli([REPO / "version4_sdpa/tiny_llama_v4.py", "--preset", "small", "--num-layers", "2",
                    "--precision", "bf16", "--compile", "--compile-mode", "reduce-overhead",
                    "--num-steps", "8", "--warmup-steps", "3", "--quiet", "--output", out],
                   env={"TORCH_LOGS": "perf_hints"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipping cudagraphs" not in proc.stderr, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["gradient_guard"]["passed"] and result["run"]["compile_mode"] == "reduce-overhead"


@pytest.mark.gpu
def test_gpu_probe_names_the_kernel_compiled_training_runs():
    """The SDPA kernel recorded in options is the one the profiler sees under torch.compile."""
    from harness import PRESETS

    v4 = load_version("v4")
    preset, device = PRESETS["small"], torch.device("cuda")
    cfg = preset.model.replace(num_layers=2)
    kernel, gqa = v4.choose_sdpa(v4.build_model, cfg, preset.batch_size, preset.seq_len, device,
                                  "bf16", "auto")
    model = torch.compile(v4.build_model(cfg, gqa=gqa).to(device))
    ids = torch.randint(0, cfg.vocab_size, (preset.batch_size, preset.seq_len), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
        logits.float().sum().backward()

    step()  # compile outside the profiled step
    with torch.profiler.profile() as prof:
        step()
        torch.cuda.synchronize()
    kernel_ops = importlib.import_module("version4_sdpa.sdpa_probe").KERNEL_OPS
    seen = {family for op, family in kernel_ops.items()
            if any(e.name == f"aten::{op}" for e in prof.events())}
    assert seen == {kernel.split(" (")[0]}, (kernel, seen)


# ---- the gradient guard sees V1's layout ------------------------------------------------
@pytest.mark.parametrize("version", ["v1", "v2", "v4"])
def test_gradient_guard_catches_a_zero_k_slice(version):
    """A zero gradient for the whole k projection fails in every layout, fused or not."""
    from harness import measure
    from harness.errors import GradientFlowError

    cfg = config(4, 2, 32, False)
    model = load_version(version).build_model(cfg)
    model.load_state_dict(load_version("v1").build_model(cfg).state_dict())
    logits_and_grads(model, torch.randint(0, VOCAB, (2, 9)), torch.randint(0, VOCAB, (2, 9)))
    assert measure.check_gradient_flow(model) > 0  # healthy first
    k_rows = slice(cfg.num_heads * cfg.head_dim, (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim)
    for name, p in model.named_parameters():
        if name == "layers.0.attn.k_proj.weight":
            p.grad.zero_()
        elif name == "layers.0.attn.qkv_proj.weight":  # V2-V4: rows q | k | v of one weight
            p.grad[k_rows] = 0
    with pytest.raises(GradientFlowError, match=r"layers\.0\.attn\.k_proj\.weight"):
        measure.check_gradient_flow(model)


def test_results_record_a_skipped_guard_as_not_passed(tmp_path, monkeypatch):
    """A guard that checked nothing must not be written as passed."""
    from harness import measure

    v1, out = load_version("v1"), tmp_path / "r.json"
    monkeypatch.setattr(measure, "check_gradient_flow", lambda model: 0)
    assert v1.main(["--preset", "tiny", "--device", "cpu", "--num-steps", "2", "--warmup-steps", "1",
                    "--quiet", "--output", str(out)]) == 0
    guard = json.loads(out.read_text())["gradient_guard"]
    assert guard["passed"] is None and guard["checked_params"] == 0


# ---- one optimizer default ----------------------------------------------------------------
def test_every_version_has_the_same_default_optimizer(monkeypatch):
    from training import cli

    defaults, build = {}, cli.build_parser

    def recording(version, description, add_arguments=None, default_optimizer="default"):
        parser = build(version, description, add_arguments, default_optimizer)
        defaults[version] = parser.parse_args([]).optimizer
        return parser

    monkeypatch.setattr(cli, "build_parser", recording)
    for version in VERSIONS:
        with pytest.raises(SystemExit):
            load_version(version).main(["--help"])
    assert set(defaults) == set(VERSIONS) and len(set(defaults.values())) == 1, defaults


# ---- a backend that cannot run the model is refused ---------------------------------------
def test_efficient_backend_with_grouped_kv_heads_is_one_line_exit_2(tmp_path, capsys):
    v4, out = load_version("v4"), tmp_path / "r.json"
    code = v4.main(["--preset", "tiny", "--num-heads", "4", "--num-kv-heads", "2", "--num-steps", "3",
                    "--warmup-steps", "1", "--sdpa-backend", "efficient", "--output", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "cannot run grouped kv heads" in lines[0] and "--sdpa-backend auto" in lines[0]
    assert not out.exists()
