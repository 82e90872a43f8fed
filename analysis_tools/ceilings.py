"""ceilings: read a ceilings file - this device's measured matmul peak per
precision and copy bandwidth (and, with --sweep, bandwidth against working-set
size, where the caches show up as plateaus) beside the datasheet peaks.

The probe that measures them and writes the file is benchmarks/ceilings.py
(`python -m benchmarks.ceilings`, the same probe `--measure-peak` uses for
MFU); this module only reads what it wrote: a table, the bandwidth plot, and
the file the roofline draws its roof from.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .common import AnalysisError, out_dir_default, plt, save_figure, text_table

MEASURE = "python -m benchmarks.ceilings"  # the probe that writes a ceilings file


def load_ceilings(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file; measure this device's ceilings with "
                            f"`{MEASURE}`") from None
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or "measured" not in data:
        raise AnalysisError(f"{path}: not a ceilings file (no 'measured' key); "
                            f"make one with `{MEASURE}`")
    return data


def find_measured_ceilings(device_name: str | None, out_dir=None) -> Path | None:
    """A ceilings.json written by the probe on this very device."""
    folders = [Path(out_dir)] if out_dir else []
    folders.append(out_dir_default())
    for folder in folders:
        path = folder / "ceilings.json"
        if not path.is_file():
            continue
        try:
            data = load_ceilings(path)
        except AnalysisError:
            continue
        if device_name is None or data.get("device", {}).get("name") == device_name:
            return path
    return None


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


def format_ceilings(data: dict) -> str:
    """The device line and the measured-vs-datasheet table, as text."""
    return "\n".join([f"device: {data['device']['name']} ({data['device']['backend']})",
                      text_table(ceilings_table(data), {"measured": ",.2f", "datasheet": ",.2f",
                                                        "measured / datasheet %": ".0f"})])


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
