"""--profile pytorch / flopcounter / deepspeed / window, for real on the CPU (tiny preset).

The runs use --device cpu even on a GPU machine: the assertions (CPU operator
tables, FlopCounterMode's CPU-specific SDPA gap) describe the CPU path.
"""
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from conftest import REPO, load_version, run_cli
from harness import flops
from training import cli
from profiling import sessions

V1 = REPO / "version1_baseline" / "tiny_llama_v1.py"


def settings_for(*argv):
    args = cli.build_parser("v1", "").parse_args(list(argv))
    return cli.settings_from_args("v1", args, list(argv))


@pytest.mark.slow
def test_pytorch_profiler_through_its_wrapper(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(REPO / "profiling" / "run_pytorch_profiler.sh"), "v1", "--preset", "tiny",
                        "--num-steps", "5", "--warmup-steps", "2", "--out", str(out), "--device", "cpu"],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = out / "pytorch"
    (trace,) = folder.glob("v1.*.pt.trace.json")  # TensorBoard's layout, also a Perfetto trace
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]  # the steps after warm-up
    operators = (folder / "operators.csv").read_text().splitlines()
    assert operators[0].startswith("name,calls,self_device_us") and any(l.startswith("aten::mm,") for l in operators)
    assert not any(l.startswith(("ProfilerStep", "Optimizer.step")) for l in operators)
    result = json.loads((folder / "results.json").read_text())
    profile = result["profile"]
    assert profile["kind"] == "pytorch" and profile["steps"] == [3, 5]  # counted from 1, as the progress lines
    assert Path(profile["files"]["trace"]) == trace and profile["by_category"]["gemm"] > 0
    assert any("PyTorch profiler" in w for w in result["warnings"])
    assert "self CPU ms" in r.stdout and "ui.perfetto.dev" in r.stdout and "by category:" in r.stdout


def test_flopcounter_counts_one_step_and_matches_the_analytic_model(tmp_path):
    r = run_cli([V1, "--preset", "tiny", "--device", "cpu", "--num-steps", "6", "--warmup-steps", "3",
                 "--profile", "flopcounter",
                 "--profile-dir", tmp_path, "--output", tmp_path / "r.json"])
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "flopcounter" / "flops.json").read_text())
    # V1 spells attention as two matmuls, so every FLOP of the convention is visible;
    # 6 steps summed would give a ratio of 6.
    assert data["counted_step"] == 3 and data["ratio"] == 1.0
    assert data["counted_flops"] == flops.step_flops(cli.PRESETS["tiny"].model, 4, 32)
    assert set(data["by_op"]) == {"aten.mm", "aten.bmm"}
    profile = json.loads((tmp_path / "r.json").read_text())["profile"]
    assert profile["ratio"] == 1.0 and profile["dir"] == str(tmp_path / "flopcounter")
    assert "ratio 1.000" in r.stdout


@pytest.mark.slow
def test_flopcounter_explains_sdpa_on_the_cpu(tmp_path):
    load_version("v4")
    r = run_cli([REPO / "version4_sdpa" / "tiny_llama_v4.py", "--preset", "tiny", "--device", "cpu",
                 "--num-steps", "2", "--warmup-steps", "1", "--profile", "flopcounter", "--profile-dir", tmp_path,
                 "--output", tmp_path / "r.json"])
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "flopcounter" / "flops.json").read_text())
    assert data["ratio"] < 1
    assert any("counts 0 for SDPA on the CPU" in n for n in data["notes"])


# ----------------------------------------------------------------- DeepSpeed, for real
needs_deepspeed = pytest.mark.skipif(
    find_spec("deepspeed") is None, reason="DeepSpeed is not installed ('make test' installs it)")


def test_deepspeed_missing_is_one_line_exit_2(tmp_path):
    # None in sys.modules makes `import deepspeed` fail as if it were not installed.
    hide = ("import runpy, sys; sys.modules['deepspeed'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = run_cli(["-c", hide, V1, "--preset", "tiny", "--num-steps", "2", "--warmup-steps", "1",
                 "--profile", "deepspeed", "--output", tmp_path / "r.json"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "not installed: pip install 'deepspeed==0.19.*'" in r.stderr
    assert not (tmp_path / "r.json").exists()


@needs_deepspeed
@pytest.mark.slow  # the missing-DeepSpeed test and the FLOP counter's keep the wiring in make test
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_deepspeed_counts_one_forward_of_every_version(tmp_path, version):
    """The real FLOPS profiler, through run_all_profilers.sh, on the CPU (tiny preset).

    DeepSpeed counts 2 FLOPs per MAC in the matrix products it sees, plus elementwise
    work. V1, V2 and V4 make every matrix product through a torch function DeepSpeed
    wraps (F.linear, torch.matmul, F.scaled_dot_product_attention), so their MACs are
    exactly the analytic forward FLOPs. V3's attention is a Triton kernel launched from
    an autograd.Function: it runs inside a hooked module but calls no wrapped function,
    so attention's QK^T and PV products (4*L*d*T FLOPs per token, forward) count 0.
    """
    load_version(version)
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(REPO / "run_all_profilers.sh"), version, "--only", "deepspeed",
                        "--preset", "tiny", "--num-steps", "2", "--warmup-steps", "1", "--out", str(out),
                        "--", "--device", "cpu"],
                       env={**os.environ, "PYTHON": sys.executable, "PROFILE_BACKEND": "cpu"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ran:     deepspeed" in r.stdout and "skipped" not in r.stdout
    # DeepSpeed's start-up chatter ("[WARNING] [real_accelerator.py:...] Setting accelerator
    # to CPU ...") does not reach the console.
    assert "real_accelerator" not in r.stdout + r.stderr and "[WARNING]" not in r.stdout + r.stderr

    cfg = cli.PRESETS["tiny"].model
    analytic = flops.forward_flops(cfg, 4, 32)
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 32 * (4 * 32)
    data = json.loads((out / "deepspeed" / "flops.json").read_text())
    profile = json.loads((out / "deepspeed" / "results.json").read_text())["profile"]
    assert profile["tool"] == "deepspeed" and profile["scope"] == "forward"
    assert profile["counted_flops"] == data["counted_flops"] and profile["analytic_flops"] == analytic
    assert data["startup_messages"] == []
    elementwise = data["counted_flops"] - 2 * data["macs"]
    if version == "v3":  # SiLU * mul is a Triton kernel too: no F.silu for DeepSpeed to count
        assert elementwise == 0
        assert 2 * data["macs"] == analytic - attention and 0.93 < profile["ratio"] < 0.94
        assert any("exactly attention's QK^T and PV products" in n and "Triton kernel" in n
                   for n in data["notes"])
    else:
        assert 0 < elementwise < 0.01 * analytic  # F.silu, and F.softmax where attention is unfused
        # One forward: summing both steps (as AMD's TinyTransformer workshop did) would give 2.0.
        assert 2 * data["macs"] == analytic and 1.0 < profile["ratio"] < 1.005
    report = (out / "deepspeed" / "deepspeed_profile.txt").read_text()
    assert "Flops Profiler" in report and "fwd flops per GPU" in report


@pytest.mark.slow
@needs_deepspeed
def test_deepspeed_startup_chatter_is_kept_not_printed():
    # Without DS_ACCELERATOR (a device type DeepSpeed is not told about), DeepSpeed
    # detects its accelerator on import and warns; the warning is returned, not printed.
    code = ("import logging, sys, torch; from profiling import sessions; "
            "_, said = sessions.import_flops_profiler(torch.device('meta')); print(said); "
            "print(all(h.stream is sys.stdout for h in logging.getLogger('DeepSpeed').handlers))")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    said, handlers_on_console = r.stdout.splitlines()
    assert "Setting accelerator to CPU" in said and r.stderr == ""
    assert handlers_on_console == "True"  # later DeepSpeed warnings still reach the console


def _train(session, settings, model):
    ids = torch.randint(0, settings.model.vocab_size, (settings.batch_size, settings.seq_len))
    for step in range(settings.num_steps):
        model(ids).sum().backward()
        session.step(step)
    result = {"flops": {"convention": "test"}, "warnings": []}
    session.finish(result)
    return result


@needs_deepspeed
def test_deepspeed_session_counts_exactly_one_forward(tmp_path):
    # In this process, with the real profiler: 5 steps run, step 1 (the last warm-up
    # step) is counted, and the count is one forward's, not five.
    settings = settings_for("--preset", "tiny", "--num-steps", "5", "--warmup-steps", "2",
                            "--profile", "deepspeed", "--profile-dir", str(tmp_path), "--quiet")
    model = load_version("v1").build_model(settings.model)
    session = sessions.start(settings, torch.device("cpu"), model)
    profile = _train(session, settings, model)["profile"]
    analytic = flops.forward_flops(settings.model, 4, 32)
    assert profile["steps"] == [2, 2] and profile["analytic_flops"] == analytic
    assert analytic < profile["counted_flops"] < 1.005 * analytic
    assert "Profile Summary at step 1:" in (tmp_path / "deepspeed" / "deepspeed_profile.txt").read_text()
    saved = json.loads((tmp_path / "deepspeed" / "flops.json").read_text())
    assert saved["counts"].startswith("forward only") and 2 * saved["macs"] == analytic
    assert not any(hasattr(m, "__flops__") for m in model.modules())  # hooks removed afterwards


@pytest.mark.parametrize("warmup, expected", [(0, (0, 0)), (1, (0, 0)), (4, (3, 3))])
def test_counted_step_is_the_last_warmup_step(warmup, expected):
    settings = settings_for("--num-steps", "8", "--warmup-steps", str(warmup))
    calls = []

    class Recorder(sessions.Session):
        def _begin(self):
            calls.append("begin")

        def _end(self):
            calls.append("end")

    step = sessions.counted_step(settings)
    assert (step, step) == expected
    session = Recorder(settings, torch.device("cpu"), None, step, step)
    for i in range(settings.num_steps):
        calls.append(f"ran step {i}")  # the trainer calls .step(i) after step i ran
        session.step(i)
    # counting starts just before the counted step runs and stops right after it
    assert calls[calls.index("begin") + 1] == calls[calls.index("end") - 1] == f"ran step {step}"
    assert calls.count("begin") == calls.count("end") == 1


def test_window_marks_nothing_on_a_cpu_and_says_so(tmp_path):
    settings = settings_for("--num-steps", "5", "--warmup-steps", "1", "--profile", "window", "--quiet")
    model = load_version("v1").build_model(settings.model)
    result = _train(sessions.start(settings, torch.device("cpu"), model), settings, model)
    assert result["profile"]["steps"] == [2, 4] and result["profile"]["notes"] == ["no GPU: nothing to mark"]


def test_a_finished_pytorch_profile_replaces_the_earlier_traces(tmp_path):
    # In this process: an earlier run's trace in the folder is removed once this run
    # has written its own, so a folder never holds the traces of several runs.
    earlier = tmp_path / "pytorch" / "v1.1.pt.trace.json"
    earlier.parent.mkdir()
    earlier.write_text('{"traceEvents": []}')
    settings = settings_for("--preset", "tiny", "--num-steps", "3", "--warmup-steps", "1",
                            "--profile", "pytorch", "--profile-dir", str(tmp_path), "--quiet")
    model = load_version("v1").build_model(settings.model)
    profile = _train(sessions.start(settings, torch.device("cpu"), model), settings, model)["profile"]
    (trace,) = (tmp_path / "pytorch").glob("*.pt.trace.json")
    assert trace != earlier and profile["files"]["trace"] == str(trace)
