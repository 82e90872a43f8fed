"""On a GPU: every version, as it trains there, is the same model as V1.

The CPU tests compare the versions with V1 in fp32. What trains on a GPU is
different code: bf16 autocast, V2's GPU-only SiLU*mul kernel, V3's Triton
kernels, V4's cuDNN / flash / efficient attention, torch.compile and CUDA
graphs. Here each version, loaded with V1's weights, runs one forward and
backward at an odd shape (grouped kv heads, a sequence length that is no
multiple of any tile): eager, and compiled once with CUDA graphs - its first
step runs Inductor's code, its third replays the recorded graphs, and both are
checked. V4 runs eager on every SDPA backend that can run the shape; compiled,
the graph is the same but for the attention call, so it compiles on 'auto' and
on one forced backend. Logits and every parameter's gradient (in V1's layout)
must be within 3x of V1's own bf16 error, both measured against V1 in fp32.

Also here: the GPU side of the measurement tests (test_measurement.py).
Run every GPU test with `pytest -m gpu tests/` (they skip without a GPU).
"""
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import load_version
from harness import ModelConfig

pytestmark = pytest.mark.gpu

CFG = ModelConfig(vocab_size=257, hidden_dim=512, num_layers=2, num_heads=8, num_kv_heads=2,
                  max_seq_len=128)  # head_dim 64, 4 query heads per kv head
BATCH, SEQ = 2, 77  # 77: no multiple of 16, 32, 64 or 128
TIMES_V1_ERROR = 3.0
FLOOR = 1e-5  # relative error that counts as exact, where V1's own error is ~0
BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")


def relative_error(actual, expected) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30)).item()


def forward_backward(model, step, ids, targets, bf16: bool) -> dict:
    """Logits and every gradient (in V1's layout) of one step; `step` is the model or its compiled form."""
    model.zero_grad(set_to_none=True)
    if hasattr(torch.compiler, "cudagraph_mark_step_begin"):
        torch.compiler.cudagraph_mark_step_begin()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = step(ids)
    F.cross_entropy(logits.float().reshape(-1, CFG.vocab_size), targets.reshape(-1)).backward()
    grads = {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}
    if hasattr(model, "to_v1_layout"):
        grads = model.to_v1_layout(grads)
    return {"logits": logits.detach().float().clone(), **{f"grad of {n}": g for n, g in grads.items()}}


@pytest.fixture(scope="module")
def reference():
    """V1 in fp32 (no TF32) and V1's own bf16 error against it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    v1 = load_version("v1").build_model(CFG).cuda()
    ids = torch.randint(0, CFG.vocab_size, (BATCH, SEQ), device="cuda")
    targets = torch.randint(0, CFG.vocab_size, (BATCH, SEQ), device="cuda")
    fp32 = forward_backward(v1, v1, ids, targets, bf16=False)
    bf16 = forward_backward(v1, v1, ids, targets, bf16=True)
    return {"state": {k: v.detach().clone() for k, v in v1.state_dict().items()}, "ids": ids,
            "targets": targets, "fp32": fp32,
            "v1_error": {k: relative_error(bf16[k], fp32[k]) for k in fp32}}


def sdpa_can_run(backend: str, gqa: str) -> bool:
    v4 = load_version("v4")
    q, k, v = (torch.randn(BATCH, heads, SEQ, CFG.head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True)
               for heads in (CFG.num_heads, CFG.num_kv_heads, CFG.num_kv_heads))
    try:
        v4.causal_sdpa(q, k, v, backend, gqa).float().sum().backward()
        return True
    except RuntimeError:
        return False


FORCED = ("flash", "cudnn", "efficient", "math")  # compiled V4: the first of these that runs

# mode "reduce-overhead": torch.compile with CUDA graphs, one compile checked twice - step 1
# (Inductor's code, before any graph is recorded) and step 3 (a replayed graph).
# mode "compile": torch.compile without CUDA graphs (V4 on a forced SDPA backend).
VARIANTS = [
    *[(v, mode, {}) for v in ("v2", "v3") for mode in ("eager", "reduce-overhead")],
    *[("v4", "eager", {"sdpa_backend": backend}) for backend in BACKENDS],
    ("v4", "reduce-overhead", {"sdpa_backend": "auto"}),
    ("v4", "compile", {"sdpa_backend": "forced"}),
]


def runnable_options(backend: str):
    """V4's options for `backend` at this shape; a kernel without grouped-query support
    runs on k/v repeated per head. None: the backend cannot run it on this GPU."""
    if backend == "auto":
        return {"sdpa_backend": "auto"}
    gqa = next((g for g in ("native", "repeat") if sdpa_can_run(backend, g)), None)
    return None if gqa is None else {"sdpa_backend": backend, "gqa": gqa}


def beyond_v1_error(reference, out: dict) -> list[str]:
    assert out.keys() == reference["fp32"].keys()
    worse = []
    for name, expected in reference["fp32"].items():
        error, allowed = relative_error(out[name], expected), reference["v1_error"][name]
        if error > TIMES_V1_ERROR * allowed + FLOOR:
            worse.append(f"{name}: {error:.2e} vs V1's bf16 {allowed:.2e}")
    return worse


@pytest.mark.parametrize("version, mode, options", VARIANTS,
                         ids=[f"{v}-{m}" + (f"-{o['sdpa_backend']}" if o else "") for v, m, o in VARIANTS])
def test_gpu_bf16_logits_and_gradients_match_v1(reference, version, mode, options, monkeypatch):
    module = load_version(version)
    if version == "v3":  # the first fitting launch config: every config's own test is elsewhere
        from version3_triton.kernels import configs
        monkeypatch.setattr(configs, "AUTOTUNE", False)
    if version == "v4":
        backend = options["sdpa_backend"]
        candidates = FORCED if backend == "forced" else (backend,)
        options = next(filter(None, map(runnable_options, candidates)), None)
        if options is None:
            pytest.skip(f"SDPA backend {' / '.join(candidates)} cannot run this shape on this GPU")
    if mode != "eager":
        torch._dynamo.reset()  # a fresh compile per model: no recompile limit, no stale graphs
    model = module.build_model(CFG, **options).cuda()
    model.load_state_dict(reference["state"])
    step = model if mode == "eager" else torch.compile(
        model, mode="reduce-overhead" if mode == "reduce-overhead" else None)
    # CUDA graphs record on a later call than the first: step 3 replays them.
    outs = [forward_backward(model, step, reference["ids"], reference["targets"], bf16=True)
            for _ in range(3 if mode == "reduce-overhead" else 1)]
    checked = {"step 1": outs[0]} if len(outs) == 1 else \
        {"step 1 (compiled)": outs[0], "step 3 (CUDA graph replay)": outs[-1]}
    failures = [f"{label}, {len(worse)} tensors beyond {TIMES_V1_ERROR}x V1's bf16 error: "
                + "; ".join(worse[:6])
                for label, out in checked.items() if (worse := beyond_v1_error(reference, out))]
    assert not failures, f"{options}: " + " | ".join(failures)


# ---- measurements on the GPU --------------------------------------------------------------
def test_gpu_compare_versions_reports_each_runs_own_peak(tmp_path, capsys):
    """The same pair measured twice in one comparison: the same peak within 2% (a run in
    the comparison's own process would also count the first run's leftovers)."""
    import importlib

    out = tmp_path / "compare.json"
    code = importlib.import_module("benchmarks.compare_versions").main(
        ["--preset", "small", "--versions", "v1", "--modes", "eager", "--repeats", "2",
         "--num-steps", "8", "--warmup-steps", "3", "--output", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    runs = json.loads(out.read_text())["runs"]
    for key in {(r["version"], r["mode"]) for r in runs}:
        peaks = [r["peak_memory_mb"] for r in runs if (r["version"], r["mode"]) == key]
        assert len(peaks) == 2 and max(peaks) <= 1.02 * min(peaks), (key, peaks)


def test_gpu_bench_kernels_names_the_bf16_sdpa_kernel():
    import importlib

    bench = importlib.import_module("benchmarks.bench_kernels")
    label = bench.sdpa_kernel_name((16, 16, 16, 512, 64), torch.bfloat16, torch.device("cuda"))
    assert label.split(" (")[0] in ("flash", "cudnn", "fused (device-specific)"), label


def test_gpu_sdpa_sweep_times_device_work():
    """One medium layer's attention, fwd+bwd: device time, not host latency per call."""
    import importlib

    from harness import PRESETS

    preset = PRESETS["medium"]
    rows = importlib.import_module("benchmarks.compare_versions").sdpa_sweep(
        preset.model, preset.batch_size, preset.seq_len, torch.device("cuda"), torch.bfloat16)
    auto = next(r for r in rows if r["backend"] == "auto")
    assert "error" not in auto and auto["fwd_bwd_ms"] > 0, auto
    if any(name in torch.cuda.get_device_name() for name in ("H100", "H200")):
        assert auto["fwd_bwd_ms"] < 0.35, auto  # ~0.2 ms of kernels; one call per sync read ~0.5


def test_gpu_matmul_ceiling_is_stable():
    """Two probes of the matmul ceiling agree within STABLE_PERCENT - on a GPU that runs
    nothing else: beside other test processes sharing it (pytest-xdist), they need not."""
    import os

    from harness import probes

    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("times the GPU: run it alone (pytest -m gpu without -n, or this test by itself)")

    first, second = (probes.matmul_probe("cuda", "bf16")["tflops"] for _ in range(2))
    assert probes.spread_percent(first, second) <= probes.STABLE_PERCENT, (first, second)
