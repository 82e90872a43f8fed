"""Published numbers come from their data: tools/publish.py --check, and the reproduce pipeline
(`bash benchmarks/reproduce.sh --quick`: tiny preset on the CPU) from rows to a published set."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import experiments  # noqa: E402
from tools import publish  # noqa: E402
from tools import published_blocks as blocks  # noqa: E402
from tools.published_format import PLACEHOLDER  # noqa: E402


def test_every_published_block_matches_its_data():
    """README.md, docs/RESULTS.md, the exercises and the version READMEs equal what
    docs/published/<gpu>/summary.json says (or the placeholder, without a set)."""
    proc = subprocess.run([sys.executable, "tools/publish.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("page", [REPO / "docs" / "RESULTS.md",
                                  *sorted((REPO / "docs" / "published").glob("*/RESULTS.md"))],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_a_results_page_reaches_its_file(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    assert targets
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, missing


def test_readme_quotes_no_measured_number_outside_a_block():
    text = publish.BLOCK.sub("", (REPO / "README.md").read_text())
    assert "<!-- published:readme-table -->" in (REPO / "README.md").read_text()
    assert not re.findall(r"\b\d{2,3},\d{3}\b", text), "a hand-copied throughput in README.md"


def test_every_row_is_named_once_in_the_manifest():
    """benchmarks/experiments.py names each training row: reproduce runs it (no row of its
    own), publish shows it in its block, and its flags are its version's."""
    from benchmarks.experiments import ROWS
    from harness.config import load_spec
    from training import cli
    summary = json.loads((REPO / "docs/published/h200/summary.json").read_text())
    # the scaling step runs on a machine with 2 or more GPUs, the switches step at the large
    # preset on a 64+ GiB GPU: a set made without one has none of that step
    assert {r.key for r in ROWS if r.step not in ("scaling", "switches")} <= set(summary["rows"])
    assert {r.block for r in ROWS} <= set(blocks.BLOCKS)
    # publishing reads which block shows a row from the manifest the measurements carry
    assert {r["block"] for r in summary["experiments"]["rows"]} <= set(blocks.BLOCKS)
    script = (REPO / "benchmarks/reproduce.sh").read_text()
    assert not re.search(r"^\s*(train|from_compare) (memory|levers|fusion|blocks|sdpa) ", script, re.M)
    for r in ROWS:
        spec = load_spec(r.version)
        cli.build_parser(r.version, "", spec.add_arguments).parse_args(["--preset", "medium", *r.flags])


def test_update_republishes_the_steps_run_again_and_keeps_the_rest(tmp_path, monkeypatch):
    """publish.py update: a re-run step replaces its part of a published set; every other
    part stays, and the set says what was re-measured when."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)  # no matplotlib run needed here
    pub, work = tmp_path / "h200", tmp_path / "work"
    shutil.copytree(REPO / "docs/published/h200", pub)
    before = json.loads((pub / "summary.json").read_text())
    report = json.loads((pub / "compare_small.json").read_text())
    report.update(created="2031-01-02T03:04:05+00:00", git_commit="abc1234")
    (work / "levers").mkdir(parents=True)
    (work / "compare_small.json").write_text(json.dumps(report))
    (work / "levers" / "opt_fused.json").write_text(json.dumps({"exit_code": 3, "error": "out of memory"}))
    (work / "analysis").mkdir()  # a table beside the rows: the analysis step's ceilings
    ceilings = {**before["ceilings"], "created": "2031-01-02T03:04:05+00:00", "git_commit": "abc1234"}
    (work / "analysis" / "ceilings.json").write_text(json.dumps(ceilings))
    publish.update(work, pub)
    after = json.loads((pub / "summary.json").read_text())
    earlier = [u for u in before.get("updated", [])
               if u["part"] not in ("compare_small", "ceilings", "levers/opt_fused")]
    assert after["updated"][:len(earlier)] == earlier
    assert [u["part"] for u in after["updated"][len(earlier):]] == ["compare_small", "ceilings",
                                                                    "levers/opt_fused"]
    assert after["ceilings"] == ceilings and json.loads((pub / "ceilings.json").read_text()) == ceilings
    assert after["updated"][len(earlier)]["git_commit"] == "abc1234"
    assert after["rows"]["levers/opt_fused"]["exit_code"] == 3
    assert {k: v for k, v in after["rows"].items() if k != "levers/opt_fused"} == {
        k: v for k, v in before["rows"].items() if k != "levers/opt_fused"}
    assert after["compare"]["medium"] == before["compare"]["medium"] and after["kernels"] == before["kernels"]
    page = (pub / "RESULTS.md").read_text()
    assert "| re-measured | compare_small, ceilings: 2031-01-02, commit `abc1234` |" in page
    assert any(line.startswith("| re-measured |") and "levers (1 row)" in line
               and line.endswith(": ?, commit `unknown` |") for line in page.splitlines())
    with pytest.raises(SystemExit, match="nothing re-measured"):
        publish.update(tmp_path / "empty", pub)


def scaling_result(template: dict, n: int, tokens_per_s: float, **distributed) -> dict:
    """A results JSON of the medium preset on n GPUs (DDP unless distributed says otherwise)."""
    r = json.loads(json.dumps(template))
    r["run"].update(world_size=n, global_batch_size=16 * n)
    r["throughput"]["tokens_per_s"] = tokens_per_s
    r["distributed"] = {"kind": "ddp", "world_size": n, "comm_priority": "high", **distributed} if n > 1 else None
    return r


def test_scaling_rows_show_their_efficiency_and_regress_row_by_row(tmp_path):
    """The scaling block divides each multi-GPU row by N x its own 1-GPU row; rows a machine
    could not run (4 GPUs on a 2-GPU machine) are left out; regress tells a lever's row
    (the normal-priority stream) from the default's, and step-rows hands it the rows."""
    from analysis_tools.regress import check
    from benchmarks.experiments import ROWS
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    made = {"scaling/v4_best_1gpu": scaling_result(template, 1, 400_000.0),
            "scaling/v4_best_ddp2": scaling_result(template, 2, 760_000.0,
                                                   communication={"per_step_ms": 1.25}),
            "scaling/v4_best_ddp2_normal_priority": scaling_result(template, 2, 740_000.0,
                                                                   comm_priority="normal"),
            "scaling/v4_compile_fsdp2": {"exit_code": 1, "error": "error: out of patience"}}
    summary = {"rows": {key: publish.compact(r) for key, r in made.items()},
               "experiments": experiments.manifest()}
    text = blocks.render("scaling", summary)
    # what the step lost (step x (1 - efficiency)) beside its all-reduces timed alone
    lost = summary["rows"]["scaling/v4_best_ddp2"]["step_ms"] * 0.05
    assert f"| V4 graphs + master weights, DDP x2 | 2 | 760,000 | 380,000 | 95.0% | +{lost:.2f} | 1.25 |" in text
    assert "`--comm-priority normal` | 2 | 740,000 | 370,000 | 92.5% |" in text
    assert "| V4 graphs + master weights, 1 GPU | 1 | 400,000 | 400,000 | 100.0% | - | - |" in text
    assert "exit 1: error: out of patience" in text and "x4" not in text
    failed = next(line for line in text.splitlines() if "out of patience" in line)
    assert failed.count("|") == text.splitlines()[0].count("|")  # a cell for every column
    assert "by `bash benchmarks/reproduce.sh scaling`" in text
    assert {r.baseline for r in ROWS if r.step == "scaling" and r.gpus > 1} == {
        r.name for r in ROWS if r.step == "scaling" and r.gpus == 1}
    (tmp_path / "rows.json").write_text(json.dumps(made))
    assert experiments.step_rows(tmp_path / "rows.json", "scaling", tmp_path / "out") == 0
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*.json"))]
    assert len(runs) == 3  # the failed row is no run to compare
    table, notes = check(runs, runs)
    assert (table["metric"] == "throughput").sum() == 3 and (table["status"] == "ok").all(), notes
    assert experiments.step_rows(tmp_path / "rows.json", "memory", tmp_path / "none") == 1


def test_summary_rows_are_remade_from_the_full_records(tmp_path):
    """A summary row is compact() of its record in rows.json: a field compact() learns later
    (or a number edited by hand) is made again from the record, and the set in the
    repository is already as compact() makes it."""
    shutil.copytree(REPO / "docs/published/h200", tmp_path / "h200")
    path = tmp_path / "h200" / "summary.json"
    assert publish.summary_as_compacted("h200", REPO / "docs/published") == \
        (REPO / "docs/published/h200/summary.json").read_text()
    s = json.loads(path.read_text())
    row = s["rows"]["scaling/v4_best_ddp2"]
    comm_alone, row["tokens_per_s"] = row.pop("comm_alone_ms"), 1.0
    path.write_text(json.dumps(s, indent=1) + "\n")
    again = json.loads(publish.summary_as_compacted("h200", tmp_path))["rows"]["scaling/v4_best_ddp2"]
    assert again["comm_alone_ms"] == comm_alone and again["tokens_per_s"] > 1.0
    assert publish.summary_as_compacted("h100", tmp_path) is None  # no such set


def test_each_machines_rows_keep_the_1gpu_run_measured_with_them(tmp_path, monkeypatch):
    """The 2-GPU rows come from one machine and the 4-GPU rows from another, each with its
    own 1-GPU runs: publishing the second keeps the first's efficiencies as they were."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    pub = tmp_path / "h200"
    shutil.copytree(REPO / "docs/published/h200", pub)
    rows = json.loads((pub / "rows.json").read_text())  # a row the scaling step no longer makes
    rows["scaling/v4_compile_ddp2_renamed"] = rows["scaling/v4_best_ddp2"]
    (pub / "rows.json").write_text(json.dumps(rows))
    for machine, n, one, many in (("two", 2, 400_000.0, 760_000.0), ("four", 4, 380_000.0, 1_368_000.0)):
        work = tmp_path / machine
        (work / "scaling").mkdir(parents=True)
        (work / "experiments.json").write_text(json.dumps(experiments.manifest()))
        for name, r in (("v4_best_1gpu", scaling_result(template, 1, one)),
                        (f"v4_best_ddp{n}", scaling_result(template, n, many))):
            (work / "scaling" / f"{name}.json").write_text(json.dumps(r))
        summary = publish.update(work, pub)
    assert summary["rows"]["scaling/v4_best_ddp2"]["baseline_tokens_per_s"] == 400_000.0
    assert "scaling/v4_compile_ddp2_renamed" not in json.loads((pub / "rows.json").read_text())
    text = blocks.render("scaling", summary)
    assert "| V4 graphs + master weights, 1 GPU | 1 | 380,000 |" in text
    assert "| V4 graphs + master weights, DDP x2 | 2 | 760,000 | 380,000 | 95.0% |" in text
    assert "| V4 graphs + master weights, DDP x4 | 4 | 1,368,000 | 342,000 | 90.0% |" in text
    assert "Measured on 2 x " in text and "Measured on 4 x " in text and "measured with it" in text


def test_the_docs_show_the_gpu_counts_another_gpu_model_measured(tmp_path, monkeypatch):
    """4 GPUs of another model (a set of its own, holding only the scaling step): the docs'
    scaling table shows its 4-GPU rows beside the quoted set's, captioned with their machine
    and divided by their own 1-GPU run; rows the quoted set has stay its own, and the quoted
    set's page shows its GPU model only."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    pub = tmp_path / "published"
    shutil.copytree(REPO / "docs/published/h200", pub / "h200")
    for name in ("summary.json", "rows.json"):  # the quoted set as if its machines had 2 GPUs
        data = json.loads((pub / "h200" / name).read_text())
        rows = data["rows"] if name == "summary.json" else data
        for key in [k for k in rows if k.startswith("scaling/") and "_ddp4" in k]:
            del rows[key]
        (pub / "h200" / name).write_text(json.dumps(data))
    work = tmp_path / "h100"
    (work / "scaling").mkdir(parents=True)
    (work / "experiments.json").write_text(json.dumps(experiments.manifest()))
    for name, n, rate in (("v4_best_1gpu", 1, 300_000.0), ("v4_best_ddp2", 2, 1.0),
                          ("v4_best_ddp4", 4, 1_080_000.0)):
        r = scaling_result(template, n, rate)
        r["device"]["name"] = "NVIDIA H100 80GB HBM3"
        (work / "scaling" / f"{name}.json").write_text(json.dumps(r))
    publish.publish_work(work, pub)  # a new set: docs/published/h100/
    own = publish.load_set("h200", pub)
    text = blocks.render("scaling", publish.with_other_machines(own, "h200", pub))
    assert "| V4 graphs + master weights, DDP x4 | 4 | 1,080,000 | 270,000 | 90.0% |" in text
    assert "Measured on 4 x NVIDIA H100 80GB HBM3" in text and "measured with it" in text
    assert "| V4 graphs + master weights, DDP x2 | 2 | 1 |" not in text  # the quoted set's row
    assert "x4" not in blocks.render("scaling", own)


def test_memory_switch_rows_show_speed_beside_the_default_and_peak_beside_v4_and_the_model(
        tmp_path, monkeypatch):
    """The switches step: V3 at the large preset with each memory switch, a row each (their
    preset travels in the listing reproduce reads), its speed against the step's default run,
    its peak against V4's best large run and the memory model's prediction that the step
    writes beside them."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)
    listing = subprocess.run([sys.executable, "-m", "benchmarks.experiments", "rows", "switches"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    fields = [line.split("\t") for line in listing]
    assert [f[0] for f in fields] == ["v3_large_best", "v3_large_best_no_fused_linear_ce",
                                      *(f"v3_large_best_{s}" for s in experiments.RECOMPUTATIONS),
                                      "v3_large_best_all"]
    assert {f[7] for f in fields} == {"large"} and fields[-1][-3:] == ["--recompute-rope", "--recompute-swiglu",
                                                                       "--recompute-norm"]
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    pub, work = tmp_path / "h200", tmp_path / "work"
    shutil.copytree(REPO / "docs/published/h200", pub)
    published = json.loads((pub / "summary.json").read_text())  # a set without the step yet
    published["rows"] = {k: r for k, r in published["rows"].items() if not k.startswith("switches/")}
    (pub / "summary.json").write_text(json.dumps(published))
    (work / "switches").mkdir(parents=True)
    (work / "experiments.json").write_text(json.dumps(experiments.manifest()))
    for name, peak in (("v3_large_best", 36_000.0), ("v3_large_best_recompute_norm", 30_000.0)):
        r = json.loads(json.dumps(template))
        r["memory"]["peak_allocated_mb"] = peak
        r["created"], r["git_commit"] = f"2031-01-0{int(peak) // 30_000}T00:00:00+00:00", f"c{int(peak)}"
        (work / "switches" / f"{name}.json").write_text(json.dumps(r))
    (work / "switches" / "v3_large_best_all.json").write_text(json.dumps({"exit_code": 3, "error": "out of memory"}))
    (work / "switches" / "memory_check.json").write_text(json.dumps(
        [{"run": "v3 large", "file": "v3_large_best_recompute_norm", "predicted MiB": 29_500.0, "error %": -1.7}]))
    summary = publish.update(work, pub)
    # the model's check has no date of its own: it has the newest of the rows it read
    assert {"part": "memory_switches", "created": "2031-01-01T00:00:00+00:00",
            "git_commit": "c30000"} in summary["updated"]
    default = summary["rows"]["switches/v3_large_best"]["tokens_per_s"]
    summary["rows"]["switches/v3_large_best_recompute_norm"]["tokens_per_s"] = 0.9 * default
    summary["compare"]["large"]["rows"] = [{"version": "v4", "mode": "reduce-overhead-master",
                                            "tokens_per_s": default / 1.1, "peak_memory_mb": 40_000.0}]
    text = blocks.render("v3-memory-switches", summary)
    line = next(t for t in text.splitlines() if "`--recompute-norm`" in t)
    # speed against the step's own default run (not V4's, from another run); peak against V4's
    assert "| 0.90x |" in line and "| 30,000 | 0.750x | 29,500 | -1.7% |" in line
    assert "| 1.00x |" in next(t for t in text.splitlines() if t.startswith("| V3 graphs + master weights"))
    assert "| the same, all three recomputations | exit 3: out of memory |" in text
    assert "recompute-rope" not in text
    failed = next(line for line in text.splitlines() if "exit 3" in line)
    assert failed.count("|") == text.splitlines()[0].count("|")  # a cell for every column


def test_host_probe_rows_show_what_the_gpu_waited_and_the_host_s_time():
    """The host step's rows keep their probe when published (publish.compact), and the block
    reads the GPU's wait as the step less the GPU's time for a step queued ahead; a row
    without a usable probe (the host waited, or none was taken) and a failed row say so."""
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    probed = {**template, "host_probe": {"steps": 8, "hold_ms": 60.0, "host_ms": 21.0, "gpu_ms": 19.5,
                                         "host_waited": False}}
    row = publish.compact(probed)
    assert row["host_probe"] == {"host_ms": 21.0, "gpu_ms": 19.5, "host_waited": False}
    waited = publish.compact({**probed, "host_probe": {**probed["host_probe"], "host_waited": True}})
    keys = ["host/v3_compile", "host/v3_compile_triton_launcher", "host/v4_compile"]
    summary = {"experiments": experiments.manifest(),
               "rows": dict(zip(keys, [row, waited, {"ok": False, "exit_code": 1, "error": "boom"}]))}
    lines = blocks.render("host-probe", summary).splitlines()
    assert lines[2] == (f"| V3 compiled | {row['tokens_per_s']:,.0f} | {row['step_ms']:.2f} | 19.50 | "
                        f"{row['step_ms'] - 19.5:.2f} | 21.00 |")
    assert lines[3].endswith("| - | - | no reading |") and "exit 1: boom" in lines[4]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_profiled_scaling_rows_publish_their_overlap_per_rank(tmp_path):
    """A profiled row of the scaling step carries the overlap read from its ranks' traces
    (<row>_profile/overlap.json, written by analysis_tools overlap --json) into the published
    row, and the scaling-overlap block shows it per rank, after the 1-GPU run profiled alike
    (one trace, no rank); a profiled row whose traces were not read says so."""
    template = json.loads((REPO / "docs/published/h200/rows.json").read_text())["levers/prec_bf16"]
    scaling_dir = tmp_path / "work" / "scaling"
    for name, n in (("v4_compile_1gpu_profiled", 1), ("v4_compile_ddp2_profiled", 2),
                    ("v4_best_ddp2_profiled", 2)):
        (scaling_dir / f"{name}_profile").mkdir(parents=True)
        (scaling_dir / f"{name}.json").write_text(json.dumps(scaling_result(template, n, 700_000.0)))

    def overlap(trace: str, comm: float, beside: float, compute: float) -> dict:
        return {"trace": trace, "steps": 3, "comm_kernels": 40 if comm else 0, "comm_ms_per_step": comm,
                "overlapped_ms_per_step": beside, "exposed_ms_per_step": comm - beside,
                "overlap_fraction": beside / comm if comm else None, "compute_ms_per_step": compute,
                "gpu_window_ms_per_step": 33.0, "gpu_idle_ms_per_step": 1.0, "host_step_ms": 31.5}
    for name, ranks in (
            ("v4_compile_ddp2_profiled", [overlap(f"/x/v4_compile_ddp2_profiled_profile/rank{r}/pytorch/"
                                                  "t.pt.trace.json", 2.0, 1.5, 30.0) for r in (0, 1)]),
            ("v4_compile_1gpu_profiled", [overlap("/x/v4_compile_1gpu_profiled_profile/pytorch/t.pt.trace.json",
                                                  0.0, 0.0, 28.0)])):
        (scaling_dir / f"{name}_profile" / "overlap.json").write_text(
            json.dumps({"created": "2031-01-02T03:04:05+00:00", "git_commit": "abc1234", "ranks": ranks}))
    rows = {key: publish.compact(data) for key, data in publish._rows(tmp_path / "work")}
    assert [o["rank"] for o in rows["scaling/v4_compile_ddp2_profiled"]["overlap"]] == [0, 1]
    assert [o["rank"] for o in rows["scaling/v4_compile_1gpu_profiled"]["overlap"]] == [None]
    assert "overlap" not in rows["scaling/v4_best_ddp2_profiled"]
    text = blocks.render("scaling-overlap", {"rows": rows, "experiments": experiments.manifest()})
    assert "| V4 compiled, DDP x2 | 1 | 2.00 | 1.50 (75.0%) | 0.50 | 30.00 | 1.00 | 31.50 |" in text
    assert "| V4 compiled, 1 GPU | - | 0.00 | 0.00 (-) | 0.00 | 28.00 | 1.00 | 31.50 |" in text
    assert text.index("V4 compiled, 1 GPU") < text.index("V4 compiled, DDP x2")
    assert "Measured on 2 x " in text
    assert "| V4 graphs + master weights, DDP x2 | - | no trace read |" in text
    assert "by `bash benchmarks/reproduce.sh scaling`" in text
    assert blocks.render("scaling-overlap", {"rows": {}}) == blocks.PLACEHOLDER


def test_host_overhead_table_is_published_with_its_kernels_step(tmp_path, monkeypatch):
    """benchmarks/host_overhead.py's JSON (the kernels step) becomes the host-overhead block,
    and publish.py update republishes it like the kernel table."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)
    measured = {"device": "GPU X", "torch": "2.11", "triton": "3.6", "git_commit": "abc1234",
                "created": "2031-01-02T03:04:05+00:00",
                "rows": [{"call": "torch: F.rms_norm fwd+bwd", "host_us": 150.0, "launches": 3},
                         {"call": "v3: rms_norm fwd+bwd", "host_us": 120.0, "launches": 2,
                          "replaces": "torch: F.rms_norm fwd+bwd", "ratio": 0.8},
                         {"call": "torch: linear, cross_entropy forward", "host_us": 50.0, "launches": 4},
                         {"call": "v3: linear_cross_entropy forward", "host_us": 100.0, "launches": 9,
                          "beside": "torch: linear, cross_entropy forward", "ratio": 2.0}]}
    text = blocks.render("host-overhead", {"host_overhead": measured})
    assert "| v3: rms_norm fwd+bwd | 120.0 | 2 | 0.80 |" in text and "GPU X" in text and "2031-01-02" in text
    assert "| v3: linear_cross_entropy forward | 100.0 | 9 | 2.00 |" in text  # shown, not judged
    assert "1 of 1 V3 calls cost the host no more than the PyTorch call they replace" in text
    assert "not judged on host time (the GPU sets their pace): linear_cross_entropy." in text
    pub, work = tmp_path / "h200", tmp_path / "work"
    shutil.copytree(REPO / "docs/published/h200", pub)
    work.mkdir()
    (work / "host_overhead.json").write_text(json.dumps(measured))
    after = publish.update(work, pub)
    assert after["host_overhead"] == measured and (pub / "host_overhead.json").exists()
    assert after["updated"][-1] == {"part": "host_overhead", "created": measured["created"],
                                    "git_commit": "abc1234"}


def test_kernel_table_states_attention_ratios_timed_apart_and_in_paired_rounds():
    """Under the kernel table, SDPA's time over ours for each attention row that has one:
    the paired-round ratio with its middle half where bench_kernels measured it."""
    rows = [{"shape": "b4 h16 s2048 d128", "impl": "triton", "sdpa_graph_time_over_ours": 0.94,
             "sdpa_graph_time_over_ours_paired": 0.97, "paired_middle_half": [0.96, 0.98]},
            {"shape": "b4 h16 s2048 d128", "impl": "sdpa (cudnn)"},
            {"shape": "b4 h16 s2048 d128", "impl": "triton, portable", "sdpa_graph_time_over_ours": 0.81}]
    text = blocks.render("kernels", {"kernels": {"attention": rows}})
    assert "* b4 h16 s2048 d128: 0.94 timed apart, 0.97 in paired rounds (middle half 0.96-0.98)" in text
    assert "* b4 h16 s2048 d128, triton, portable: 0.81 timed apart\n" in text + "\n"
    assert "cudnn):" not in text
    assert "paired rounds" not in blocks.render("kernels", {"kernels": {"attention": rows[1:2]}})


def test_results_page_says_how_v3_attention_compares_from_the_two_profiles():
    """The sentence under the V3 profile follows the attention rows of V3's and V4's profiles,
    so a republished profile cannot leave it saying the opposite of its tables."""
    from tools.results_text import _attention_against_vendor

    def said(v3_ms, v4_ms):
        profile = lambda ms: {"kernel_ms_by_category": {"attention": ms}}  # noqa: E731
        return _attention_against_vendor({"profiles": {"v3": profile(v3_ms), "v4": profile(v4_ms)}})

    assert "a little longer than SDPA's" in said(5.96, 5.27)
    assert said(4.70, 5.27) == "; attention takes less time than SDPA's"
    assert said(5.30, 5.27) == "; attention takes about as long as SDPA's"
    assert _attention_against_vendor({"profiles": {}}) == ""


def test_results_page_names_the_phase_a_fusion_moved():
    """The sentence under V3's fusions names the phase whose time moved most between a pair of
    rows, from the rows themselves; a pair that is not there says nothing."""
    from tools.results_text import _phase_moved

    def row(fwd, bwd, opt):
        return {"forward_ms": fwd, "backward_ms": bwd, "optimizer_ms": opt}

    s = {"rows": {"fusion/on": row(5.94, 13.10, 3.43), "fusion/off": row(5.91, 11.15, 3.45)}}
    assert _phase_moved(s, "on", "off") == "; the difference is in the backward (13.10 against 11.15 ms)"
    s["rows"]["fusion/on"] = row(7.0, 11.2, 3.43)
    assert "in the forward (7.00 against 5.91 ms)" in _phase_moved(s, "on", "off")
    assert _phase_moved(s, "on", "missing") == ""


def test_gpu_slug():
    from harness.device import gpu_slug
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_slug("AMD Instinct MI300X") == "mi300x"


@pytest.mark.slow  # ~3 min on a 2-core CPU; its parts (the manifest, compare-row, collect) run in make test
def test_reproduce_quick_makes_a_published_set(tmp_path):
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "benchmarks/reproduce.sh", "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = tmp_path / "reproduce" / "cpu-quick"
    assert not (tmp_path / "published").exists()  # reproduce measures; it never publishes
    out = tmp_path / "docs" / "cpu-quick"
    summary = publish.publish_work(work, published=tmp_path / "docs")
    assert summary["schema"] == publish.SCHEMA and summary["git_commit"]
    assert summary["experiments"] == experiments.manifest()
    assert {r["version"] for r in summary["compare"]["medium"]["rows"]} == {"v1", "v4"}
    assert summary["rows"]["levers/prec_fp32"]["ok"]
    assert "| fp32 |" in blocks.render("levers", summary)  # its block, from the manifest
    assert ("v1", "flopcounter", "step") in {(r["version"], r["tool"], r["scope"])
                                            for r in summary["flop_counters"]}
    assert len(list(out.iterdir())) <= 25
    # Every number in a block is the data's: the V1 row of the README table.
    v1 = next(r for r in summary["compare"]["medium"]["rows"] if r["version"] == "v1")
    assert f"{v1['tokens_per_s']:,.0f}" in blocks.render("readme-table", summary)
    assert "`" + summary["git_commit"] + "`" in (out / "RESULTS.md").read_text()
    # A second run skips every row; regress against the set itself passes. A row that would
    # repeat a run of the comparison (the SDPA step's default backend) is copied from it.
    again = subprocess.run(["bash", "benchmarks/reproduce.sh", "--quick", "compare-medium", "sdpa",
                            "compare-large", "regress"], cwd=REPO,
                           env={**env, "BASELINE": str(out)},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "done before, skipped" in again.stdout and "no regression beyond tolerance" in again.stdout
    assert "sdpa/backend_auto: the medium comparison's v4 eager run" in again.stdout
    run = next(r for r in json.loads((work / "compare_medium.json").read_text())["runs"]
               if (r["version"], r["mode"]) == ("v4", "eager"))
    assert json.loads((work / "sdpa" / "backend_auto.json").read_text()) == run["result"]
    # Publishing again replaces what was re-measured (the large comparison joins the others).
    summary = publish.publish_work(work, published=tmp_path / "docs")
    assert {r["version"] for r in summary["compare"]["large"]["rows"]} == {"v1", "v4"}
    assert "compare_large.json" in summary["files"]


def test_measuring_never_publishes_and_publishing_imports_no_measurement():
    """reproduce.sh writes JSON and calls nothing in tools/; tools/ imports nothing from
    benchmarks/: which block shows which row reaches publishing as JSON (experiments.json)."""
    script = (REPO / "benchmarks/reproduce.sh").read_text()
    assert not re.findall(r"^[^#]*tools/", script, re.M)
    for path in (REPO / "tools").glob("*.py"):
        imports = re.findall(r"^\s*(?:from|import) (benchmarks)\b", path.read_text(), re.M)
        assert not imports, f"{path.name} imports from benchmarks/"


def test_one_command_publishes_a_work_folder(tmp_path, monkeypatch):
    """python tools/publish.py results/reproduce/<gpu>: a GPU model without a set gets a new one;
    with one, only what was re-measured is replaced; a missing folder is one line, exit 1."""
    monkeypatch.setattr(publish, "_plots", lambda *a: None)
    monkeypatch.setattr(publish, "publish", lambda check, gpu=None: 0)  # leave the docs alone
    work, docs = tmp_path / "reproduce" / "h200", tmp_path / "published"
    work.mkdir(parents=True)
    shutil.copy(REPO / "docs/published/h200/compare_small.json", work)
    experiments.main(["manifest", str(work / "experiments.json")])
    first = publish.publish_work(work, published=docs)
    assert set(first["compare"]) == {"small"} and first["experiments"] == experiments.manifest()
    shutil.copy(REPO / "docs/published/h200/kernels.json", work)
    second = publish.publish_work(work, published=docs)
    assert second["kernels"] and [u["part"] for u in second["updated"]] == ["compare_small", "kernels"]
    with pytest.raises(SystemExit, match="is not a folder of reproduce's results"):
        publish.main([str(tmp_path / "nowhere")])


@pytest.mark.slow  # a training row started and stopped: ~15 s
def test_a_stopped_reproduce_stops_its_run(tmp_path):
    """TERM to reproduce (a time limit) while a row trains: reproduce exits 143 and the row's
    run goes with it, instead of running on beside whatever starts next."""
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable, "STEPS": "100000"}
    proc = subprocess.Popen(["bash", "benchmarks/reproduce.sh", "--quick", "levers"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    row = str(tmp_path / "reproduce" / "cpu-quick" / "levers" / "prec_fp32.json")

    def running() -> str:  # the pids of processes whose command line names the row's JSON
        return subprocess.run(["pgrep", "-f", row], capture_output=True, text=True).stdout

    deadline = time.monotonic() + 120
    while not running():  # the row's run has started
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    time.sleep(2)
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    for _ in range(20):  # the signal passes through timeout to the run
        left = running()
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"the row's run is still running: pids {left.split()}"


def test_a_time_limit_starts_no_row_it_could_cut(tmp_path):
    """TIME_LIMIT: no training row starts that its ROW_TIMEOUT could carry past the limit; the
    command says so, skips the steps after it and exits 3, so a loop knows to run it again."""
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable, "TIME_LIMIT": "60",
           "ROW_TIMEOUT": "120"}
    proc = subprocess.run(["bash", "benchmarks/reproduce.sh", "--quick", "levers", "memory"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "levers/prec_fp32 and what follows: not started" in proc.stdout
    assert "== memory" not in proc.stdout and "run the same command again to continue" in proc.stdout
    assert not list((tmp_path / "reproduce" / "cpu-quick").glob("*/*.json"))


def test_a_failed_row_runs_again_and_an_answer_does_not(tmp_path):
    """Resuming: a row whose JSON records a failure (a crash, its ROW_TIMEOUT) runs again; one
    whose failure is an answer (exit 3: out of memory) is done. The time limit stops the rerun
    before it trains, so nothing here trains."""
    row = tmp_path / "reproduce" / "cpu-quick" / "levers" / "prec_fp32.json"
    row.parent.mkdir(parents=True)
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable, "TIME_LIMIT": "60",
           "ROW_TIMEOUT": "120"}
    command = ["bash", "benchmarks/reproduce.sh", "--quick", "levers"]
    row.write_text(json.dumps({"exit_code": 124, "error": "stopped by its ROW_TIMEOUT"}))
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "levers/prec_fp32: failed before (exit 124), run again" in proc.stdout
    assert "levers/prec_fp32 and what follows: not started" in proc.stdout
    row.write_text(json.dumps({"exit_code": 3, "error": "out of memory"}))
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "levers/prec_fp32: done before, skipped" in proc.stdout


@pytest.mark.parametrize("setting", ["STEPS=fusion", "ROW_TIMEOUT=5m", "TIME_LIMIT=1.5", "HOST_RERUNS=yes"])
def test_reproduce_refuses_a_count_that_is_not_a_number(tmp_path, setting):
    """STEPS, ROW_TIMEOUT, TIME_LIMIT, ...: a value that is not a whole number is one line and
    exit 2, before any row runs or any folder is made."""
    var, value = setting.split("=")
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable, var: value}
    proc = subprocess.run(["bash", "benchmarks/reproduce.sh", "--quick", "levers"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: {var}='{value}' is not a whole number (see --help)\n"
    assert not (tmp_path / "reproduce").exists()


def test_compare_row_copies_the_median_run_at_pace(tmp_path):
    """A row that repeats a comparison's run takes the median of its processes whose host ran
    at pace, as the comparison's table does (all of them, where none did)."""
    real = next(r for r in json.loads((REPO / "docs/published/h200/compare_medium.json").read_text())["runs"]
                if r["version"] == "v3" and r["mode"] == "eager")["result"]
    runs = [{"version": "v3", "mode": "eager", "repeat": r, "exit_code": 0, "tokens_per_s": speed,
             "result": {**real, "command": f"run {speed}"}} for r, speed in enumerate((300, 400, 410, 200))]
    report = tmp_path / "compare.json"
    report.write_text(json.dumps({"runs": runs, "slow_hosts": [
        {"version": "v3", "mode": "eager", "repeat": r, "pace_x": 2.0} for r in (0, 3)]}))
    out = tmp_path / "r.json"
    assert experiments.main(["compare-row", str(report), "v3", "eager", str(out)]) == 0
    assert json.loads(out.read_text())["command"] == "run 400"  # the lower middle of 400 and 410
    report.write_text(json.dumps({"runs": runs, "slow_hosts": [
        {"version": "v3", "mode": "eager", "repeat": r, "pace_x": 2.0} for r in range(4)]}))
    assert experiments.main(["compare-row", str(report), "v3", "eager", str(out)]) == 0
    assert json.loads(out.read_text())["command"] == "run 300"


@pytest.mark.parametrize("reruns", ["1", "0"])
def test_a_host_paced_row_whose_host_ran_slow_runs_again(tmp_path, reruns):
    """A training row without graphs whose process ran on a slow host (experiments host-pace,
    against every process in the work folder) runs again, HOST_RERUNS times at most; the slow
    run stays beside it, out of the rows. A stand-in python plays the GPU and the training runs:
    the third row's first process reads 3x the machine's pace."""
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
case "$*" in
    *device_count*) echo 1 ;;
    *gpu_slug*) echo fakegpu ;;
    *tiny_llama_v1.py*)
        out=$(sed -n 's/.*--output \\([^ ]*\\).*/\\1/p' <<< "$*"); name=$(basename "$out" .json)
        n=$(cat {tmp_path}/count_$name 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/count_$name
        after=1000; [ "$name-$n" = prec_bf16-0 ] && after=3000
        echo '{{"schema_version": 1, "host_pace": {{"before_us": 1000, "after_us": '$after', "items": 1}}}}' > "$out" ;;
    *) exec {sys.executable} "$@" ;;
esac
""")
    fake.chmod(0o755)
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": str(fake), "ROWS": "prec_*", "HOST_RERUNS": reruns}
    proc = subprocess.run(["bash", "benchmarks/reproduce.sh", "levers"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {name: int((tmp_path / f"count_{name}").read_text()) for name in ("prec_fp32", "prec_tf32", "prec_bf16")}
    levers = tmp_path / "reproduce/fakegpu/levers"
    if reruns == "1":
        assert runs == {"prec_fp32": 1, "prec_tf32": 1, "prec_bf16": 2}
        assert "levers/prec_bf16: it ran its Python 3.00x slower than this machine's fastest, run again" in proc.stdout
        assert (levers / ".prec_bf16.slow.json").exists()
        assert json.loads((levers / "prec_bf16.json").read_text())["host_pace"]["after_us"] == 1000
    else:
        assert runs == {"prec_fp32": 1, "prec_tf32": 1, "prec_bf16": 1} and "run again" not in proc.stdout


def test_compare_row_refuses_a_run_the_comparison_lacks(tmp_path):
    report = tmp_path / "compare.json"
    report.write_text(json.dumps({"runs": [{"version": "v1", "mode": "eager", "exit_code": 3,
                                            "tokens_per_s": 0, "result": None}]}))
    assert experiments.main(["compare-row", str(report), "v1", "eager", str(tmp_path / "r.json")]) == 1
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("name", sorted(blocks.BLOCKS))
def test_every_block_renders_a_placeholder_without_data(name):
    assert blocks.render(name, None) == PLACEHOLDER


def test_collect_publishes_the_flop_counters(tmp_path):
    """reproduce's flops step leaves <work>/flops/<v>/<tool>/flops.json; collect turns them into
    summary["flop_counters"] and the flop-counters block quotes them (no profiler is run here)."""
    work, out = tmp_path / "work" / "cpu-test", tmp_path / "published" / "cpu-test"
    fixtures = {"flopcounter": {"tool": "flopcounter", "scope": "step", "counted_flops": 88080384,
                                "analytic_flops": 94371840, "ratio": 0.9333333333333333},
                "deepspeed": {"tool": "deepspeed", "scope": "forward", "counted_flops": 29409280,
                              "analytic_flops": 31457280, "ratio": 0.9348958333333334, "macs": 14680064}}
    for tool, data in fixtures.items():
        (work / "flops" / "v3" / tool).mkdir(parents=True)
        (work / "flops" / "v3" / tool / "flops.json").write_text(json.dumps(data))
    summary = publish.collect(work, out)
    assert summary["flop_counters"] == [
        {"version": "v3", "tool": "flopcounter", "scope": "step", "counted": 88080384,
         "analytic": 94371840, "ratio": 0.9333333333333333},
        {"version": "v3", "tool": "deepspeed", "scope": "forward", "counted": 29409280,
         "analytic": 31457280, "ratio": 0.9348958333333334, "macs": 14680064}]
    assert json.loads((out / "summary.json").read_text())["flop_counters"] == summary["flop_counters"]
    block = blocks.render("flop-counters", summary)
    assert "| V3 Triton | DeepSpeed FLOPS profiler | forward only, one step | 29,409,280 | 31,457,280 | 0.935 |" in block
    assert "88,080,384" in block and "0.933" in block
    assert "<!-- published:flop-counters -->\n" + block in (out / "RESULTS.md").read_text()


def test_host_paced_eager_rows_show_their_range_and_say_why():
    """Eager rows measured over several processes (compare_versions --eager-repeats) show the
    range they spanned, and the table says they are host-paced and judged against it."""
    def row(mode, speed, low, high):
        return {"version": "v3", "mode": mode, "runs": 3 if mode == "eager" else 1,
                "tokens_per_s": speed, "tokens_per_s_min": low, "tokens_per_s_max": high,
                "x_v1_eager": 2.0, "step_ms": 20.0, "forward_ms": 5.0, "backward_ms": 10.0,
                "optimizer_ms": 1.0, "mfu_datasheet": 0.2, "mfu_measured_ceiling": 0.3, "peak_memory_mb": 600}
    s = {"compare": {"small": {"repeats": 1, "eager_repeats": 3,
                               "rows": [row("eager", 49411, 43315, 72494), row("reduce-overhead", 2e5, 2e5, 2e5)]}}}
    text = blocks.render("compare-small", s)
    assert "tokens/s (min..max)" in text and "49,411 (43,315..72,494)" in text
    assert "median of 3 interleaved processes, with the range they spanned" in text and "host-paced row" in text
    for r in s["compare"]["small"]["rows"]:  # a comparison whose medians take the processes at pace
        r["counted"] = r["runs"]
    assert "median of 3 interleaved processes whose host ran at pace" in blocks.render("compare-small", s)
    s["compare"]["small"]["eager_repeats"] = 1
    assert "host-paced" not in blocks.render("compare-small", s)


def test_a_comparison_with_every_row_repeated_says_so():
    """On the small preset every row is the median of several processes (reproduce.sh passes
    --repeats 3 there): the caption covers every row, and the widest range of any row."""
    def row(mode, low, high):
        return {"version": "v3", "mode": mode, "runs": 3, "tokens_per_s": (low + high) / 2,
                "tokens_per_s_min": low, "tokens_per_s_max": high, "x_v1_eager": 2.0, "step_ms": 4.0,
                "forward_ms": 1.0, "backward_ms": 2.0, "optimizer_ms": 1.0, "mfu_datasheet": 0.04,
                "mfu_measured_ceiling": 0.06, "peak_memory_mb": 568}
    s = {"compare": {"small": {"repeats": 3, "eager_repeats": 3,
                               "rows": [row("eager", 60000, 66000), row("reduce-overhead", 233000, 336000)]}}}
    text = blocks.render("compare-small", s)
    assert "Each row is the median of 3 interleaved processes" in text
    assert "here by up to 1.44x" in text and "one process each" not in text


def test_the_caption_names_the_processes_whose_host_ran_slow():
    """compare_versions' slow_hosts travel into the summary and the comparison's caption."""
    from tools.published_format import compare_caption
    report = json.loads((REPO / "docs/published/h200/compare_medium.json").read_text())
    report["slow_hosts"] = []
    assert "host ran" not in compare_caption({"compare": {"medium": publish.compare_summary(report)}}, "medium")
    report["slow_hosts"] = [{"version": "v3", "mode": "eager", "repeat": 0, "pace_x": 1.93},
                            {"version": "v3", "mode": "compile", "repeat": 0, "pace_x": 1.4}]
    caption = compare_caption({"compare": {"medium": publish.compare_summary(report)}}, "medium")
    assert caption.endswith("ran slow, out of their row's median where it has a process at pace: "
                            "V3 Triton eager (repeat 1, 1.93x), V3 Triton compiled (repeat 1, 1.40x).")
    assert "fastest tenth" not in caption  # only where a process was named by its steps
    report["slow_hosts"].append({"version": "v4", "mode": "eager", "repeat": 1, "pace_x": 1.1, "steps_x": 1.3})
    caption = compare_caption({"compare": {"medium": publish.compare_summary(report)}}, "medium")
    assert ("slower than the comparison's fastest, or whose median step took more than 1.2x their "
            "fastest tenth (a slow spell between the probes)") in caption
    assert caption.endswith("V4 SDPA eager (repeat 2, median step 1.30x its fastest tenth).")


@pytest.mark.parametrize("step, repeats, rerun", [("compare-small", "3", "compile,eager,reduce-overhead"),
                                                  ("compare-medium", "1", "compile,eager")])
def test_the_small_comparison_repeats_every_row(tmp_path, step, repeats, rerun):
    """On a GPU, reproduce runs every row of the small comparison as often as an eager row (the
    host paces them all there), and the medium comparison's compiled rows once; the modes the
    host paces run again where a process's host ran slow (on the small preset, all). A stand-in
    python answers reproduce's GPU probes and records the comparison's command line."""
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
case "$*" in
    *device_count*) echo 1 ;;
    *gpu_slug*) echo fakegpu ;;
    *compare_versions.py*) echo "$*" > {tmp_path}/compare_args ;;
esac
""")
    fake.chmod(0o755)
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": str(fake)}
    subprocess.run(["bash", "benchmarks/reproduce.sh", step], cwd=REPO, env=env, capture_output=True,
                   text=True, timeout=60)
    args = (tmp_path / "compare_args").read_text().split()
    assert args[args.index("--repeats") + 1] == repeats and args[args.index("--eager-repeats") + 1] == "3"
    assert args[args.index("--rerun-slow-host") + 1] == rerun
