"""--profile pytorch / flopcounter / deepspeed / window, for real on the CPU (tiny preset).

The runs use --device cpu even on a GPU machine: the assertions (CPU operator
tables, FlopCounterMode's CPU-specific SDPA gap) describe the CPU path.
"""
import json
import os
import subprocess
import sys
import types
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from conftest import REPO, load_version, run_cli
from harness import cli, flops, profiling

V1 = REPO / "version1_baseline" / "tiny_llama_v1.py"


def settings_for(*argv):
    args = cli.build_parser("v1", "").parse_args(list(argv))
    return cli.settings_from_args("v1", args, list(argv))


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
    assert profile["kind"] == "pytorch" and profile["steps"] == [2, 4]
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
    assert data["counted_step"] == 2 and data["ratio"] == 1.0
    assert data["counted_flops"] == flops.step_flops(cli.PRESETS["tiny"].model, 4, 32)
    assert set(data["by_op"]) == {"aten.mm", "aten.bmm"}
    profile = json.loads((tmp_path / "r.json").read_text())["profile"]
    assert profile["ratio"] == 1.0 and profile["dir"] == str(tmp_path / "flopcounter")
    assert "ratio 1.000" in r.stdout


def test_flopcounter_explains_sdpa_on_the_cpu(tmp_path):
    load_version("v4")
    r = run_cli([REPO / "version4_sdpa" / "tiny_llama_v4.py", "--preset", "tiny", "--device", "cpu",
                 "--num-steps", "2", "--warmup-steps", "1", "--profile", "flopcounter", "--profile-dir", tmp_path,
                 "--output", tmp_path / "r.json"])
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "flopcounter" / "flops.json").read_text())
    assert data["ratio"] < 1
    assert any("counts 0 for SDPA on the CPU" in n for n in data["notes"])


@pytest.mark.skipif(find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_missing_is_one_line_exit_2(tmp_path):
    r = run_cli([V1, "--preset", "tiny", "--num-steps", "2", "--warmup-steps", "1", "--profile", "deepspeed",
                 "--output", tmp_path / "r.json"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "pip install 'deepspeed==0.19.*'" in r.stderr
    assert not (tmp_path / "r.json").exists()


def _fake_deepspeed(monkeypatch):
    """A stand-in FlopsProfiler with DeepSpeed's API that counts 1000 FLOPs per forward."""
    class FlopsProfiler:
        started = 0

        def __init__(self, model):
            self.model, self.flops = model, 0

        def start_profile(self):
            FlopsProfiler.started += 1
            self.hook = self.model.register_forward_hook(lambda *_: setattr(self, "flops", self.flops + 1000))

        def get_total_flops(self, as_string=False):
            return self.flops

        def get_total_macs(self):
            return self.flops // 2

        def get_total_params(self):
            return 42

        def print_model_profile(self, profile_step, module_depth, top_modules, detailed, output_file):
            Path(output_file).write_text(f"step {profile_step}")

        def end_profile(self):
            self.hook.remove()

    flops_profiler = types.ModuleType("deepspeed.profiling.flops_profiler")
    flops_profiler.FlopsProfiler = FlopsProfiler
    for name, module in [("deepspeed", types.ModuleType("deepspeed")),
                         ("deepspeed.profiling", types.ModuleType("deepspeed.profiling")),
                         ("deepspeed.profiling.flops_profiler", flops_profiler)]:
        monkeypatch.setitem(sys.modules, name, module)
    return FlopsProfiler


def _train(session, settings, model):
    ids = torch.randint(0, settings.model.vocab_size, (settings.batch_size, settings.seq_len))
    for step in range(settings.num_steps):
        model(ids).sum().backward()
        session.step(step)
    result = {"flops": {"convention": "test"}, "warnings": []}
    session.finish(result)
    return result


def test_deepspeed_session_counts_exactly_one_forward(tmp_path, monkeypatch):
    profiler_class = _fake_deepspeed(monkeypatch)
    settings = settings_for("--preset", "tiny", "--num-steps", "5", "--warmup-steps", "2",
                            "--profile", "deepspeed", "--profile-dir", str(tmp_path), "--quiet")
    model = load_version("v1").build_model(settings.model)
    session = profiling.start(settings, torch.device("cpu"), model)
    result = _train(session, settings, model)
    profile = result["profile"]
    assert profiler_class.started == 1 and profile["counted_flops"] == 1000  # one forward, not five
    assert profile["analytic_flops"] == flops.forward_flops(settings.model, 4, 32)
    assert (tmp_path / "deepspeed" / "deepspeed_profile.txt").read_text() == "step 1"
    saved = json.loads((tmp_path / "deepspeed" / "flops.json").read_text())
    assert saved["counts"].startswith("forward only") and saved["macs"] == 500


@pytest.mark.parametrize("warmup, expected", [(0, (0, 0)), (1, (0, 0)), (4, (3, 3))])
def test_counted_step_is_the_last_warmup_step(warmup, expected):
    settings = settings_for("--num-steps", "8", "--warmup-steps", str(warmup))
    calls = []

    class Recorder(profiling.Session):
        def _begin(self):
            calls.append("begin")

        def _end(self):
            calls.append("end")

    step = profiling.counted_step(settings)
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
    result = _train(profiling.start(settings, torch.device("cpu"), model), settings, model)
    assert result["profile"]["steps"] == [1, 3] and result["profile"]["notes"] == ["no GPU: nothing to mark"]
