"""analysis_tools: compare, ceilings, roofline, sweep, report, regress - on a real
CPU run of V1 and on synthetic variants of it (planted problems included).
The memory model has its own file, test_analysis_memory.py."""
import contextlib
import copy
import io
import json
import textwrap
import types

import pandas as pd
import pytest
import torch

from conftest import REPO, run_cli
from harness import flops
from harness.config import PRESETS
from harness.results import load, write_atomic

H100 = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module")
def v1_path(tmp_path_factory):
    """One real V1 run on the CPU, shared by every test of this module."""
    out = tmp_path_factory.mktemp("runs") / "v1.json"
    proc = run_cli([REPO / "version1_baseline/tiny_llama_v1.py", "--preset", "tiny", "--num-steps", "8",
                    "--warmup-steps", "2", "--output", out, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def v1(v1_path):
    return load(v1_path)


def variant(base: dict, path, **changes) -> dict:
    """A copy of a results dict with dotted keys changed ('timing_ms.backward.median'),
    written (and validated) to `path`."""
    r = copy.deepcopy(base)
    r.pop("_path", None)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = r
        for key in parents:
            node = node[key]
        node[leaf] = value
    write_atomic(path, r)
    return r


def faster(base, path, version="v4", factor=2.0, **changes):
    t = base["timing_ms"]
    return variant(base, path, version=version,
                   **{"throughput.tokens_per_s": base["throughput"]["tokens_per_s"] * factor,
                      "timing_ms.step.median": t["step"]["median"] / factor,
                      "timing_ms.forward.median": t["forward"]["median"] / factor,
                      "timing_ms.backward.median": t["backward"]["median"] / factor, **changes})


def analysis(*args, **kw):
    """The command line in a fresh process, as an attendee types it."""
    return run_cli(["-m", "analysis_tools", *map(str, args)], **kw)


def cli(*args):
    """The same command line in this process (no interpreter start-up: faster)."""
    from analysis_tools.__main__ import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def assert_one_line_error(proc):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def assert_png(path):
    assert path.exists() and path.stat().st_size > 5000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- compare
def steady(base: dict, path) -> dict:
    """The real run with textbook timings (on a busy 2-core CPU a tiny model's
    backward can time faster than its forward, which compare rightly flags)."""
    return variant(base, path, **{"timing_ms.forward.median": 10.0, "timing_ms.backward.median": 20.0,
                                  "timing_ms.optimizer.median": 2.0, "timing_ms.step.median": 33.0,
                                  "timing_ms.step.p10": 32.0, "timing_ms.step.p90": 34.0})


def test_compare_table_speedup_and_plots(v1, tmp_path):
    from analysis_tools import compare_runs
    v1_real, v1 = v1, steady(v1, tmp_path / "v1.json")
    v4 = faster(v1, tmp_path / "v4.json", factor=2.0)
    out = compare_runs([v1, v4], out_dir=tmp_path / "plots")
    table = out["table"]
    assert list(table["run"]) == ["v1 tiny fp32", "v4 tiny fp32"]
    for column in ("tokens/s", "speedup", "fwd ms", "bwd ms", "opt ms", "MFU %", "peak RSS MB", "final loss"):
        assert column in table.columns
    assert table["speedup"].tolist() == pytest.approx([1.0, 2.0])
    assert table["final loss"].iloc[0] == pytest.approx(v1["losses"][-1])
    assert out["flags"] == []
    assert len(out["plots"]) == 4
    for p in out["plots"]:
        assert_png(p)
    real = compare_runs([v1_real], plots=False)["table"]  # the unmodified CPU run
    assert real["tokens/s"].iloc[0] == pytest.approx(v1_real["throughput"]["tokens_per_s"])


@pytest.mark.parametrize("planted, needle", [
    ({"timing_ms.backward.median": 0.01, "gradient_guard": {"passed": None, "checked_params": 0}},
     "faster than forward"),
    ({"gradient_guard": {"passed": False, "checked_params": 0}}, "gradient-flow guard"),
    ({"run.precision": "bf16"}, "different precisions"),
    ({"run.seq_len": 16}, "different model configs or shapes"),
    ({"mfu.value": 1.7}, "above 100%"),
])
def test_compare_flags_planted_problems(v1, tmp_path, planted, needle):
    from analysis_tools.compare import suspicious
    v1 = steady(v1, tmp_path / "v1.json")
    assert suspicious([v1, faster(v1, tmp_path / "good.json")]) == []
    bad = faster(v1, tmp_path / "bad.json", **planted)
    flags = suspicious([v1, bad])
    assert any(needle in f for f in flags), flags


def test_a_fast_backward_is_a_cut_graph_only_where_the_guard_did_not_pass(v1, tmp_path):
    from analysis_tools.compare import compare_runs
    v1 = steady(v1, tmp_path / "v1.json")
    launch_bound = faster(v1, tmp_path / "v3.json", version="v3", **{"timing_ms.backward.median": 0.01})
    out = compare_runs([v1, launch_bound], plots=False)
    assert out["flags"] == []
    assert any("launch-bound" in n and "v3 tiny fp32" in n for n in out["notes"])


def test_compare_cli_loud_flags_and_strict(v1, v1_path, tmp_path):
    cut = faster(v1, tmp_path / "v3.json", version="v3", factor=3.0,
                 **{"timing_ms.backward.median": 0.001,
                    "gradient_guard": {"passed": None, "checked_params": 0}})
    assert cut["version"] == "v3"
    proc = analysis("compare", v1_path, tmp_path / "v3.json", "--out-dir", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "SUSPICIOUS" in proc.stdout and "faster than forward" in proc.stdout
    assert "v3 tiny fp32" in proc.stdout and "3.00" in proc.stdout
    strict = analysis("compare", v1_path, tmp_path / "v3.json", "--no-plots", "--strict")
    assert strict.returncode == 1


INTERPRETED = ("the Triton kernels ran in Triton's CPU interpreter (TRITON_INTERPRET=1): a "
               "correctness demo, not a speed measurement")  # what V3 records on a CPU


def test_an_interpreted_run_is_a_note_with_no_speedup_not_an_alarm(v1, tmp_path, monkeypatch):
    """A workshop on a CPU: V3 in Triton's interpreter, seconds a step and busy-machine spread."""
    from analysis_tools import compare
    runs = tmp_path / "workshop"
    base = steady(v1, runs / "v1.json")
    faster(base, runs / "v2.json", version="v2", factor=1.2)
    variant(base, runs / "v3.json", version="v3", warnings=[INTERPRETED],
            **{"throughput.tokens_per_s": 50.0, "timing_ms.step.median": 2630.0,
               "timing_ms.step.p10": 1000.0, "timing_ms.step.p90": 4000.0})
    figures = {}
    monkeypatch.setattr(compare, "save_figure", lambda fig, out_dir, name: figures.setdefault(name, fig))
    out = compare.compare_runs([runs], out_dir=tmp_path / "plots")
    table = out["table"].set_index("run")
    assert table.loc["v3 tiny fp32", "speedup"] == "interpreted"
    assert table.loc["v2 tiny fp32", "speedup"] == pytest.approx(1.2)
    assert "peak RSS MB" in table.columns and "peak MB" not in table.columns  # a CPU measures RSS
    assert out["flags"] == []
    assert any("v3 tiny fp32" in n and "interpreter" in n for n in out["notes"]), out["notes"]
    text = compare.format_report(out)
    assert "SUSPICIOUS" not in text
    assert "     50 interpreted " in next(line for line in text.splitlines() if line.startswith("v3"))
    # the step-time plot draws V3 on a panel of its own: its bar does not flatten the others
    panels = [ax for ax in figures["compare_workshop_step_time.png"].axes if ax.patches]
    assert len(panels) == 2 and [t.get_text() for t in panels[1].get_xticklabels()] == ["v3"]


def test_two_comparisons_in_one_folder_keep_their_own_plots(v1, tmp_path):
    from analysis_tools import compare_runs
    workshop, exercise = tmp_path / "workshop", tmp_path / "exercise"
    steady(v1, workshop / "v1.json")
    steady(v1, exercise / "v1_tiny.json")
    faster(v1, exercise / "v2_tiny.json", version="v2")
    first = compare_runs([workshop], out_dir=tmp_path / "plots")["plots"]
    second = compare_runs([exercise / "v1_tiny.json", exercise / "v2_tiny.json"],
                          out_dir=tmp_path / "plots")["plots"]
    assert first[0].name == "compare_workshop_throughput.png"
    assert second[0].name == "compare_v1_tiny_v2_tiny_throughput.png"
    assert not set(first) & set(second)


def test_bad_input_is_one_line(v1, tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema_version": 1,')
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**{k: v for k, v in v1.items() if k != "_path"}, "schema_version": 0}))
    assert_one_line_error(analysis("compare", corrupt, "--no-plots"))  # a real process
    for path in (tmp_path / "missing.json", corrupt, old):
        assert_one_line_error(cli("compare", path, "--no-plots"))
    assert_one_line_error(cli("report", corrupt, "--out-dir", tmp_path / "r"))
    assert_one_line_error(cli("regress", "--baseline", old, corrupt))
    assert_one_line_error(cli("memory", tmp_path / "missing.json"))
    assert_one_line_error(cli("roofline", "--ceilings", corrupt, "--out-dir", tmp_path))
    assert_one_line_error(cli("sweep", "--version", "v9", "--preset", "tiny"))
    assert_one_line_error(cli("compare"))  # argparse errors are one line too


# ---------------------------------------------------------------- ceilings
def test_ceiling_probes_on_cpu():
    from harness.probes import measure_copy_gbs, measure_matmul_tflops
    assert measure_matmul_tflops("cpu", "fp32") > 0
    assert measure_copy_gbs("cpu", 1 << 22) > 0


def test_gemm_shapes_times_each_kind_of_input():
    """--gemm-shapes: one TFLOP/s per kind of input (a product's speed depends on its numbers)."""
    from benchmarks.ceilings import GEMM_INPUTS, gemm_shapes
    rows = gemm_shapes("cpu", {"tiny": (16, 16, 16)})
    assert list(rows) == ["tiny"] and len(rows["tiny"]) == len(GEMM_INPUTS) > 3
    assert all(tflops > 0 for tflops in rows["tiny"])
    half = GEMM_INPUTS["half zeros"]((64, 64), "cpu")
    assert half.dtype == torch.bfloat16 and 0.3 < (half == 0).float().mean() < 0.7


@pytest.mark.slow
def test_ceilings_probe_writes_json_that_the_reader_prints(tmp_path):
    proc = run_cli(["-m", "benchmarks.ceilings", "--device", "cpu", "--precisions", "fp32",
                    "--out-dir", tmp_path])
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "ceilings.json").read_text())
    assert data["measured"]["matmul_tflops"]["fp32"] > 0 and data["measured"]["copy_gbs"] > 0
    assert data["datasheet"] is None and "H100" in data["datasheet_table"]
    assert "matmul fp32" in proc.stdout
    read = cli("ceilings", "--out-dir", tmp_path)  # analysis_tools only reads the file
    assert read.returncode == 0, read.stderr
    assert "matmul fp32" in read.stdout and "ceilings.json" in read.stdout
    missing = cli("ceilings", tmp_path / "none.json")
    assert_one_line_error(missing)
    assert "python -m benchmarks.ceilings" in missing.stderr


# ---------------------------------------------------------------- roofline
def test_analytic_ops_agree_with_the_harness_flop_model():
    from analysis_tools.ops import training_ops
    cfg, b, t = PRESETS["medium"].model, 16, 512
    explicit = training_ops(cfg, b, t, "bf16", "explicit").set_index("op")
    flash = training_ops(cfg, b, t, "bf16", "flash").set_index("op")
    gemm = explicit[explicit["category"] == "gemm"]["flops"].sum()
    assert gemm == 6 * flops.matmul_params(cfg) * b * t
    # explicit attention + GEMMs = the harness's model FLOPs (no causal discount)
    assert gemm + explicit.loc["attention (explicit T x T)", "flops"] == flops.step_flops(cfg, b, t)
    kernel = flops.attention_kernel_flops(cfg, b, t)
    assert flash.loc["attention (flash, causal)", "flops"] == kernel["forward"] + kernel["backward"]
    # not materialising T x T scores is what moves attention right on the roofline
    assert (flash.loc["attention (flash, causal)", "intensity"]
            > 3 * explicit.loc["attention (explicit T x T)", "intensity"])
    assert explicit.loc["rmsnorm", "intensity"] < 2 and explicit.loc["lm_head", "intensity"] > 50


@pytest.mark.slow
def test_roofline_with_ceilings_kernels_and_runs(v1, v1_path, tmp_path):
    from analysis_tools import draw_roofline
    gpu = faster(v1, tmp_path / "v4_gpu.json", device={**v1["device"], **H100},
                 **{"run.precision": "bf16", "flops.achieved_tflops": 12.5})
    ceilings = tmp_path / "ceilings.json"
    ceilings.write_text(json.dumps({"device": H100, "measured": {
        "matmul_tflops": {"bf16": 780.0}, "copy_gbs": 3000.0}}))
    kernels = tmp_path / "kernels.csv"
    pd.DataFrame({"name": ["sm90_gemm", "softmax", "elementwise_mul"],
                  "category": ["gemm", "attention", "elementwise"], "calls": [10, 5, 5],
                  "total_time_us": [100.0, 40.0, 10.0], "share": [0.67, 0.27, 0.06],
                  "flops": [5e10, 1e8, None], "bytes": [2e8, 4e8, None]}).to_csv(kernels, index=False)
    out = draw_roofline([gpu], ceilings_path=ceilings, kernel_tables={"v1": kernels}, out_dir=tmp_path)
    labels = [c["label"] for c in out["ceilings"]]
    assert any("H100 datasheet" in l for l in labels) and any("measured" in l for l in labels)
    k = out["kernels"].set_index("name")
    assert k.loc["sm90_gemm", "intensity"] == pytest.approx(250)
    assert k.loc["sm90_gemm", "achieved_tflops"] == pytest.approx(500)
    assert pd.isna(k.loc["elementwise_mul", "intensity"])  # no FLOPs: tolerated, not plotted
    assert out["steps"]["achieved_tflops"].iloc[0] == pytest.approx(12.5)
    assert_png(out["plot"])
    out_cli = cli("roofline", v1_path, "--measure-ops", "--kernels", f"v1={kernels}",
                   "--out-dir", tmp_path / "cli")
    assert out_cli.returncode == 0, out_cli.stderr
    assert "attention (flash, causal)" in out_cli.stdout and "SDPA math backend" in out_cli.stdout
    assert "1 kernels have no FLOPs" in out_cli.stdout
    assert_png(tmp_path / "cli" / "roofline.png")
    measured = pd.read_csv(tmp_path / "cli" / "roofline_measured_ops.csv")
    assert (measured["achieved_tflops"] > 0).all()


def test_roofline_rejects_a_table_without_names(tmp_path):
    bad = tmp_path / "k.csv"
    bad.write_text("kernel,time\nfoo,1\n")
    assert_one_line_error(cli("roofline", "--kernels", f"x={bad}", "--out-dir", tmp_path))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_roofline_measuring_ops_on_a_missing_gpu_is_one_line(tmp_path):
    """With ceilings already at hand nothing else touches the device before the op timings."""
    ceilings = tmp_path / "ceilings.json"
    ceilings.write_text(json.dumps({"device": H100, "measured": {
        "matmul_tflops": {"bf16": 780.0}, "copy_gbs": 3000.0}}))
    assert_one_line_error(cli("roofline", "--preset", "tiny", "--measure-ops", "--device", "cuda",
                              "--ceilings", ceilings, "--out-dir", tmp_path))


# ---------------------------------------------------------------- sweep
FAKE_VERSION = textwrap.dedent("""
    # Stands in for a version CLI: parses the real flags, fails like the real one.
    import json, sys
    sys.path.insert(0, {repo!r})
    from training.cli import build_parser
    from harness.results import write_atomic
    args = build_parser("v1", "fake").parse_args(sys.argv[1:])
    if args.batch_size >= 8:
        print("error: out of memory (peak allocated 79.1 GiB) at batch 8", file=sys.stderr)
        sys.exit(3)
    r = json.load(open({template!r}))
    r["run"].update(batch_size=args.batch_size, seq_len=args.seq_len)
    r["throughput"]["tokens_per_s"] = 1000.0 * args.batch_size
    r["memory"] = {{"peak_allocated_mb": 100.0 * args.batch_size}}
    write_atomic(args.output, r)
""")


def test_sweep_records_failed_points_and_plots(v1_path, tmp_path):
    fake = tmp_path / "fake_version.py"
    fake.write_text(FAKE_VERSION.format(repo=str(REPO), template=str(v1_path)))
    proc = cli("sweep", "--version", fake, "--preset", "tiny", "--batch-sizes", "2,4,8",
                    "--grad-checkpoint", "off,on", "--num-steps", "3", "--warmup-steps", "1",
                    "--out-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "sweep_fake_version_tiny"
    df = pd.read_csv(folder / "sweep.csv")
    assert len(df) == 6
    assert (df[df["batch_size"] == 8]["status"] == "oom").all()
    assert df[df["batch_size"] == 8]["message"].str.contains("out of memory").all()
    ok = df[df["status"] == "ok"].sort_values("batch_size")
    assert ok["tokens_per_s"].tolist() == [2000.0, 2000.0, 4000.0, 4000.0]
    for name in ("sweep_throughput.png", "sweep_memory.png"):
        assert_png(folder / name)


@pytest.mark.slow
def test_sweep_runs_the_real_cli(tmp_path, capsys):
    from analysis_tools import run_sweep, sweep_grid
    points = sweep_grid("tiny", batch_sizes=[2], seq_lens=[16])
    df = run_sweep("v1", "tiny", points, tmp_path, num_steps=3, warmup_steps=1, say=lambda *_: None)
    assert df["status"].tolist() == ["ok"], df["message"].tolist()
    r = load(df["results"][0])
    assert (r["run"]["batch_size"], r["run"]["seq_len"]) == (2, 16)
    assert "v1_b2_s16_default | step     1/3" in capsys.readouterr().out  # the point's progress


def fake_points(v1_path, interrupt_at=None):
    """run_version standing in for each point's process: writes the point's result, or stops
    as Ctrl-C does at point number interrupt_at."""
    calls = []

    def run_version(name, cmd):
        calls.append(name)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        r = load(v1_path)
        r.pop("_path", None)
        batch = int(cmd[cmd.index("--batch-size") + 1])
        r["run"]["batch_size"], r["throughput"]["tokens_per_s"] = batch, 1000.0 * batch
        write_atomic(cmd[cmd.index("--output") + 1], r)
        return 0, ""
    return run_version


def test_an_interrupted_sweep_leaves_the_previous_sweep_whole(v1_path, tmp_path, monkeypatch):
    from analysis_tools import sweep
    argv = ["sweep", "--preset", "tiny", "--num-steps", "3", "--warmup-steps", "1", "--out-dir", tmp_path]
    monkeypatch.setattr(sweep, "run_version", fake_points(v1_path))
    assert cli(*argv, "--batch-sizes", "2,4").returncode == 0
    folder = tmp_path / "sweep_v1_tiny"
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert {p.name for p in before} >= {"sweep.csv", "sweep_throughput.png", "sweep_memory.png"}
    monkeypatch.setattr(sweep, "run_version", fake_points(v1_path, interrupt_at=2))
    stopped = cli(*argv, "--batch-sizes", "4,8")
    assert stopped.returncode == 130 and stopped.stderr.strip() == "error: interrupted"
    after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert after == before  # no new point beside the old ones, the old table and plots
    assert [p.name for p in tmp_path.iterdir()] == ["sweep_v1_tiny"]  # no staging left
    monkeypatch.setattr(sweep, "run_version", fake_points(v1_path))
    assert cli(*argv, "--batch-sizes", "8").returncode == 0  # a complete sweep replaces it whole
    assert pd.read_csv(folder / "sweep.csv")["batch_size"].tolist() == [8]
    assert len(list((folder / "points").iterdir())) == 1


def test_a_gpu_sized_sweep_on_a_cpu_says_so_first(monkeypatch):
    from analysis_tools import sweep
    from training import trainer
    monkeypatch.setattr(trainer.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trainer.probes, "cpu_matmul_flops", lambda: 100e9)  # a 100 GFLOP/s CPU
    note = sweep.cpu_warning("v1", "medium", sweep.grid("medium", [8, 16]), 20, 5)
    assert note.startswith("sweep: 2 points on a CPU; the largest, batch 16 x seq 512: v1: preset "
                           "medium is sized for a GPU"), note
    assert sweep.cpu_warning("v1", "tiny", sweep.grid("tiny"), 20, 5) is None


def test_a_negative_batch_size_in_a_sweep_is_named_in_one_line():
    out = cli("sweep", "--batch-sizes", "-4,8")
    assert_one_line_error(out)
    assert "--batch-sizes: expected positive integers, got '-4,8'" in out.stderr


# ---------------------------------------------------------------- report
def test_report_is_self_contained(v1, tmp_path):
    runs = tmp_path / "runs"
    variant(v1, runs / "v1.json")
    faster(v1, runs / "v4.json")
    variant(v1, runs / "v3.json", version="v3", warnings=[INTERPRETED])
    sweep = runs / "sweep_v1_tiny"
    sweep.mkdir()
    pd.DataFrame([{"batch_size": 2, "seq_len": 32, "status": "ok", "tokens_per_s": 10.0,
                   "results": "x.json"}]).to_csv(sweep / "sweep.csv", index=False)
    proc = cli("report", runs, "--out-dir", tmp_path / "report")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 6
    assert 'src="http' not in html and "<script" not in html and "<link" not in html  # offline
    assert "v4 tiny fp32" in html and "Sweep: sweep_v1_tiny" in html
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "| run | precision | tokens/s |" in md and "![roofline](roofline.png)" in md
    for text in (html, md):  # the note that says why V3 has no speed-up
        assert "Note: v3 tiny fp32: the Triton kernels ran in Triton" in text and "CPU interpreter" in text


# ---------------------------------------------------------------- regress
def test_regress_passes_on_identical_and_names_regressions(v1, v1_path, tmp_path):
    same = cli("regress", "--baseline", v1_path, v1_path)
    assert same.returncode == 0, same.stderr
    assert "no regression" in same.stdout
    slow = faster(v1, tmp_path / "slow.json", version="v1", factor=0.8)
    fat = variant(v1, tmp_path / "fat.json", **{"memory.peak_rss_mb": v1["memory"]["peak_rss_mb"] * 1.5})
    cut = variant(v1, tmp_path / "cut.json", gradient_guard={"passed": False, "checked_params": 0})
    assert fat and cut and slow
    for name, needle in (("slow", "throughput"), ("fat", "memory"), ("cut", "gradient guard")):
        proc = cli("regress", "--baseline", v1_path, tmp_path / f"{name}.json")
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert "REGRESSION" in proc.stderr and needle in proc.stderr
    loose = cli("regress", "--baseline", v1_path, tmp_path / "slow.json", "--tolerance", "throughput=0.5")
    assert loose.returncode == 0, loose.stderr
    assert_one_line_error(cli("regress", "--baseline", v1_path, v1_path, "--tolerance", "speed"))
    other = variant(v1, tmp_path / "other.json", **{"run.batch_size": 64})
    assert other
    assert_one_line_error(cli("regress", "--baseline", v1_path, tmp_path / "other.json"))


def test_regress_checks_a_row_whose_options_changed(v1):
    """A new default (a new switch) still publishes the same row: a slower run with other
    options is a regression, named with the options it differs in. Where the baseline has a
    run with the new options too, that is the one it is checked against."""
    from analysis_tools.regress import check
    base = {**v1, "options": {"fused_norm": True}}
    slow = {**v1, "options": {"fused_norm": True, "fused_qkv_grad": True},
            "throughput": {**v1["throughput"], "tokens_per_s": v1["throughput"]["tokens_per_s"] * 0.8}}
    table, notes = check([base], [slow])
    assert "REGRESSED" in set(table[table["metric"] == "throughput"]["status"])
    assert any("fused_qkv_grad: (none) -> True" in n for n in notes), notes
    # A fusion switched off beside its default in both sets: each checked against its own run.
    table, notes = check([base, slow], [base, slow])
    assert set(table["status"]) == {"ok"} and not notes
    # Two baseline runs that differ from the new one only in options: which row it is, is unknown.
    other = {**v1, "options": {"fused_norm": False}}
    new = {**v1, "options": {"fused_norm": True, "triton_swiglu": True}}
    with pytest.raises(Exception, match="nothing to compare"):
        check([base, other], [new])


def test_regress_judges_a_row_measured_over_several_processes_against_its_spread(v1):
    """A comparison row keeps the tokens/s of each process: a drop inside the spread those
    processes showed is noise (ok), one beyond it is still a regression."""
    from analysis_tools.regress import check
    speed = v1["throughput"]["tokens_per_s"]

    def row(median, repeats):
        return {**v1, "throughput": {"tokens_per_s": median}, "repeats": {"n": len(repeats),
                                                                         "tokens_per_s": repeats}}
    noisy = row(speed, [0.85 * speed, speed, 1.1 * speed])  # 25% spread
    table, _ = check([noisy], [row(0.82 * speed, [0.8 * speed, 0.82 * speed, 0.83 * speed])])
    throughput = table[table["metric"] == "throughput"].iloc[0]
    assert throughput["status"] == "ok" and throughput["tolerance %"] == pytest.approx(25)
    table, _ = check([noisy], [row(0.7 * speed, [0.69 * speed, 0.7 * speed, 0.71 * speed])])
    assert "REGRESSED" in set(table[table["metric"] == "throughput"]["status"])
    table, _ = check([v1], [{**v1, "throughput": {"tokens_per_s": 0.9 * speed}}])  # one process each
    assert "REGRESSED" in set(table[table["metric"] == "throughput"]["status"])


def test_regress_says_which_rows_ran_on_a_slow_host(tmp_path):
    """The loader reads each process's host_pace as compare_versions does: a row's median
    leaves out its processes whose host ran slow where any ran at pace (regress says how
    many), and takes them all where none did (regress says the row moves with its host)."""
    from analysis_tools.compare import load_runs
    from analysis_tools.regress import check_regressions
    from conftest import REPO
    published = REPO / "docs/published/h200/compare_medium.json"
    report = json.loads(published.read_text())
    report["runs"] = [row for row in report["runs"] if row["repeat"] < 3]  # 3 processes a row
    slow = {("v3", "eager", 0): 2.0, ("v3", "eager", 1): 1.9,
            **{("v4", "eager", r): 1.8 + r / 10 for r in range(3)}}
    for row in report["runs"]:
        after = 1000 * slow.get((row["version"], row["mode"], row["repeat"]), 1.05)
        row["result"]["host_pace"] = {"before_us": 1000.0, "after_us": after, "items": 20_000}
        if (row["version"], row["mode"], row["repeat"]) == ("v3", "eager", 2):
            fast = row["tokens_per_s"]
    new = tmp_path / "compare_medium.json"
    new.write_text(json.dumps(report))
    eager = {r["version"]: r for r in load_runs([new])[0] if not r["run"]["compile"]}
    assert eager["v3"]["repeats"]["n"] == 1 and eager["v3"]["_host_left_out"] == 2
    assert eager["v3"]["throughput"]["tokens_per_s"] == pytest.approx(fast)
    assert eager["v4"]["repeats"]["n"] == 3 and [s["pace_x"] for s in eager["v4"]["_host_slow"]] == pytest.approx([1.8, 1.9, 2.0])
    notes = check_regressions([published], [new])["notes"]
    assert "v3 medium bf16: 2 process(es) whose host ran slow left out of its median" in " ".join(notes)
    v4 = [n for n in notes if n.startswith("v4 medium bf16: the host ran slow in all 3 process")]
    assert len(v4) == 1 and "(the slowest ran its Python 2.00x slower than the comparison's fastest)" in v4[0]


def test_regress_reads_a_setting_older_results_lack_as_its_value_then(v1):
    """Results from before --shard-optimizer record no such setting: they are the rows of
    runs that record it off, and not those of runs that record it on."""
    from analysis_tools.regress import row_key
    old = json.loads(json.dumps(v1))
    old["run"].pop("shard_optimizer", None)
    old["distributed"] = {"kind": "ddp", "bucket_cap_mb": 25}
    off = json.loads(json.dumps(old))
    off["run"]["shard_optimizer"] = False
    off["distributed"]["shard_optimizer"] = False
    on = json.loads(json.dumps(off))
    on["run"]["shard_optimizer"] = True
    on["distributed"]["shard_optimizer"] = True
    assert row_key(old) == row_key(off) != row_key(on)
    on["run"]["shard_optimizer"] = on["distributed"]["shard_optimizer"] = False
    on["run"]["reduce_after_backward"] = on["distributed"]["reduce_after_backward"] = True
    assert row_key(old) != row_key(on)  # and so for the all-reduce after the backward


@pytest.mark.parametrize("name", ["compare_medium.json", "compare_small.json", "compare_large.json"])
def test_the_published_set_passes_its_own_compare(name):
    """The numbers the README quotes carry no do-not-quote line: master weights in the best
    mode are a labelled column, and every row's gradient guard passed."""
    from analysis_tools.compare import compare_runs
    out = compare_runs([REPO / "docs" / "published" / "h200" / name], plots=False)
    assert out["flags"] == []


@pytest.mark.parametrize("argv", [
    ["memory", "--batch-size", "-2"], ["memory", "--seq-len", "0"], ["roofline", "--batch-size", "-4"],
    ["roofline", "--seq-len", "x"], ["sweep", "--num-steps", "3", "--warmup-steps", "3"],
    ["sweep", "--warmup-steps", "-1"], ["memory", "--preset", "huge"],
    *([["roofline", "--device", "cuda", "--measure-ops"]] if not __import__("torch").cuda.is_available() else []),
])
def test_every_analysis_command_refuses_impossible_input_in_one_line(argv):
    out = cli(*argv)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: "), out.stderr
