"""An attendee's first hour on a fresh CPU laptop: install, run, read, analyse.

Each test stands for one trap a newcomer would otherwise fall into: the first
command must install what every version needs, scripts must say where to run
them from, slow runs must show progress at once, results must not overwrite
each other, and the analysis commands must explain what they cannot show.
"""
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, as_if_under_torchrun, load_version, run_cli

V1 = REPO / "version1_baseline" / "tiny_llama_v1.py"
V3 = REPO / "version3_triton" / "tiny_llama_v3.py"


# ---------------------------------------------------------------- install and CI
def test_the_runtime_install_brings_triton_and_ci_runs_the_workshop_first():
    install = (REPO / "setup" / "install.sh").read_text()
    # triton for every install (not only `test`), and only where none is importable
    assert "if ! \"$VPY\" -c 'import triton'" in install
    assert '[ "$extra" = "test" ] && ! "$VPY" -c \'import triton\'' not in install
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    steps = [line.split('" ', 1)[1] for line in ci if line.startswith("stage ")]  # stage "NAME" CMD
    assert steps == ['make workshop ARGS="--quick"', "make test", "make test-slow"]


# ---------------------------------------------------------------- environment
def test_environment_check_says_when_this_is_not_the_projects_python(monkeypatch):
    sys.path.insert(0, str(REPO / "setup"))
    import check_environment as ce

    monkeypatch.setattr(ce.sys, "prefix", "/usr")
    monkeypatch.setattr(ce, "project_venv", lambda: REPO / "tests" / "fixtures" / "fake_venv")
    (REPO / "tests" / "fixtures" / "fake_venv" / "bin").mkdir(parents=True, exist_ok=True)
    try:
        (REPO / "tests" / "fixtures" / "fake_venv" / "bin" / "python").touch()
        check = ce.check_project_env()
        assert check.status == "warn" and "not in the project's environment" in check.detail
        assert "source .venv/bin/activate" in check.fix
        monkeypatch.setattr(ce.sys, "prefix", str(REPO / "tests" / "fixtures" / "fake_venv"))
        assert ce.check_project_env().status == "ok"
    finally:
        import shutil
        shutil.rmtree(REPO / "tests" / "fixtures" / "fake_venv")


# ---------------------------------------------------------------- one run
def test_help_shows_real_defaults_only():
    out = " ".join(run_cli([V1, "--help"]).stdout.split())
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "(default from preset)" in out and "(default: 10)" in out


@pytest.mark.slow
def test_short_run_adapts_its_warm_up_and_prints_progress_from_the_first_step(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli([V1, "--preset", "tiny", "--num-steps", "3", "--output", out])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    # a line at once; the estimate comes from step 2, since step 1 pays the one-time set-up
    assert lines[0].startswith("step     1/3") and "first step" in lines[0] and "left" not in lines[0]
    assert lines[1].startswith("step     2/3") and "left" in lines[1]
    result = json.loads(out.read_text())
    assert result["run"]["warmup_steps"] == 1
    assert not any("warm-up" in w for w in result["warnings"])
    # an ordinary file: readable by others (umask permitting), not 0600
    assert stat.S_IMODE(os.stat(out).st_mode) & 0o044 == 0o044 & ~_umask()


@pytest.mark.slow
def test_a_run_that_cannot_time_a_warm_step_or_use_graphs_says_so(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli([V1, "--preset", "tiny", "--num-steps", "1", "--output", out])
    assert proc.returncode == 0, proc.stderr
    assert "v1: no warm-up step" in proc.stdout.splitlines()[0]
    assert any("no warm-up step" in w for w in json.loads(out.read_text())["warnings"])
    from training import cli, trainer
    args = cli.build_parser("v1", "").parse_args(["--compile", "--compile-mode", "reduce-overhead"])
    notes = trainer.start_notes(cli.settings_from_args("v1", args, []), trainer.torch.device("cpu"))
    assert notes == [n for n in notes if "graphs need a GPU" in n] and notes


def test_a_gpu_sized_run_on_a_cpu_says_so_before_its_first_step(monkeypatch):
    from training import cli, trainer
    monkeypatch.setattr(trainer.probes, "cpu_matmul_flops", lambda: 100e9)  # a 100 GFLOP/s CPU
    args = cli.build_parser("v1", "").parse_args(["--preset", "medium"])
    settings = cli.settings_from_args("v1", args, ["--preset", "medium"])
    settings.command = "python version1_baseline/tiny_llama_v1.py --preset medium"
    note = trainer.gpu_sized_note(settings, trainer.torch.device("cpu"), (14 * 2**30, 11 * 2**30))
    # 8.1 TFLOP a step at 100 GFLOP/s: over a minute a step, over an hour for 50 (a floor:
    # the first step's line gives the measured pace)
    assert note.startswith("v1: preset medium is sized for a GPU: on this CPU its matrix products "
                           "alone take 81 s a step, 50 steps over 67.7 min")
    assert "predicted peak memory 14.0 GiB of 11.0 GiB available" in note
    assert note.endswith("sized for a CPU: python version1_baseline/tiny_llama_v1.py --preset tiny")
    tiny = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args([]), [])
    assert trainer.gpu_sized_note(tiny, trainer.torch.device("cpu")) is None
    assert trainer.gpu_sized_note(settings, trainer.torch.device("cuda")) is None


def test_a_noisy_run_says_so_and_a_cpu_run_is_never_called_launch_bound(tmp_path, monkeypatch, capsys):
    """Step times spread 4x (a busy CPU): the summary line and the JSON say "noisy" with the
    spread. A CPU computes what it launches: a fast backward there is no launch-bound run."""
    from training import cli, trainer

    def busy(clocks, grad_accum):
        t = real_timing(clocks, grad_accum)
        step, fwd = t["step"]["median"], t["forward"]["median"]
        t["step"] = {**t["step"], "p10": step / 2, "p90": step * 2}
        t["backward"] = {**t["backward"], "median": fwd / 2}
        return t

    real_timing = trainer._timing
    monkeypatch.setattr(trainer, "_timing", busy)
    argv = ["--preset", "tiny", "--num-steps", "2", "--output", str(tmp_path / "r.json")]
    settings = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args(argv), argv)
    result = trainer.run(settings, load_version("v1").build_model)
    summary = [line for line in capsys.readouterr().out.splitlines() if line.startswith("v1: ")][-1]
    assert "| noisy: steps spread 4.0x (p90/p10" in summary
    assert result["noisy"] == {"value": True, "p90_over_p10": pytest.approx(4.0), "threshold": 1.5}
    assert not any("launch-bound" in w for w in result["warnings"]), result["warnings"]


def test_a_cpu_run_predicted_not_to_fit_is_refused_before_its_model_exists(tmp_path, monkeypatch,
                                                                           capsys):
    """The memory model (analysis_tools.memory) against the machine's available memory:
    exit 3 in one line, where the kernel would kill the run mid-step (exit 137)."""
    from training import cli, trainer

    monkeypatch.setattr(trainer.measure, "available_bytes", lambda: 8 * 2**30)  # a 8 GiB laptop
    monkeypatch.setattr(trainer, "build", lambda *a: pytest.fail("the model was built"))
    out = tmp_path / "r.json"
    argv = ["--batch-size", "100000", "--seq-len", "64", "--device", "cpu", "--output", str(out)]
    assert cli.main("v1", load_version("v1").build_model, argv=argv) == 3
    error = capsys.readouterr().err
    assert re.fullmatch(r"error: predicted peak memory \d+\.\d GiB \(batch 100000 x seq 64, fp32\) is "
                        r"more than the 8\.0 GiB this machine has available: try a smaller "
                        r"--batch-size .*\n", error), error
    assert not out.exists()
    # the medium preset (15 GB resident, measured) is predicted above 12 GiB: no 16 GB laptop has it
    argv = ["--preset", "medium"]
    medium = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args(argv), argv)
    peak, available = trainer.cpu_memory(medium, "fp32")
    assert peak > 12 * 2**30 and available == 8 * 2**30


def test_a_long_first_step_is_announced_and_its_line_estimates_the_run(monkeypatch, capsys):
    """A GPU-sized step on a CPU takes minutes: a line says it is running, and its own line
    gives the time left at the measured pace instead of waiting for step 2."""
    from training import cli, trainer

    class Clock:  # one measured step of 65 s
        def elapsed_ms(self, start, end):
            return 65_000.0

    argv = ["--preset", "medium", "--num-steps", "50"]
    settings = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args(argv), argv)
    line = trainer._progress_line(0, settings, [7.0], [Clock()], 8192)
    assert line.endswith("| about 53.1 min left"), line
    # a tiny model standing for a GPU-sized one, stopped as its first step starts
    monkeypatch.setattr(trainer, "gpu_sized_note", lambda *a: "v1: preset medium is sized for a GPU")
    monkeypatch.setattr(trainer.dev, "StepClock", lambda device: (_ for _ in ()).throw(KeyboardInterrupt))
    tiny = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args([]), [])
    with pytest.raises(KeyboardInterrupt):
        trainer.run(tiny, load_version("v1").build_model)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "v1: preset medium is sized for a GPU"
    assert lines[-1] == "v1: step 1 running (its line, with the measured pace, follows when it ends)"


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_v3_on_a_cpu_says_it_is_interpreted_and_runs_a_short_default(monkeypatch):
    from training import cli
    args = cli.build_parser("v3", "").parse_args([])
    assert cli.settings_from_args("v3", args, [], interpreted=True).num_steps == cli.INTERPRETER_NUM_STEPS
    assert cli.settings_from_args("v3", args, []).num_steps == cli.DEFAULT_NUM_STEPS
    assert "interpreter" in cli.INTERPRETER_NOTE


def test_default_result_names_hold_the_switches_and_profiled_runs_go_to_their_folder():
    from training import cli
    from version2_fused import tiny_llama_v2 as v2

    def name(*argv, version="v2", spec=v2.SPEC):
        parser = cli.build_parser(version, "", spec.add_arguments)
        args = parser.parse_args(list(argv))
        settings = cli.settings_from_args(version, args, list(argv))
        return Path(cli.default_output(settings, parser, args))

    assert name().name == "v2_tiny.json"
    assert name("--no-fused-qkv").name == "v2_tiny_no-fused-qkv.json"
    assert name("--compile", "--compile-mode", "reduce-overhead").name == \
        "v2_tiny_compile_compile-mode-reduce-overhead.json"
    assert name("--num-steps", "7", "--quiet").name == "v2_tiny.json"  # run control: same run
    v3 = load_version("v3")  # a switch that is off by default, named as switched on
    assert name("--recompute-rope", version="v3", spec=v3.SPEC).name == "v3_tiny_recompute-rope.json"
    profiled = name("--profile", "pytorch")
    assert profiled.parts[-4:] == ("profiles", "v2", "pytorch", "results.json")


def test_a_data_parallel_run_never_replaces_the_single_process_result(monkeypatch):
    from training import cli

    def name(*argv):
        parser = cli.build_parser("v1", "")
        args = parser.parse_args(list(argv))
        return Path(cli.default_output(cli.settings_from_args("v1", args, list(argv)), parser, args)).name

    assert name() == "v1_tiny.json"
    as_if_under_torchrun(monkeypatch)
    assert name() == "v1_tiny_ddp2.json"
    assert name("--fsdp") == "v1_tiny_fsdp2.json"
    # the sharded optimizer: by default with master weights (unnamed), or asked for either way
    assert name("--optimizer", "master") == "v1_tiny_optimizer-master_ddp2.json"
    assert name("--shard-optimizer") == "v1_tiny_shard-optimizer_ddp2.json"
    assert name("--optimizer", "master", "--no-shard-optimizer") == \
        "v1_tiny_optimizer-master_no-shard-optimizer_ddp2.json"


@pytest.mark.parametrize("output, needle", [
    ("taken.json/x.json", "taken.json is a file, not a folder"),  # a file where a folder must be
    ("folder.json", "a folder of that name is in the way"),
    ("/proc/nope/x.json", "no file can be made in /proc"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch, capsys,
                                                                    output, needle):
    """Found out only when the results are written, the whole run would be lost."""
    from training import cli, trainer

    if output.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    (tmp_path / "taken.json").write_text("previous")
    (tmp_path / "folder.json").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer, "run", lambda *a: pytest.fail("the run started"))
    assert cli.main("v1", load_version("v1").build_model, argv=["--output", output]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --output {output}: ") and needle in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json", "taken.json"]


def test_v3_in_the_interpreter_leaves_a_nan_to_the_loops_one_line():
    """numpy, under Triton's interpreter, warns of each overflow; the loop's NaN line suffices."""
    import warnings

    v3 = load_version("v3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v3.silence_interpreter_warnings()
        warnings.warn_explicit("overflow encountered in exp", RuntimeWarning, "interpreter.py", 725,
                               module="triton.runtime.interpreter")
        warnings.warn_explicit("elsewhere", RuntimeWarning, "x.py", 1, module="harness.x")
    assert [str(w.message) for w in caught] == ["elsewhere"]


# ---------------------------------------------------------------- make workshop
def test_workshop_streams_progress_replaces_what_finished_and_keeps_what_failed(tmp_path, monkeypatch, capsys):
    from training import workshop

    # v1 runs for real (seconds); v2 fails: its previous result stays, and the run says so
    monkeypatch.setattr(workshop, "VERSIONS", {k: workshop.VERSIONS[k] for k in ("v1", "v2")})
    real_run = workshop.run_version
    ran = {}

    def v2_fails(version, cmd, env=None):
        ran[version] = env
        return real_run(version, cmd, env) if version == "v1" else (2, "v2 broke")

    monkeypatch.setattr(workshop, "run_version", v2_fails)
    (tmp_path / "v1.json").write_text("{}")
    (tmp_path / "v2.json").write_text("previous")
    assert workshop.main(["--quick", "--out-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "    v1 | step     1/3" in out  # the child's progress, as it trains
    assert "do not show the GPU lessons" in out and "docs/RESULTS.md" in out
    assert "CPU threads per version: " in out
    assert "  new: v1" in out and "kept from an earlier run: v2 (from unreadable)" in out
    assert "FAILED v2: exit 2: v2 broke" in err
    v1 = json.loads((tmp_path / "v1.json").read_text())
    assert v1["version"] == "v1"
    assert f"--output {tmp_path / 'v1.json'}" in v1["command"]  # where it is, not where it was staged
    assert (tmp_path / "v2.json").read_text() == "previous"
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.*"))  # staging folder removed
    if "OMP_NUM_THREADS" not in os.environ:  # the tiny preset runs on one thread
        assert ran["v1"] == {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("argv, needle", [
    (["--preset", "tinny"], "invalid choice: 'tinny'"),
    (["--quick", "--", "--batch-size", "-2"], "--batch-size must be > 0"),
    (["--quick", "--", "--no-triton-attention"], "unrecognized arguments: --no-triton-attention"),
    (["--num-steps", "0"], "--num-steps must be > 0"),
])
def test_workshop_checks_the_shared_flags_once_before_any_version_starts(tmp_path, monkeypatch, capsys,
                                                                         argv, needle):
    from training import workshop

    def never(*_):
        raise AssertionError("a version started")

    monkeypatch.setattr(workshop, "run_version", never)
    (tmp_path / "v1.json").write_text("previous")
    assert workshop.main(["--out-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "v1.json").read_text() == "previous"


def test_an_interrupted_workshop_is_one_line_and_keeps_the_previous_results(tmp_path, monkeypatch, capsys):
    from training import workshop

    (tmp_path / "v1.json").write_text("previous")

    def interrupted(version, cmd, env=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(workshop, "run_version", interrupted)
    assert workshop.main(["--quick", "--out-dir", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0]
    assert (tmp_path / "v1.json").read_text() == "previous"


def test_a_workshop_with_an_unwritable_out_dir_stops_before_any_version_trains(tmp_path, monkeypatch,
                                                                              capsys):
    from training import workshop

    monkeypatch.setattr(workshop, "run_version", lambda *a: pytest.fail("a version started"))
    (tmp_path / "README.md").write_text("a file")
    assert workshop.main(["--quick", "--out-dir", str(tmp_path / "README.md")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "a file of that name is in the way; name a folder" in err[0], err
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no staging folder either


def test_a_quick_workshop_never_replaces_the_full_runs_results(tmp_path, monkeypatch, capsys):
    from training import workshop

    monkeypatch.setattr(workshop, "REPO", tmp_path)  # no version scripts there: none runs
    (tmp_path / "results" / "workshop").mkdir(parents=True)
    (tmp_path / "results" / "workshop" / "v1.json").write_text("a full run")
    workshop.main(["--quick"])
    assert f"results: {tmp_path}/results/workshop-quick/ (" in capsys.readouterr().out
    assert (tmp_path / "results" / "workshop-quick").is_dir()
    assert (tmp_path / "results" / "workshop" / "v1.json").read_text() == "a full run"
    with pytest.raises(SystemExit):
        workshop.main(["--help"])
    assert "results/workshop-quick/ with --quick" in " ".join(capsys.readouterr().out.split())


def test_the_readmes_workshop_sample_shows_the_lines_the_workshop_prints(monkeypatch):
    from training import cli, trainer, workshop

    sample = (REPO / "README.md").read_text().split("```text\nworkshop: ", 1)[1].split("```")[0]

    class Clock:  # a first step of a few milliseconds
        def elapsed_ms(self, start, end):
            return 1.0

    argv = ["--num-steps", "30"]
    settings = cli.settings_from_args("v1", cli.build_parser("v1", "").parse_args(argv), argv)
    first = trainer._progress_line(0, settings, [5.5781], [Clock()], 128)
    assert f"\n    v1 | {first}\n" in sample, first
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = workshop.cpu_threads("tiny")[1]
    line = next(s.strip() for s in sample.splitlines() if "CPU threads" in s)
    assert threads.startswith(line.removesuffix(" ...)")), (threads, line)
    assert "\n\nresults: /path/to/repo/results/workshop/ (" in sample and "\n  new: v1, v2, v3, v4\n" in sample


# ---------------------------------------------------------------- analysis
def test_roofline_without_ceilings_says_how_to_get_a_roof_and_uses_measured_ones(tmp_path, monkeypatch):
    from analysis_tools import roofline

    monkeypatch.setenv("ANALYSIS_OUT", str(tmp_path / "nowhere"))
    out = roofline.draw_roofline(preset="tiny", precision="fp32", out_dir=tmp_path)
    assert out["ceilings"] == [] and "python -m benchmarks.ceilings" in out["note"]
    device = roofline.this_device_name("cpu")
    (tmp_path / "ceilings.json").write_text(json.dumps({
        "device": {"name": device}, "measured": {"matmul_tflops": {"fp32": 1.0}, "copy_gbs": 40.0}}))
    out = roofline.draw_roofline(preset="tiny", precision="fp32", out_dir=tmp_path)
    assert out["note"] is None and "measured" in out["ceilings"][0]["label"]
    assert "ceilings.json" in out["ceilings"][0]["label"]


def test_the_analysis_folder_is_the_repositorys_from_any_folder(monkeypatch):
    """Notebooks run in exercises/notebooks/: the ceilings measured from the root are found there."""
    from analysis_tools.common import out_dir_default

    monkeypatch.delenv("ANALYSIS_OUT", raising=False)
    monkeypatch.chdir(REPO / "exercises" / "notebooks")
    assert out_dir_default() == REPO / "results" / "analysis"


def test_a_kernel_table_the_project_wrote_parses_back(tmp_path):
    from profiling import kernel_table as kt
    from profiling import parse

    table = kt.KernelTable(rows=[kt._row("aten::mm", 3, 30.0, None, None, "pytorch")],
                           source="pytorch", files=[], notes=[])
    path = kt.write_csv(kt._finish(table.rows, "pytorch", [], []), tmp_path / "kernel_table.csv")
    for tool in (None, "pytorch"):
        back = parse(path, tool)
        assert [r.name for r in back.rows] == ["aten::mm"] and back.rows[0].calls == 3
    proc = run_cli(["-m", "profiling", "parse", path])
    assert proc.returncode == 0 and "aten::mm" in proc.stdout


def test_regress_says_how_to_make_a_baseline_and_prints_readable_values(tmp_path):
    from analysis_tools.common import AnalysisError
    from analysis_tools.regress import check_regressions, display_table

    with pytest.raises(AnalysisError, match="cp results/workshop"):
        check_regressions([tmp_path / "baseline"], [tmp_path])
    table = __import__("pandas").DataFrame([
        {"run": "v1", "metric": "gradient guard", "baseline": "passed, 21 params",
         "new": "passed, 21 params", "change %": None, "tolerance %": None, "status": "ok"},
        {"run": "v1", "metric": "throughput", "baseline": 16030.4, "new": 16100.0,
         "change %": 0.43, "tolerance %": 5.0, "status": "ok"}])
    shown = display_table(table)
    assert list(shown["new"]) == ["passed, 21 params", "16,100 tok/s"]


# ---------------------------------------------------------------- texts
def test_comments_and_docs_name_what_a_reader_can_open():
    """A comment or a doc names a source a reader can find (the README names AMD's
    TinyTransformer workshop), never one only its authors knew."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.sh"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if name.startswith("docs/published/") or name == "tests/test_first_hour.py":
            continue
        text = (REPO / name).read_text()
        for phrase in ("public precedent", "Seeds 0", "the issue's", "the precedent's"):
            assert phrase not in text, (name, phrase)


def test_exercise_texts_name_their_sources_and_hold_no_machine_notes():
    texts = {p: p.read_text() for p in [REPO / "docs" / "ANALYSIS.md",
                                         *(REPO / "exercises").rglob("*.md")]}
    for path, text in texts.items():
        for phrase in ("Seed 00", "seed 00", "Seeds 00", "$OUT/", "one call may last"):
            assert phrase not in text, (path, phrase)
    v1_1 = (REPO / "exercises" / "version1" / "01_operator_table.md").read_text()
    # The `_to_copy` answer derives its count (calls over the 3 profiled steps, copies per
    # parameter) instead of quoting one profile's numbers.
    copies = v1_1.split("## Instructor answers")[1].split("\n3. ")[1].split("\n4. ")[0]
    assert "_to_copy" in copies and "divided by 3" in copies and "per parameter" in copies
    assert not re.search(r"\b(139|141|423)\b", copies), copies
