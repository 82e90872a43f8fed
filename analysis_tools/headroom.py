"""headroom: how far a training step is from the sum of its operations' rooflines.

No operation can take less than the longer of two times: its FLOPs at the measured matmul
ceiling, or its minimum bytes (analysis_tools/ops.py) at the measured copy bandwidth. Summed
over a step, that is the step at its rooflines. It is summed here for the leanest list of
operations this project runs, V3's: flash attention, the QKV and gate/up projections as one
GEMM each, each residual add inside the next norm's kernel, one SwiGLU kernel each way, one
AdamW pass. A run's step time against that sum says how much is left to win by making
kernels faster, and the per-operation table says where it could come from.

The GEMMs' rate is the matmul ceiling the runs' own comparison probed beside them
(compare_versions records it), else the ceilings file's: a GPU runs a few percent faster or
slower from one machine or hour to the next, and a step compares with a ceiling of its run.

A yardstick, not a wall:
- the matmul ceiling is the best of a few GEMM shapes (benchmarks.ceilings); a model's own
  GEMMs can run a little above it, so a step can beat its GEMM rows;
- attention counts at the matmul ceiling, which no attention kernel reaches (its softmax
  and masking run beside the products): its row is the most optimistic;
- fusing across operations (a norm into a GEMM's prologue, SwiGLU into its epilogue) removes
  bytes that are counted here;
- what the list does not name - the embedding, memsets, gaps between kernels, and under
  data parallelism the communication - counts against the run.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.results import numbers

from .ceilings import find_measured_ceilings, load_ceilings
from .common import AnalysisError, model_config, unique_labels
from .ops import training_ops

MEASURE = "python -m benchmarks.ceilings"


def roofline_ops(cfg, batch: int, seq: int, precision: str, matmul_tflops: float,
                 copy_gbs: float) -> pd.DataFrame:
    """The leanest operation list of one step, each operation at its roofline."""
    ops = training_ops(cfg, batch, seq, precision, "flash", fused_qkv=True, fused_gate_up=True,
                       residual_in_norm=True)
    ops["GFLOP"], ops["MB"] = ops["flops"] / 1e9, ops["bytes"] / 1e6
    ops["compute ms"] = ops["flops"] / (matmul_tflops * 1e12) * 1e3
    ops["memory ms"] = ops["bytes"] / (copy_gbs * 1e9) * 1e3
    ops["roofline ms"] = ops[["compute ms", "memory ms"]].max(axis=1)
    ops["bound"] = ops["compute ms"].gt(ops["memory ms"]).map({True: "compute", False: "memory"})
    return ops


def matmul_rate(ceilings: dict, precision: str, probed: float | None = None, label: str = "") -> float:
    """The GEMMs' TFLOP/s for a sum: the ceiling probed beside the runs when there is one,
    else the ceilings file's for this precision."""
    matmul = probed or ceilings["measured"]["matmul_tflops"].get(precision)
    if not matmul:
        raise AnalysisError(f"headroom: the ceilings have no {precision} matmul rate"
                            + (f" ({label})" if label else ""))
    return matmul


def ceilings_for_runs(results: list[dict], path=None) -> tuple[dict, Path]:
    """The ceilings JSON given, else the one measured on the runs' device; one line if none."""
    device = results[0]["device"].get("name")
    found = Path(path) if path else find_measured_ceilings(device)
    if found is None:
        raise AnalysisError(f"headroom: no ceilings measured on {device}: measure them there with "
                            f"`{MEASURE}`, or pass --ceilings")
    data = load_ceilings(found)
    measured_on = data.get("device", {}).get("name")
    others = sorted({r["device"].get("name") for r in results} - {measured_on})
    if others:
        raise AnalysisError(f"headroom: {found} was measured on {measured_on}, the runs on "
                            f"{', '.join(map(str, others))}: compare a run with its own device's ceilings")
    return data, found


def headroom(results: list[dict], ceilings: dict) -> dict:
    """{'runs': one row per run, 'ops': {setup: the operation table}}."""
    measured = ceilings["measured"]
    runs, setups, names = [], {}, {}  # names: (model, batch, seq, precision) -> its setup's name
    for label, r in zip(unique_labels(results), results):
        run = r["run"]
        precision = run["precision"]
        matmul = matmul_rate(ceilings, precision, r.get("_matmul_tflops"), label)
        step = numbers(r)["step_ms"]
        if step is None:  # a failed run has no step to set beside the sum
            continue
        key = (tuple(sorted(r["config"].items())), run["batch_size"], run["seq_len"], precision, matmul)
        if key not in names:
            name = (f"{run.get('preset') or 'custom'} b{run['batch_size']} x T{run['seq_len']} {precision}, "
                    f"matmul {matmul:,.0f} TFLOP/s")
            names[key] = name if name not in setups else f"{name} ({len(setups) + 1})"
            setups[names[key]] = roofline_ops(model_config(r), run["batch_size"], run["seq_len"],
                                              precision, matmul, measured["copy_gbs"])
        setup = names[key]
        floor = setups[setup]["roofline ms"].sum()
        runs.append({"run": label, "setup": setup, "step ms": step, "at rooflines ms": floor,
                     "of the step %": floor / step * 100, "above them ms": step - floor})
    if not runs:
        raise AnalysisError("headroom: no run with a step time (every run given failed)")
    return {"runs": pd.DataFrame(runs), "ops": setups}
