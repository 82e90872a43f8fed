"""`python -m analysis_tools compare` on the JSON of benchmarks/compare_versions.py:
synthetic files (old rows with medians only, new rows with the whole result), the
real NVIDIA H200 comparison (tests/fixtures/h200), one real tiny CPU comparison, bad files."""
import importlib
import json
from pathlib import Path

import pytest

from conftest import REPO
from test_analysis import assert_png, cli  # the same in-process command line and PNG check

H200_MEDIUM = REPO / "tests/fixtures/h200/compare_medium.json"
DEVICE = {"type": "cuda", "name": "NVIDIA H200", "backend": "cuda", "arch": "sm_90", "torch": "2.11.0+cu130"}
CONFIG = {"vocab_size": 1000, "hidden_dim": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4,
          "ffn_dim": 176, "max_seq_len": 64, "norm_eps": 1e-5, "rope_theta": 10000.0, "tie_embeddings": False}


def row(version, mode, repeat, tokens_per_s, fwd=10.0, bwd=20.0, exit_code=0):
    """One compare_versions row as the script wrote it before it kept whole results."""
    if exit_code:
        return {"version": version, "mode": mode, "repeat": repeat, "exit_code": exit_code,
                "error": "error: gradient-flow guard failed"}
    compiled = mode != "eager"
    return {"version": version, "mode": mode, "repeat": repeat, "exit_code": 0, "wall_s": 1.0,
            "tokens_per_s": tokens_per_s, "step_ms": fwd + bwd + 2.0,
            "phases_ms": {"forward": fwd, "backward": bwd, "optimizer": 2.0},
            "achieved_tflops": 1.0, "mfu_datasheet": 0.1, "peak_tflops_datasheet": 989.4,
            "peak_memory_mb": 500.0 + repeat, "final_loss": 6.9, "options": {}, "device": DEVICE,
            "config": CONFIG, "run": {"preset": "tiny", "batch_size": 4, "seq_len": 64, "precision": "bf16",
                                      "data": "synthetic", "compile": compiled,
                                      "compile_mode": {"eager": None, "compile": "default"}.get(mode, mode)}}


def synthetic(tmp_path, rows, name="compare_tiny.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "compare_versions/1", "created": "2026-11-22T00:00:00+00:00",
                                "command": "python benchmarks/compare_versions.py", "runs": rows}))
    return path


def test_rows_become_one_median_run_per_version_and_mode(tmp_path):
    from analysis_tools import compare_runs
    rows = [row("v1", "eager", 0, 1000.0), row("v4", "eager", 0, 2000.0),
            row("v4", "reduce-overhead", 0, 5000.0), row("v1", "eager", 1, 1100.0),
            row("v4", "eager", 1, 2200.0), row("v4", "reduce-overhead", 1, 0, exit_code=5),
            row("v4", "eager", 2, 2400.0)]
    out = compare_runs([synthetic(tmp_path, rows)], out_dir=tmp_path / "plots")
    table = out["table"].set_index("run")
    assert list(table.index) == ["v1 tiny bf16", "v4 tiny bf16", "v4 tiny bf16 +reduce-overhead"]
    assert table["tokens/s"].tolist() == pytest.approx([1050.0, 2200.0, 5000.0])  # medians
    assert table["speedup"].tolist() == pytest.approx([1.0, 2200 / 1050, 5000 / 1050])
    assert table["repeats"].tolist() == [2, 3, 1]
    assert table.loc["v4 tiny bf16", "spread %"] == pytest.approx(400 / 2200 * 100)
    assert table["peak MB"].tolist() == pytest.approx([500.5, 501.0, 500.0])
    assert table["final loss"].tolist() == pytest.approx([6.9] * 3)
    assert set(table["guard"]) == {"passed (exit code)"}  # inferred, and labelled so
    assert out["flags"] == []  # no per-run guard record is not "guard missing" here
    assert any("reduce-overhead repeat 1 failed (exit code 5" in n for n in out["notes"])
    assert any("exits 5 when the guard fails" in n for n in out["notes"])
    names = sorted(p.name for p in out["plots"])  # no per-step losses: no loss plot
    assert names == ["compare_tiny_memory.png", "compare_tiny_step_time.png", "compare_tiny_throughput.png"]
    for p in out["plots"]:
        assert_png(p)


def test_flags_still_fire_from_phases(tmp_path):
    from analysis_tools import compare_runs
    rows = [row("v1", "eager", 0, 1000.0), row("v3", "eager", 0, 3000.0, fwd=10.0, bwd=1.0),
            row("v4", "eager", 0, 2000.0), row("v4", "eager", 1, 2000.0, fwd=10.0, bwd=9.0)]
    out = compare_runs([synthetic(tmp_path, rows)], plots=False)
    # every row passed the guard (exit code 0): a fast backward is a launch-bound run, not a cut graph
    assert not any("forward" in f for f in out["flags"])
    assert any("launch-bound" in n and "v3 tiny bf16" in n for n in out["notes"])
    mixed = rows[:1] + [dict(row("v4", "eager", 0, 2000.0), run={**rows[0]["run"], "precision": "fp32"})]
    assert any("different precisions" in f for f in
               compare_runs([synthetic(tmp_path, mixed, "mixed.json")], plots=False)["flags"])


def test_stored_results_are_preferred(tmp_path):
    """Rows that keep the whole results dict give loss curves and the real guard record."""
    from analysis_tools import compare_runs
    from harness.results import validate
    rows = []
    for version, tps, guard in (("v1", 1000.0, 57), ("v4", 3000.0, 0)):
        r = row(version, "eager", 0, tps)
        timing = {p: {"median": ms, "p10": ms, "p90": ms} for p, ms in
                  {**r["phases_ms"], "step": r["step_ms"]}.items()}
        r["result"] = {"schema_version": 1, "version": version, "created": "", "command": "", "git_commit": None,
                       "config": CONFIG, "run": r["run"], "options": {}, "device": DEVICE,
                       "losses": [7.0, 6.95, 6.9], "timing_ms": timing, "throughput": {"tokens_per_s": tps},
                       "flops": {"achieved_tflops": 1.0}, "mfu": {"value": 0.1, "peak_tflops": 989.4},
                       "memory": {"peak_allocated_mb": 400.0},
                       "gradient_guard": {"passed": guard > 0, "checked_params": guard}, "warnings": []}
        validate(r["result"])
        r["final_loss"] = 99.0  # the stored result wins over the row's own copy
        rows.append(r)
    out = compare_runs([synthetic(tmp_path, rows)], out_dir=tmp_path)
    assert out["table"]["final loss"].tolist() == pytest.approx([6.9, 6.9])
    assert "guard" not in out["table"].columns
    assert any(f.startswith("v4 tiny bf16: gradient-flow guard missing or failed") for f in out["flags"])
    assert [p.name for p in out["plots"]][-1] == "compare_tiny_loss.png"
    assert_png(out["plots"][-1])


def test_real_h200_file_on_the_command_line(tmp_path):
    proc = cli("compare", H200_MEDIUM, "--out-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA H200" in proc.stdout and "v4 medium bf16 +compile" in proc.stdout
    assert "hf medium bf16 +compile" in proc.stdout and "passed (exit code)" in proc.stdout
    report = json.loads(H200_MEDIUM.read_text())
    v4 = next(s for s in report["summary"] if s["version"] == "v4" and s["mode"] == "compile")
    assert f"{v4['tokens_per_s']:,.0f}" in proc.stdout  # the same median compare_versions printed
    assert f"{v4['x_v1_eager']:.2f}" in proc.stdout
    for kind in ("throughput", "step_time", "memory"):
        assert_png(tmp_path / f"compare_medium_{kind}.png")


@pytest.mark.slow
def test_compare_versions_stores_whole_results(tmp_path, capsys):
    """A real (tiny, CPU) comparison keeps each run's result; compare reads it directly."""
    from analysis_tools import compare_runs
    script = importlib.import_module("benchmarks.compare_versions")
    out = tmp_path / "compare_tiny.json"
    assert script.main(["--preset", "tiny", "--device", "cpu", "--versions", "v1", "--repeats", "1",
                        "--num-steps", "3", "--warmup-steps", "1", "--output", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["runs"][0]["result"]["gradient_guard"]["checked_params"] > 0
    assert saved["runs"][0]["tokens_per_s"] == saved["runs"][0]["result"]["throughput"]["tokens_per_s"]
    assert script.main(["--report", str(out)]) == 0  # the old keys still make the saved table
    result = compare_runs([out], plots=False)["results"][0]
    assert len(result["losses"]) == 3 and "passed_by_exit_code" not in result["gradient_guard"]


def paced(runs_paces):
    """compare_versions rows that carry only a host_pace reading: {(v, mode, repeat): (before, after)}."""
    return [{"version": v, "mode": m, "repeat": rep, "exit_code": 0,
             "result": {"host_pace": {"before_us": before, "after_us": after, "items": 20_000}}}
            for (v, m, rep), (before, after) in runs_paces.items()]


def test_a_process_whose_host_ran_slow_is_named_under_the_table(capsys):
    """Each run's reading is the slower of its two probes (a spell can come and go between
    them), over the fastest probe of the comparison (the machine's own pace, where a slow
    spell can cover the median): above SLOW_HOST, the run is named, with the reason."""
    script = importlib.import_module("benchmarks.compare_versions")
    runs = paced({("v1", "eager", 0): (2000, 2100), ("v3", "eager", 0): (4100, 4000),
                  ("v3", "eager", 1): (1900, 3000), ("v4", "eager", 0): (1950, 2000),
                  ("v4", "compile", 0): (2300, 2000)})
    runs.append({"version": "v2", "mode": "eager", "repeat": 0, "exit_code": 1, "error": "x"})  # failed
    slow = script.slow_hosts(runs)
    assert [(s["version"], s["mode"], s["repeat"]) for s in slow] == [("v3", "eager", 0), ("v3", "eager", 1)]
    assert slow[0]["pace_x"] == pytest.approx(4100 / 1900) and slow[1]["pace_x"] == pytest.approx(3000 / 1900)
    assert script.slow_hosts(runs[:2]) == []  # too few runs to know the machine's pace
    report = json.loads(H200_MEDIUM.read_text())
    script.print_report({**report, "slow_hosts": slow}, Path("compare_medium.json"))
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("host slow"))
    assert "v3 eager repeat 1 ran its Python 2.16x slower" in line and "not its code" in line


def test_a_spell_between_the_probes_shows_in_the_runs_own_steps(capsys):
    """Both probes at pace, yet more than half the steps slow: the run's median step over its
    fastest tenth (steps_x) above SLOW_SPELL names it too, and the words say which reading did.
    A record without host_pace is not read at all (sets measured before the probes)."""
    from harness.results import SLOW_SPELL, run_pace
    script = importlib.import_module("benchmarks.compare_versions")
    runs = paced({("v3", "eager", r): (1000, 1050) for r in range(4)})
    for run, (median, p10) in zip(runs, [(20.0, 19.9), (26.2, 20.9), (20.6, 20.0), (20.3, 20.0)]):
        run["result"]["timing_ms"] = {"step": {"median": median, "p10": p10}}
    slow = script.slow_hosts(runs)
    assert [s["repeat"] for s in slow] == [1] and 26.2 / 20.9 > SLOW_SPELL > 20.6 / 20.0
    assert slow[0]["steps_x"] == pytest.approx(26.2 / 20.9) and slow[0]["pace_x"] == pytest.approx(1.05)
    assert run_pace({"timing_ms": {"step": {"median": 30.0, "p10": 20.0}}}) is None
    ddp = {"host_pace": {"before_us": 1000, "after_us": 1000}, "run": {"world_size": 2},
           "timing_ms": {"step": {"median": 30.0, "p10": 20.0}}}
    assert run_pace(ddp)["steps_x"] is None  # its steps wait on the other process's communication
    report = json.loads(H200_MEDIUM.read_text())
    script.print_report({**report, "slow_hosts": slow}, Path("compare_medium.json"))
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("host slow"))
    assert ("v3 eager repeat 2 had its median step 1.25x its fastest tenth's "
            "(a slow spell between its host's probes)") in line


def test_a_row_counts_its_processes_at_pace_where_any_ran_at_pace_else_all():
    """One rule for every table that counts a comparison's processes (harness.results):
    a row whose every process ran slow keeps them all, and a number."""
    from harness.results import at_pace_else_all, run_key
    runs = [{"version": "v3", "mode": "eager", "repeat": r} for r in range(3)]
    slow = {("v3", "eager", 1)}
    assert at_pace_else_all(runs, lambda run: run_key(run) in slow) == [runs[0], runs[2]]
    assert at_pace_else_all(runs, lambda run: True) == runs
    assert at_pace_else_all([], lambda run: True) == []


def test_a_row_is_the_median_of_its_processes_at_pace(tmp_path, monkeypatch, capsys):
    """--rerun-slow-host eager: an eager pair whose process ran on a slow host runs again until
    as many ran at pace as its repeats, at most twice as many processes; its medians take
    only those at pace (the slow one stays in min..max), or all where none ran at pace.
    A mode not named (compile here) is not run again."""
    script = importlib.import_module("benchmarks.compare_versions")
    ran = []
    slow_ones = {("v1", "eager", 0), ("v2", "compile", 0)} | {("v2", "eager", r) for r in range(6)}

    def fake_run(name, mode, repeat, common, workdir):
        ran.append((name, mode, repeat))
        slow = (name, mode, repeat) in slow_ones
        r = row(name, mode, repeat, (500.0 if slow else 1000.0) + repeat)
        r["result"] = {"host_pace": {"before_us": 1000.0, "after_us": 2500.0 if slow else 1100.0,
                                     "items": 20_000}}
        return r

    monkeypatch.setattr(script, "run_one", fake_run)
    out = tmp_path / "compare_tiny.json"
    assert script.main(["--preset", "tiny", "--device", "cpu", "--versions", "v1,v2",
                        "--modes", "eager,compile", "--repeats", "1", "--eager-repeats", "2",
                        "--rerun-slow-host", "eager", "--num-steps", "2", "--warmup-steps", "1",
                        "--output", str(out)]) == 0
    assert [k for k in ran if k[1] == "eager" and k[2] >= 2] == [("v1", "eager", 2), ("v2", "eager", 2),
                                                                ("v2", "eager", 3)]
    report = json.loads(out.read_text())
    summary = {(s["version"], s["mode"]): s for s in report["summary"]}
    v1 = summary[("v1", "eager")]  # repeats 1 and 2 at pace, repeat 0 (500 tok/s) left out
    assert (v1["runs"], v1["counted"], v1["tokens_per_s"], v1["tokens_per_s_min"]) == (3, 2, 1001.5, 500.0)
    v2 = summary[("v2", "eager")]  # never at pace: four processes (twice its repeats), all counted
    assert (v2["runs"], v2["counted"], v2["tokens_per_s"]) == (4, 4, 501.5)
    assert summary[("v2", "compile")]["runs"] == 1  # not a mode to run again
    printed = capsys.readouterr().out
    assert "median of the 2 of 3 at pace" in printed
    assert "v1 eager repeat 1 ran its Python 2.50x slower" in printed and "left out of its row's median" in printed
    assert "v2 eager repeat 1" in printed and "counted, since none" in printed


@pytest.mark.parametrize("content, needle", [
    ('{"schema": "compare_versions/1", "runs": [{"version": "v1"}]}', "row 0 has no 'mode'"),
    ('{"schema": "compare_versions/1", "runs": []}', "no successful run"),
    ('{"schema": "compare_versions/9", "runs": []}', "is not compare_versions/1"),
    ('{"schema": "compare_versions/1"}', "without a 'runs' list"),
    ('{"schema": "compare_versions/1", "runs": [', "not valid JSON"),
])
def test_bad_file_is_one_line_and_exit_2(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = cli("compare", path, "--no-plots")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def test_broken_stored_result_is_bad_input(tmp_path):
    broken = row("v1", "eager", 0, 1000.0)
    broken["result"] = {"schema_version": 1, "version": "v1"}
    proc = cli("compare", synthetic(tmp_path, [broken]), "--no-plots")
    assert proc.returncode == 2 and "row 0's stored result: results are missing keys" in proc.stderr


@pytest.mark.slow
def test_compare_versions_resume_runs_only_the_missing_runs(tmp_path, monkeypatch, capsys):
    """A comparison cut after its first run leaves an incomplete JSON with that run;
    --resume runs only the missing one and marks the file complete; other settings are refused."""
    script = importlib.import_module("benchmarks.compare_versions")
    out = tmp_path / "compare_tiny.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--versions", "v1,v4", "--modes", "eager",
            "--repeats", "1", "--num-steps", "2", "--warmup-steps", "1", "--output", str(out)]
    real_run_one, started = script.run_one, []

    def cut_after_one(*args, **kwargs):
        if started:
            raise KeyboardInterrupt  # the machine's time limit, say
        started.append(args[:2])
        return real_run_one(*args, **kwargs)

    monkeypatch.setattr(script, "run_one", cut_after_one)
    with pytest.raises(KeyboardInterrupt):
        script.main(argv)
    partial = json.loads(out.read_text())
    assert partial["complete"] is False and len(partial["runs"]) == 1

    proc = cli("compare", out, "--no-plots")  # the JSON is already usable
    assert proc.returncode == 0, proc.stderr
    code = script.main([*argv[:-6], "--num-steps", "3", *argv[-4:], "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "num_steps 2, not 3" in err[0], err
    assert json.loads(out.read_text()) == partial  # untouched

    ran = []
    monkeypatch.setattr(script, "run_one", lambda *a, **k: ran.append(a[:2]) or real_run_one(*a, **k))
    assert script.main([*argv, "--resume"]) == 0
    saved = json.loads(out.read_text())
    assert saved["complete"] is True
    assert ran == [pair for pair in (("v1", "eager"), ("v4", "eager")) if pair not in started]
    assert sorted((r["version"], r["repeat"]) for r in saved["runs"]) == [("v1", 0), ("v4", 0)]
    assert saved["runs"][0] == partial["runs"][0] and saved["ceiling"]["spread_percent"] is not None
    assert {s["version"] for s in saved["summary"]} == {"v1", "v4"}
    ran.clear()  # resuming a complete comparison runs nothing
    assert script.main([*argv, "--resume"]) == 0 and ran == []


def test_eager_rows_run_more_rounds_than_compiled_ones(tmp_path, monkeypatch):
    """--eager-repeats 3 --repeats 1: each eager row is the median of three processes (the host
    paces them), each compiled row of one, interleaved; the rows keep their spread."""
    script = importlib.import_module("benchmarks.compare_versions")
    ran = []

    def fake_run(name, mode, repeat, common, workdir):
        ran.append((name, mode, repeat))
        return row(name, mode, repeat, 1000.0 + 100 * repeat)

    monkeypatch.setattr(script, "run_one", fake_run)
    out = tmp_path / "compare_tiny.json"
    assert script.main(["--preset", "tiny", "--device", "cpu", "--versions", "v1,v2",
                        "--modes", "eager,compile", "--repeats", "1", "--eager-repeats", "3",
                        "--num-steps", "2", "--warmup-steps", "1", "--output", str(out)]) == 0
    assert sorted(ran) == sorted([("v1", "eager", r) for r in range(3)] + [("v2", "eager", r) for r in range(3)]
                                 + [("v2", "compile", 0)])
    summary = {(s["version"], s["mode"]): s for s in json.loads(out.read_text())["summary"]}
    assert summary[("v2", "eager")]["runs"] == 3 and summary[("v2", "eager")]["tokens_per_s_max"] == 1200.0
    assert summary[("v2", "compile")]["runs"] == 1
