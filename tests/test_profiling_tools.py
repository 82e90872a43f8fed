"""The profiling/ shell wrappers, run against fake profilers (tests/fake_tools/bin).

Each fake logs its command line and writes the files the real tool writes,
so these tests check the exact commands, where outputs land, what happens
when a tool is missing or fails, and run_all_profilers.sh's summary - on a
CPU machine with none of the real tools installed.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKES = REPO / "tests" / "fake_tools" / "bin"
ALL_FAKES = sorted(p.name for p in FAKES.iterdir())
SYSTEM_PATH = "/usr/bin:/bin"
V1 = str(REPO / "version1_baseline" / "tiny_llama_v1.py")


def run(script, *args, tmp_path, fakes=ALL_FAKES, env=None, cwd=REPO):
    """Run a wrapper with only the chosen fakes (and the system's basic tools) on PATH,
    in a session of its own: a fake's Ctrl-C (FAKE_CTRL_C) reaches the wrapper, not pytest.
    SIGINT is set back to its default there: a shell started in the background (`make test &`)
    hands its children SIGINT ignored, and the wrapper would never see the Ctrl-C."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in fakes:
        if not (bindir / name).exists():
            (bindir / name).symlink_to(FAKES / name)
    full_env = {"PATH": f"{bindir}:{SYSTEM_PATH}", "HOME": str(tmp_path), "LANG": "C.UTF-8",
                "PYTHON": sys.executable, "FAKE_LOG": str(tmp_path / "fake.log"), **(env or {})}
    return subprocess.run(["bash", str(REPO / script), *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=180, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def logged(tmp_path) -> list[list[str]]:
    log = tmp_path / "fake.log"
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def app(out, tool, steps=6, *extra):
    return [sys.executable, V1, "--num-steps", str(steps), "--warmup-steps", "3",
            "--output", f"{out}/{tool}/results.json", "--profile-dir", str(out), "--preset", "tiny",
            *extra, "--profile", "window"]


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result


# ----------------------------------------------------------------- each wrapper
def test_rocprofv3_command_outputs_and_table(tmp_path):
    out = tmp_path / "out"
    r = ok(run("profiling/run_rocprofv3.sh", "v1", "--preset", "tiny", "--out", out, tmp_path=tmp_path))
    assert logged(tmp_path) == [[
        "rocprofv3", "--kernel-trace", "--stats", "--truncate-kernels", "--marker-trace",
        "--output-format", "csv", "-d", f"{out}/rocprofv3", "-o", "v1_tiny", "--", *app(out, "rocprofv3")]]
    for name in ("kernel_trace", "kernel_stats", "marker_api_trace"):
        assert (out / "rocprofv3" / f"v1_tiny_{name}.csv").is_file()
    table = (out / "rocprofv3" / "kernel_table.csv").read_text()
    assert table.startswith("name,category,calls") and "Cijk_" in table
    assert "only kernels inside the 'profiled_window' marker" in r.stdout
    assert r.stdout.strip().endswith(f"outputs: {out}/rocprofv3")


def test_rocprofv3_options_and_training_flags(tmp_path):
    out = tmp_path / "out"
    ok(run("profiling/run_rocprofv3.sh", "v1", "--preset=tiny", "--out", out, "--sys-trace",
           "--pmc", "SQ_WAVES,GRBM_GUI_ACTIVE", "--pftrace", "--batch-size", "2", "--", "--seed", "7",
           tmp_path=tmp_path))
    (cmd,) = logged(tmp_path)
    dash = cmd.index("--")
    assert cmd[:dash] == ["rocprofv3", "--kernel-trace", "--stats", "--truncate-kernels", "--marker-trace",
                          "--sys-trace", "--pmc", "SQ_WAVES", "GRBM_GUI_ACTIVE",
                          "--output-format", "csv", "pftrace", "-d", f"{out}/rocprofv3", "-o", "v1_tiny"]
    assert cmd[dash + 1:] == app(out, "rocprofv3", 6, "--batch-size", "2", "--seed", "7")
    assert (out / "rocprofv3" / "v1_tiny_results.pftrace").is_file()


def test_relative_out_becomes_absolute(tmp_path):
    ok(run("profiling/run_rocprofv3.sh", "v1", "--out", "rel", "--tag", "run1", tmp_path=tmp_path, cwd=tmp_path))
    (cmd,) = logged(tmp_path)
    assert cmd[cmd.index("-d") + 1] == f"{tmp_path}/rel/rocprofv3" and "run1" in cmd


@pytest.mark.parametrize("mode", ["sample", "run"])
def test_rocprof_sys(tmp_path, mode):
    out = tmp_path / "out"
    extra = ["--mode", mode] if mode == "run" else []
    ok(run("profiling/run_rocprof_sys.sh", "v1", "--preset", "tiny", "--out", out, *extra, tmp_path=tmp_path))
    cmd, env = logged(tmp_path)
    assert cmd == [f"rocprof-sys-{mode}", "--trace", "--profile", "--", *app(out, "rocprof-sys")]
    assert env == ["env", f"ROCPROFSYS_OUTPUT_PATH={out}/rocprof-sys", "ROCPROFSYS_TIME_OUTPUT=OFF",
                   "ROCPROFSYS_USE_PID=OFF"]
    assert (out / "rocprof-sys" / "perfetto-trace.proto").is_file()


def test_rocprof_compute_profile_then_analyze(tmp_path):
    out = tmp_path / "out"
    ok(run("profiling/run_rocprof_compute.sh", "v1", "--preset", "tiny", "--out", out, "--roof-only",
           "--kernel", "Cijk", tmp_path=tmp_path))
    workload = out / "rocprof-compute" / "v1_tiny" / "MI300X_A1"
    assert logged(tmp_path) == [
        ["rocprof-compute", "profile", "-n", "v1_tiny", "-p", f"{out}/rocprof-compute/v1_tiny",
         "--roof-only", "-k", "Cijk", "--", *app(out, "rocprof-compute", 4)],
        ["rocprof-compute", "analyze", "-p", str(workload), "--save-dfs", f"{workload}/dfs"]]
    assert "Speed-of-Light" in (workload / "analyze.txt").read_text()
    table = (out / "rocprof-compute" / "kernel_table.csv").read_text().splitlines()
    assert table[1].startswith("Cijk_") and ",513280," in table[1] or ",1026560," in table[1]


def test_ncu_window_export_and_table(tmp_path):
    out = tmp_path / "out"
    ok(run("profiling/run_ncu.sh", "v1", "--preset", "tiny", "--out", out, "--launch-count", "50",
           "--kernel", "gemm|flash", "--launch-skip", "5", tmp_path=tmp_path))
    profile, export = logged(tmp_path)
    dash = profile.index("--")
    assert profile[:dash] == [
        "ncu", "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
        "--launch-count", "50", "-k", "regex:gemm|flash", "--launch-skip", "5",
        "--metrics", profile[profile.index("--metrics") + 1], "-f", "-o", f"{out}/ncu/v1_tiny"]
    assert "gpu__time_duration.sum" in profile[profile.index("--metrics") + 1]
    assert profile[dash + 1:] == app(out, "ncu", 4)  # warm-up + the one captured step
    assert export == ["ncu", "-i", f"{out}/ncu/v1_tiny.ncu-rep", "--csv", "--page", "raw",
                      "--print-units", "base"]
    assert (out / "ncu" / "v1_tiny.csv").read_text().count("Kernel2") == 1
    assert "cutlass::Kernel2" in (out / "ncu" / "kernel_table.csv").read_text()


def test_nsys_capture_range_stats_and_table(tmp_path):
    out = tmp_path / "out"
    ok(run("profiling/run_nsys.sh", "v1", "--preset", "tiny", "--out", out, tmp_path=tmp_path))
    profile, stats = logged(tmp_path)
    assert profile == ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
                       "--capture-range-end=stop", "-f", "true", "-o", f"{out}/nsys/v1_tiny", "--",
                       *app(out, "nsys")]
    assert stats == ["nsys", "stats", "-r", "cuda_gpu_kern_sum,cuda_gpu_mem_time_sum", "-f", "csv",
                     "--force-export=true", "-o", f"{out}/nsys/v1_tiny", f"{out}/nsys/v1_tiny.nsys-rep"]
    assert "flash_attention_prefill_f16" in (out / "nsys" / "kernel_table.csv").read_text()


# ----------------------------------------------------------------- missing tools, failures
WRAPPERS = [("run_rocprofv3.sh", "rocprofv3", []), ("run_rocprof_sys.sh", "rocprof-sys-sample", []),
            ("run_rocprof_compute.sh", "rocprof-compute", []), ("run_ncu.sh", "ncu", []),
            ("run_nsys.sh", "nsys", [])]


@pytest.mark.parametrize("script, tool, extra", WRAPPERS)
def test_missing_tool_is_one_skip_line(tmp_path, script, tool, extra):
    if shutil.which(tool, path=SYSTEM_PATH):
        pytest.skip(f"a real {tool} is installed in {SYSTEM_PATH}")
    out = tmp_path / "out"
    r = run(f"profiling/{script}", "v1", "--out", out, *extra, tmp_path=tmp_path, fakes=[])
    assert r.returncode == 77, r.stderr
    assert r.stdout.startswith(f"skipped: {tool} not found (") and r.stdout.count("\n") == 1
    assert r.stderr == "" and not (out / tool).exists()


@pytest.mark.parametrize("script, tool, extra", WRAPPERS)
def test_failing_tool_fails_the_wrapper(tmp_path, script, tool, extra):
    r = run(f"profiling/{script}", "v1", "--out", tmp_path / "out", *extra, tmp_path=tmp_path,
            env={"FAKE_FAIL": f"{tool}:3"})
    assert r.returncode == 3
    assert f"error: {script[4:-3].replace('_', '-')} failed (exit 3)" in r.stderr


def test_tool_exiting_77_is_a_failure_not_a_skip(tmp_path):
    r = run("profiling/run_rocprofv3.sh", "v1", "--out", tmp_path / "out", tmp_path=tmp_path,
            env={"FAKE_FAIL": "rocprofv3:77"})
    assert r.returncode == 1 and "failed (exit 1)" in r.stderr


def test_ncu_that_profiled_nothing_is_an_error(tmp_path):
    r = run("profiling/run_ncu.sh", "v1", "--out", tmp_path / "out", "--kernel", "nomatch",
            tmp_path=tmp_path, env={"FAKE_NCU_NO_KERNELS": "1"})
    assert r.returncode == 1
    assert "ncu profiled no kernels" in r.stderr and len(logged(tmp_path)) == 1  # no export attempted


def test_nsys_without_a_report_is_skipped(tmp_path):
    out = tmp_path / "out"
    r = run("profiling/run_nsys.sh", "v1", "--out", out, tmp_path=tmp_path, env={"FAKE_NSYS_BROKEN": "1"})
    assert r.returncode == 77
    assert "skipped: nsys ran but could not write" in r.stdout
    assert not (out / "nsys").exists()  # nothing of the unusable capture (.qdstrm, GBs) is left


def test_bad_arguments_are_one_line(tmp_path):
    for args, message in [(["v9"], "unknown version 'v9'"), ([], "which version?"),
                          (["v1", "--num-steps", "3"], "must be above --warmup-steps"),
                          (["v1", "--pmc", "--out", "x"], "--pmc needs counter names")]:
        r = run("profiling/run_rocprofv3.sh", *args, "--out", tmp_path / "out", tmp_path=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, (args, r.stderr)


@pytest.mark.slow
def test_profiled_app_really_runs_and_its_failure_propagates(tmp_path):
    out = tmp_path / "out"
    env = {"FAKE_RUN_APP": "1"}
    ok(run("profiling/run_rocprofv3.sh", "v1", "--preset", "tiny", "--num-steps", "4", "--out", out,
           tmp_path=tmp_path, env=env))
    import json
    result = json.loads((out / "rocprofv3" / "results.json").read_text())
    assert result["profile"]["kind"] == "window" and result["run"]["num_steps"] == 4
    assert (out / "rocprofv3" / "kernel_table.csv").exists()
    before = contents(out)
    r = run("profiling/run_rocprofv3.sh", "v1", "--out", out, "--batch-size", "0", tmp_path=tmp_path, env=env)
    assert r.returncode == 2 and "--batch-size must be > 0" in r.stdout + r.stderr
    assert "error: rocprofv3 failed (exit 2)" in r.stderr
    # the failed run's files (written by the tool before the run failed) are gone, the previous
    # profile is whole, and the failed run's log is kept beside it
    assert contents(out) == {**before, "rocprofv3.failed.log": (out / "rocprofv3.failed.log").read_bytes()}
    assert "--batch-size must be > 0" in (out / "rocprofv3.failed.log").read_text()


def contents(folder) -> dict[str, bytes]:
    """Every file under folder, hidden ones included: path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


@pytest.mark.parametrize("ending", ["FAKE_FAIL=rocprofv3:3", "FAKE_CTRL_C=rocprofv3"])
def test_a_failed_or_interrupted_profile_keeps_the_previous_one_whole(tmp_path, ending):
    out = tmp_path / "out"
    ok(run("profiling/run_rocprofv3.sh", "v1", "--out", out, tmp_path=tmp_path))
    before = contents(out)
    name, value = ending.split("=")
    r = run("profiling/run_rocprofv3.sh", "v1", "--out", out, "--pftrace", tmp_path=tmp_path, env={name: value})
    assert r.returncode == (3 if name == "FAKE_FAIL" else 130)
    after = contents(out)
    after.pop("rocprofv3.failed.log", None)  # the failed run's own log, beside the profile
    assert after == before  # nothing hidden left behind either
    if name == "FAKE_CTRL_C":
        assert r.stderr.splitlines() == [f"interrupted: rocprofv3 stopped; {out}/rocprofv3 keeps its previous profile"]
    ok(run("profiling/run_rocprofv3.sh", "v1", "--out", out, "--pftrace", tmp_path=tmp_path))
    assert (out / "rocprofv3" / "v1_results.pftrace").is_file() and [p.name for p in out.iterdir()] == ["rocprofv3"]


# ----------------------------------------------------------------- run_all_profilers.sh
def test_run_all_on_rocm_runs_skips_and_reports_failures(tmp_path):
    out = tmp_path / "out"
    r = run("profiling/run_all_profilers.sh", "v1", "--preset", "tiny", "--out", out,
            "--skip", "pytorch,flopcounter,deepspeed", tmp_path=tmp_path,
            fakes=["rocprofv3", "rocprof-compute", "ncu"],
            env={"PROFILE_BACKEND": "rocm", "FAKE_FAIL": "rocprof-compute:5"})
    assert r.returncode == 1
    summary = r.stdout[r.stdout.index("=== summary"):].splitlines()
    assert re.fullmatch(rf"ran:     rocprofv3 +\d+ s  {out}/rocprofv3  \(kernel_table.csv\)", summary[1])
    assert summary[2:6] == [
        "skipped: rocprof-sys-sample not found (install ROCm >= 6.3 (rocprofiler-systems) and add "
        "/opt/rocm/bin to PATH)",
        "skipped: ncu (needs an NVIDIA (CUDA) GPU; this machine runs rocm)",
        "skipped: nsys (needs an NVIDIA (CUDA) GPU; this machine runs rocm)",
        f"failed:  rocprof-compute (exit 5; log: {out}/rocprof-compute.failed.log)"]
    assert [cmd[0] for cmd in logged(tmp_path)] == ["rocprofv3", "rocprof-compute"]
    # the closing hint is a command that runs: every table written, side by side
    hint = summary[-1].split("side by side:", 1)[1].split()
    assert hint[:3] == ["python", "-m", "profiling"] and hint[4:] == [f"rocprofv3={out}/rocprofv3/kernel_table.csv"]
    compared = subprocess.run([sys.executable, *hint[1:]], cwd=REPO, capture_output=True, text=True)
    assert compared.returncode == 0 and compared.stdout.startswith("category") and "rocprofv3" in compared.stdout


@pytest.mark.parametrize("ending", ["FAKE_FAIL=rocprofv3:130", "FAKE_CTRL_C=rocprofv3"])
def test_run_all_stops_at_ctrl_c(tmp_path, ending):
    # a profiler that exits 130 (Ctrl-C reached it), or Ctrl-C to the whole terminal
    name, value = ending.split("=")
    r = run("profiling/run_all_profilers.sh", "v1", "--out", tmp_path / "out", "--only", "rocprofv3,rocprof-compute",
            tmp_path=tmp_path, env={"PROFILE_BACKEND": "rocm", name: value})
    assert r.returncode == 130, r.stdout + r.stderr
    assert "=== summary" not in r.stdout and [cmd[0] for cmd in logged(tmp_path)] == ["rocprofv3"]
    assert len([line for line in (r.stdout + r.stderr).splitlines() if "interrupted" in line]) == 1


def test_run_all_from_a_version_folder_and_the_root(tmp_path):
    # Run from inside a version folder, the root script profiles that version.
    r = ok(run("run_all_profilers.sh", "--only", "ncu,nsys", "--out", tmp_path / "a",
               "--args-for", "ncu", "--launch-count 7", tmp_path=tmp_path, cwd=REPO / "version1_baseline",
               env={"PROFILE_BACKEND": "cuda"}))
    assert "ran:     ncu" in r.stdout and "ran:     nsys" in r.stdout and "skipped" not in r.stdout
    ncu_cmd = logged(tmp_path)[0]
    assert V1 in ncu_cmd and ncu_cmd[ncu_cmd.index("--launch-count") + 1] == "7"
    r = run("run_all_profilers.sh", "v1", "--only", "rocprofv3", "--out", tmp_path / "b", tmp_path=tmp_path,
            env={"PROFILE_BACKEND": "cpu"})
    assert r.returncode == 0
    assert "skipped: rocprofv3 (needs an AMD (ROCm) GPU; this machine runs cpu)" in r.stdout


@pytest.mark.parametrize("n, folder", [(2, "version2_fused"), (3, "version3_triton"), (4, "version4_sdpa")])
def test_every_version_folder_profiles_its_own_version(tmp_path, n, folder):
    if not (REPO / folder / f"tiny_llama_v{n}.py").exists():
        pytest.skip(f"v{n} not written yet")
    ok(run("run_all_profilers.sh", "--only", "ncu", "--out", tmp_path / "o", tmp_path=tmp_path,
           cwd=REPO / folder, env={"PROFILE_BACKEND": "cuda"}))
    assert str(REPO / folder / f"tiny_llama_v{n}.py") in logged(tmp_path)[0]


def test_run_all_rejects_unknown_profiler_names(tmp_path):
    r = run("profiling/run_all_profilers.sh", "v1", "--only", "vtune", tmp_path=tmp_path)
    assert r.returncode == 2 and "unknown profiler 'vtune'" in r.stderr


def test_wrappers_are_executable_and_strict():
    for script in [*REPO.glob("profiling/run_*.sh"), REPO / "run_all_profilers.sh"]:
        assert os.access(script, os.X_OK), script
    assert not [*REPO.glob("version*/run_all_profilers.sh")], "one run_all_profilers.sh, at the root"
    for script in REPO.glob("profiling/*.sh"):
        text = script.read_text()
        assert "set -euo pipefail" in text or "lib.sh" in text, script
