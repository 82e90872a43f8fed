"""ceilings: measure this device's matmul peak per precision and its copy
bandwidth (plus, cheaply, bandwidth against working-set size, where the caches
show up as plateaus), and store them beside the datasheet peaks.

The probes are harness.ceilings (the same ones `--measure-peak` uses for MFU).
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import torch

from harness import device as dev
from harness import flops
from harness.ceilings import measure_copy_gbs, measure_matmul_tflops
from harness.config import PRECISIONS

from .common import AnalysisError, plt, save_figure


def default_precisions(device: torch.device) -> list[str]:
    if device.type == "cpu":
        return ["fp32", "bf16"]
    return list(PRECISIONS) if dev.supports_bf16(device) else ["fp32", "fp16"]


def measure_ceilings(device="auto", precisions=None, sweep: bool = False) -> dict:
    """Measured peaks plus the datasheet row of this device (if it is in the table)."""
    device = dev.resolve_device(device) if isinstance(device, str) else torch.device(device)
    precisions = precisions or default_precisions(device)
    matmul = {}
    for p in precisions:
        if p not in PRECISIONS:
            raise AnalysisError(f"unknown precision {p!r} ({', '.join(PRECISIONS)})")
        if p == "tf32" and device.type == "cpu":
            continue  # no TF32 on CPUs
        matmul[p] = measure_matmul_tflops(device, p)
    measured = {"matmul_tflops": matmul, "copy_gbs": measure_copy_gbs(device)}
    if sweep:
        top = 30 if device.type == "cuda" else 26   # 1 GiB on a GPU, 64 MiB on a CPU
        measured["copy_sweep"] = [{"bytes": 1 << e, "gbs": measure_copy_gbs(device, 1 << e)}
                                  for e in range(16, top + 1, 2)]
    desc = dev.describe(device)
    found = flops.lookup_peak(desc["name"], desc["arch"])
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": desc,
        "method": "median of device-event timings after warm-up: the best of several GEMM shapes "
                  "(harness.ceilings.MATMUL_SHAPES, 2*m*k*n FLOPs; compare MFU against the "
                  "datasheet beside it), copy of 1 GiB GPU / 64 MiB CPU counting read + write",
        "measured": measured,
        "datasheet": {"key": found[0], **found[1]} if found else None,
        "datasheet_table": flops.PEAK_TFLOPS,
    }


def ceilings_table(data: dict) -> pd.DataFrame:
    sheet = data.get("datasheet") or {}
    rows = [{"ceiling": f"matmul {p}", "measured": v, "datasheet": sheet.get(p), "unit": "TFLOP/s"}
            for p, v in data["measured"]["matmul_tflops"].items()]
    hbm = sheet.get("hbm_tbs")
    rows.append({"ceiling": "device copy (read+write)", "measured": data["measured"]["copy_gbs"],
                 "datasheet": hbm * 1000 if hbm else None, "unit": "GB/s"})
    df = pd.DataFrame(rows)
    df["measured / datasheet %"] = [m / d * 100 if d else None for m, d in zip(df["measured"], df["datasheet"])]
    return df


def plot_copy_sweep(data: dict, out_dir, name="ceilings_bandwidth.png"):
    sweep = pd.DataFrame(data["measured"]["copy_sweep"])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(sweep["bytes"] / 2**20, sweep["gbs"], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tensor size (MiB, copied: read once + written once)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title(f"Copy bandwidth vs working set: {data['device']['name']}\n"
                 "(plateaus = cache levels; the right end is main memory)")
    ax.grid(which="both", alpha=0.3)
    return save_figure(fig, out_dir, name)


def write_ceilings(data: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
