"""Every script a user can run, run at a tiny size, so none breaks unseen.

A script that only a GPU runs (a benchmark, a profiling helper) is easy to break
from a CPU-only machine: a kernel gains an argument and its raw launch in a
benchmark fails only on the next GPU run. So each script under benchmarks/,
tools/, exercises/ and the version folders is listed here with what runs it:

  cpu   the test that runs it (or its CPU-capable part) on a CPU: in `make test`, or in
        `make test-slow` for the longer end-to-end runs (CI runs both)
  gpu   its command line at a tiny size, run by `pytest -m gpu` (None: a test
        named in `cpu` already runs it on the GPU too, or it needs no GPU)

A new script without a row fails the first test below.
"""
import os
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli

PY = sys.executable
TINY = ["--preset", "tiny", "--num-steps", "3", "--warmup-steps", "1"]

SCRIPTS = {
    "benchmarks/ceilings.py": dict(
        cpu="tests/test_measurement.py", gpu=[PY, "-m", "benchmarks.ceilings", "--precisions", "bf16",
                                              "--output", "{tmp}/ceilings.json"]),
    "benchmarks/compare_versions.py": dict(
        cpu="tests/test_analysis_compare_versions.py::test_compare_versions_stores_whole_results",
        gpu=None),  # tests/test_gpu_parity.py::test_gpu_compare_versions_reports_each_runs_own_peak
    "benchmarks/experiments.py": dict(
        cpu="tests/test_publish.py::test_reproduce_quick_makes_a_published_set", gpu=None),
    "benchmarks/host_overhead.py": dict(
        cpu="tests/test_scripts.py::test_host_overhead_cases_run_in_the_interpreter",
        gpu=[PY, "benchmarks/host_overhead.py", "--output", "{tmp}/host_overhead.json"]),
    "benchmarks/ddp_scaling.sh": dict(
        cpu="tests/test_scripts.py::test_gpu_only_scripts_say_so_in_one_line_on_a_cpu",
        gpu=["env", "NGPU=1", "STEPS=4", "WARMUP=2", "FSDP=0", f"PYTHON={PY}", "OUT_DIR={tmp}/ddp",
             "EXTRA_ARGS=--preset tiny", "bash", "benchmarks/ddp_scaling.sh"]),
    "benchmarks/reproduce.sh": dict(
        cpu="tests/test_publish.py::test_reproduce_quick_makes_a_published_set",
        gpu=None),  # on a GPU it is the publishing command itself
    "exercises/performance_debugging/run_all_stages.py": dict(
        cpu="tests/test_perf_debugging.py::test_every_stage_reports_a_symptom",
        gpu=[PY, "exercises/performance_debugging/run_all_stages.py", "--stages", "1", "4",
             "--preset", "tiny", "--num-steps", "4", "--out-dir", "{tmp}/stages"]),  # 2, 3, 5 show
    # their symptoms from the small preset up: tests/test_perf_debugging.py runs them on a GPU
    **{f"exercises/performance_debugging/stage{n}_{name}.py": dict(
        cpu="tests/test_perf_debugging.py::test_every_stage_reports_a_symptom",
        gpu=None)  # run_all_stages above, and tests/test_perf_debugging.py::test_gpu_stages_measure_their_symptoms
       for n, name in ((1, "bad_init"), (2, "noncontiguous"), (3, "unsynchronized_timing"),
                       (4, "cut_graph"), (5, "triton_gemm"))},
    "tools/make_notebooks.py": dict(cpu="tests/test_notebooks.py::test_notebooks_match_their_generator", gpu=None),
    "tools/make_version_diffs.py": dict(cpu="tests/test_docs_commands.py::test_version_readme_diffs_match_the_code",
                                        gpu=None),
    "tools/publish.py": dict(cpu="tests/test_publish.py::test_every_published_block_matches_its_data", gpu=None),
    **{f"{folder}/tiny_llama_v{n}.py": dict(
        cpu="tests/test_docs_commands.py::test_every_quoted_command_exists_and_parses",
        gpu=[PY, f"{folder}/tiny_llama_v{n}.py", *TINY, "--output", f"{{tmp}}/v{n}.json"])
       for n, folder in ((1, "version1_baseline"), (2, "version2_fused"), (3, "version3_triton"),
                         (4, "version4_sdpa"))},
    "benchmarks/backward_ops.py": dict(
        cpu="tests/test_qkv_attention.py::test_the_backward_ops_tool_shows_the_gather_and_its_absence",
        gpu=[PY, "benchmarks/backward_ops.py"]),
    "benchmarks/bench_kernels.py": dict(
        cpu="tests/test_bench_kernels.py::test_bench_kernels_quick_runs_and_reports_host_overhead",
        gpu=None),  # tests/test_gpu_parity.py::test_gpu_bench_kernels_names_the_bf16_sdpa_kernel
    "benchmarks/codegen.py": dict(cpu="tests/test_codegen.py::test_flagship_targets_never_spill_bf16_head_dim_64",
                                       gpu=None),  # compiles for GPUs on the CPU
}


def runnable_scripts() -> set[str]:
    """Python files with a __main__ block and shell scripts, where users run them."""
    found = set()
    for folder in ("benchmarks", "tools", "exercises", *(v.folder for v in _versions())):
        for path in (REPO / folder).rglob("*"):
            text = path.read_text(errors="replace") if path.suffix in (".py", ".sh") else ""
            if (path.suffix == ".sh" or 'if __name__ == "__main__"' in text) and path.name != "common.py":
                found.add(str(path.relative_to(REPO)))
    return found


def _versions():
    from harness.config import VERSIONS
    return VERSIONS.values()


def test_every_script_has_a_row_and_every_row_names_a_real_test():
    assert runnable_scripts() == set(SCRIPTS)
    for script, row in SCRIPTS.items():
        path, _, name = row["cpu"].partition("::")
        text = (REPO / path).read_text()
        assert not name or f"def {name}(" in text, (script, row["cpu"])


@pytest.mark.slow
def test_host_overhead_cases_run_in_the_interpreter():
    """Every call the GPU benchmark times, once, on the CPU: a launch whose arguments no
    longer match its kernel fails here, not on the next GPU run."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (the tests set TRITON_INTERPRET=1 on a CPU)")
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    import host_overhead
    from version3_triton import kernels as tk

    rows = host_overhead.cases(tk, "cpu", torch.float32)
    for name, call, replaces in rows:
        call()
    names = [name for name, _, _ in rows]
    # every V3 operation with a PyTorch counterpart, forward and forward + backward, beside it
    for op in ("rms_norm", "add_rms_norm", "rope", "swiglu", "qkv_attention", "linear_cross_entropy"):
        for part in ("forward", "fwd+bwd"):
            replaces = dict((n, r) for n, _, r in rows)[f"v3: {op} {part}"]
            assert replaces in names and replaces.startswith("torch: ") and replaces.endswith(part)


@pytest.mark.parametrize("command, needle", [
    ([PY, "benchmarks/host_overhead.py"], "no CUDA/ROCm GPU here"),
    (["env", f"PYTHON={PY}", "bash", "benchmarks/ddp_scaling.sh"], "needs 2 GPUs, 0 visible"),
    (["env", f"PYTHON={PY}", "VARIANTS=bucket100 nonsense", "bash", "benchmarks/ddp_scaling.sh"],
     "unknown variant 'nonsense'"),
])
def test_gpu_only_scripts_say_so_in_one_line_on_a_cpu(command, needle):
    import torch
    if torch.cuda.is_available() and "nonsense" not in str(command):
        pytest.skip("this machine has a GPU")
    proc = _run(command, Path("/nonexistent"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def test_a_refused_scaling_run_leaves_no_output_folder(tmp_path):
    proc = _run(["env", f"PYTHON={PY}", "OUT_DIR={tmp}/ddp", "VARIANTS=nonsense", "bash",
                 "benchmarks/ddp_scaling.sh"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "ddp").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("script", [s for s, row in SCRIPTS.items() if row["gpu"]])
def test_gpu_script_runs_at_a_tiny_size(script, tmp_path):
    proc = _run(SCRIPTS[script]["gpu"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _run(command, tmp, timeout=120):
    import subprocess
    argv = [str(a).replace("{tmp}", str(tmp)) for a in command]
    if argv[0] == PY:
        return run_cli(argv[1:], timeout=timeout)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
