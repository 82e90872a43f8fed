"""analysis_tools headroom: each run's step against the sum of its operations' rooflines,
on the published H200 comparison and ceilings (no run needed)."""
import json

import pytest

from conftest import REPO, run_cli
from analysis_tools.ceilings import load_ceilings
from analysis_tools.common import AnalysisError
from analysis_tools.compare import load_runs
from analysis_tools.headroom import ceilings_for_runs, headroom
from analysis_tools.ops import training_ops
from harness.config import PRESETS

PUBLISHED = REPO / "docs/published/h200"


def test_the_residual_add_inside_the_norm_moves_fewer_bytes_and_the_same_flops():
    """V3's add + norm: one kernel each way reads and writes what the two did, less the
    add's own round trip; the GEMMs are untouched."""
    preset = PRESETS["medium"]
    cfg, n = preset.model, preset.batch_size * preset.seq_len
    apart = training_ops(cfg, preset.batch_size, preset.seq_len, "bf16", "flash").set_index("op")
    fused = training_ops(cfg, preset.batch_size, preset.seq_len, "bf16", "flash",
                         residual_in_norm=True).set_index("op")
    assert "residual add" not in fused.index and fused.loc["rmsnorm", "count"] == 1
    pair = fused.loc["residual add + rmsnorm"]
    assert pair["count"] == 2 * cfg.num_layers
    assert pair["bytes_per_call"] == 28 * n * cfg.hidden_dim  # 12 forward + 16 backward in bf16
    norms = ["rmsnorm", "residual add"]
    assert fused.loc[["residual add + rmsnorm", "rmsnorm"], "bytes"].sum() < apart.loc[norms, "bytes"].sum()
    gemms = lambda ops: ops[ops["category"] == "gemm"]["flops"].sum()
    assert gemms(fused) == gemms(apart)


def test_headroom_of_the_published_large_comparison():
    results, _ = load_runs([PUBLISHED / "compare_large.json"])
    out = headroom(results, load_ceilings(PUBLISHED / "ceilings.json"))
    ops, runs = next(iter(out["ops"].values())), out["runs"]
    assert len(out["ops"]) == 1 and len(runs) == len(results)
    assert runs["at rooflines ms"].nunique() == 1  # one setup: one sum
    assert runs["at rooflines ms"].iloc[0] == pytest.approx(ops["roofline ms"].sum())
    by_op = ops.set_index("op")
    assert (by_op.loc[["qkv_proj", "gate_up_proj", "lm_head", "attention (flash, causal)"], "bound"]
            == "compute").all()
    assert (by_op.loc[["residual add + rmsnorm", "swiglu silu(g)*u", "AdamW update"], "bound"]
            == "memory").all()
    for _, row in runs.iterrows():  # every published run takes longer than the sum
        assert 0 < row["of the step %"] < 100
        assert row["above them ms"] == pytest.approx(row["step ms"] - row["at rooflines ms"])
    # the GEMMs run at the matmul ceiling the comparison probed beside its runs; a run
    # without one (a results JSON of its own) at the ceilings file's
    probed = json.loads((PUBLISHED / "compare_large.json").read_text())["ceiling"]["matmul_tflops"]
    gemm = by_op.loc["qkv_proj"]
    assert gemm["compute ms"] == pytest.approx(gemm["flops"] / (probed * 1e12) * 1e3)
    assert f"matmul {probed:,.0f} TFLOP/s" in next(iter(out["ops"]))
    ceilings = load_ceilings(PUBLISHED / "ceilings.json")
    alone = [{k: v for k, v in r.items() if k != "_matmul_tflops"} for r in results]
    filed = ceilings["measured"]["matmul_tflops"]["bf16"]
    assert f"matmul {filed:,.0f} TFLOP/s" in next(iter(headroom(alone, ceilings)["ops"]))
    failed = [{**r, "timing_ms": {"step": {"median": None}}} for r in results]  # no step time
    with pytest.raises(AnalysisError, match="no run with a step time"):
        headroom(failed, load_ceilings(PUBLISHED / "ceilings.json"))


def test_headroom_command_and_its_refusals(tmp_path, monkeypatch):
    ok = run_cli(["-m", "analysis_tools", "headroom", PUBLISHED / "compare_large.json",
                  "--ceilings", PUBLISHED / "ceilings.json"])
    assert ok.returncode == 0, ok.stderr
    assert "each operation at its roofline" in ok.stdout and "at rooflines ms" in ok.stdout
    runs = load_runs([PUBLISHED / "compare_large.json"])[0]
    # no ceilings of this device anywhere: say how to measure them (the CLI: one line, exit 2)
    monkeypatch.setenv("ANALYSIS_OUT", str(tmp_path))
    with pytest.raises(AnalysisError, match="no ceilings measured on NVIDIA H200: measure them there"):
        ceilings_for_runs(runs)
    # another device's ceilings are refused, not silently used
    other = json.loads((PUBLISHED / "ceilings.json").read_text())
    other["device"]["name"] = "AMD Instinct MI300X"
    (tmp_path / "mi300x.json").write_text(json.dumps(other))
    with pytest.raises(AnalysisError, match="measured on AMD Instinct MI300X, the runs on NVIDIA H200"):
        ceilings_for_runs(runs, tmp_path / "mi300x.json")


def test_the_published_block_sets_each_best_step_beside_the_sum():
    from tools import published_blocks as blocks
    summary = json.loads((PUBLISHED / "summary.json").read_text())
    text = blocks.render("headroom", summary)
    v3 = next(line for line in text.splitlines() if line.startswith("| large | V3 Triton"))
    step, at_roofs, share, above = (cell.strip() for cell in v3.split("|")[3:7])
    assert float(step) == pytest.approx(float(at_roofs) + float(above), abs=0.011)
    assert float(share.rstrip("%")) == pytest.approx(float(at_roofs) / float(step) * 100, abs=0.06)
    assert "- large (matmul " in text and "ms above its roofline" in text  # the kernel table's attention
    del summary["ceilings"]
    assert blocks.render("headroom", summary).startswith(blocks.PLACEHOLDER)
