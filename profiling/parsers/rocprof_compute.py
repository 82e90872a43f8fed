"""rocprof-compute (formerly Omniperf) workload folder -> kernel table + roofline ceilings.

`profiling/run_rocprof_compute.sh` runs
    rocprof-compute profile -n TAG -p OUT/rocprof-compute/TAG [--roof-only] -- python ...
which leaves a workload folder with (documented in rocprofiler-compute's
docs/how-to/profile/mode.rst and src/utils/utils.py):
  roofline.csv   measured ceilings of THIS GPU (GB/s, GFLOP/s), one row per device,
                 written by the rocm-amdgpu-bench `roofline` binary. Three header
                 variants exist, two with typos ("hbmBwHigh", "MFMAFI8OpsLow").
  pmc_perf.csv   one row per dispatch, one column per hardware counter.
  sysinfo.csv    the GPU (gpu_model, gpu_arch, cu_per_gpu, lds_banks_per_cu, ...).
  timestamps.csv start/end per dispatch (absent with the rocprofv3 backend,
                 where pmc_perf.csv carries Start_Timestamp/End_Timestamp itself).

FLOPs and bytes use rocprof-compute's own formulas (src/utils/roofline_calc.py,
calc_ai), so our numbers line up with its roofline plots.
"""
from __future__ import annotations

from pathlib import Path

from . import kernel_table as kt
from .readers import dict_records, number

SOURCE = "rocprof-compute"
_TYPOS = {"mfmafi8ops": "MFMAI8Ops"}  # "MFMAFI8OpsLow" next to "MFMAI8Ops" in every variant


# ----------------------------------------------------------------- roofline.csv
def read_roofline(path) -> dict[int, dict[str, dict]]:
    """{device: {metric: {"value", "low", "high"}}} with metric names like
    HBMBw, L2Bw, LDSBw (GB/s), FP32Flops, MFMABF16Flops, MFMAI8Ops (GFLOP/s, GOP/s).

    A ceiling of 0 means "not supported on this GPU" (e.g. MALL on MI200).
    """
    records = dict_records(path, ("device",), what="rocprof-compute roofline.csv")
    result = {}
    for rec in records:
        columns = [c for c in rec if c != "device"]
        means = {c.lower(): c for c in columns if not c.endswith(("Low", "High"))}
        metrics: dict[str, dict] = {}
        for column in columns:
            base, kind = column, "value"
            for suffix in ("Low", "High"):
                if column.endswith(suffix):
                    base, kind = column[: -len(suffix)], suffix.lower()
            key = _TYPOS.get(base.lower()) or means.get(base.lower(), base)
            metrics.setdefault(key, {})[kind] = number(rec[column])
        result[int(number(rec["device"]) or 0)] = metrics
    return result


def describe_ceilings(metrics: dict[str, dict]) -> str:
    """'HBM 1388.8 GB/s | L2 5016.2 GB/s | ... | MFMA BF16 170.5 TFLOP/s' (zeros left out)."""
    parts = []
    for name, vals in metrics.items():
        value = vals.get("value")
        if not value:
            continue
        if name.endswith("Bw"):
            parts.append(f"{name[:-2]} {value:.1f} GB/s")
        elif name.endswith(("Flops", "Ops")):
            unit = "TFLOP/s" if name.endswith("Flops") else "TOP/s"
            label = name.replace("Flops", "").replace("Ops", "").replace("MFMA", "MFMA ")
            parts.append(f"{label} {value / 1000:.1f} {unit}")
    return " | ".join(parts)


# ----------------------------------------------------------------- pmc_perf.csv
def _c(rec: dict, name: str) -> float:
    return number(rec.get(name)) or 0.0


def dispatch_flops(rec: dict) -> float | None:
    """VALU: 64 lanes x (add + mul + 2 fma + trans); MFMA: 512 FLOPs per MOPS unit."""
    if not any(k.startswith("SQ_INSTS_VALU") for k in rec):
        return None
    valu = sum(64 * (_c(rec, f"SQ_INSTS_VALU_ADD_{t}") + _c(rec, f"SQ_INSTS_VALU_MUL_{t}")
                     + 2 * _c(rec, f"SQ_INSTS_VALU_FMA_{t}") + _c(rec, f"SQ_INSTS_VALU_TRANS_{t}"))
               for t in ("F16", "F32", "F64"))
    mfma = 512 * sum(_c(rec, f"SQ_INSTS_VALU_MFMA_MOPS_{t}")
                     for t in ("F16", "BF16", "F32", "F64", "F8"))
    return valu + mfma


def dispatch_hbm_bytes(rec: dict) -> float | None:
    """HBM traffic from the L2 (TCC) <-> memory (EA) request counters."""
    if "TCC_EA0_RDREQ_sum" in rec:  # MI300: one EA per XCD, plus "bubble" 128-byte reads
        bubble = _c(rec, "TCC_BUBBLE_sum")
        rd, rd32 = _c(rec, "TCC_EA0_RDREQ_sum"), _c(rec, "TCC_EA0_RDREQ_32B_sum")
        wr, wr64 = _c(rec, "TCC_EA0_WRREQ_sum"), _c(rec, "TCC_EA0_WRREQ_64B_sum")
        return 128 * bubble + 32 * rd32 + 64 * (rd - bubble - rd32) + 32 * (wr - wr64) + 64 * wr64
    if "TCC_EA_RDREQ_sum" in rec:  # MI200
        rd, rd32 = _c(rec, "TCC_EA_RDREQ_sum"), _c(rec, "TCC_EA_RDREQ_32B_sum")
        wr, wr64 = _c(rec, "TCC_EA_WRREQ_sum"), _c(rec, "TCC_EA_WRREQ_64B_sum")
        return 32 * rd32 + 64 * (rd - rd32) + 64 * wr64 + 32 * (wr - wr64)
    return None


def dispatch_cache_bytes(rec: dict, lds_banks_per_cu: int = 32) -> dict:
    """L1, L2 and LDS traffic, for a multi-level roofline."""
    l2 = 64 * sum(_c(rec, f"TCP_TCC_{k}_REQ_sum")
                  for k in ("READ", "WRITE", "ATOMIC_WITH_RET", "ATOMIC_WITHOUT_RET"))
    return {"l1_bytes": 64 * _c(rec, "TCP_TOTAL_CACHE_ACCESSES_sum"), "l2_bytes": l2,
            "lds_bytes": (_c(rec, "SQ_LDS_IDX_ACTIVE") - _c(rec, "SQ_LDS_BANK_CONFLICT"))
            * 4 * lds_banks_per_cu}


def _durations_from_timestamps(folder: Path) -> dict[str, float]:
    path = folder / "timestamps.csv"
    if not path.is_file():
        return {}
    return {r["Dispatch_ID"]: number(r["End_Timestamp"]) - number(r["Start_Timestamp"])
            for r in dict_records(path, ("Dispatch_ID", "Start_Timestamp", "End_Timestamp"),
                                  what="rocprof-compute timestamps.csv")}


def read_pmc_perf(path, lds_banks_per_cu: int = 32) -> list[dict]:
    """One dict per dispatch: kernel, duration_ns, flops, hbm_bytes, l1/l2/lds bytes."""
    path = Path(path)
    records = dict_records(path, ("Kernel_Name",), what="rocprof-compute pmc_perf.csv")
    fallback = _durations_from_timestamps(path.parent)
    out = []
    for rec in records:
        duration = None
        for start, end in (("Start_Timestamp", "End_Timestamp"), ("BeginNs", "EndNs")):
            if rec.get(start) and rec.get(end):
                duration = number(rec[end]) - number(rec[start])
                break
        if duration is None:
            duration = fallback.get(rec.get("Dispatch_ID", ""))
        out.append({"dispatch": rec.get("Dispatch_ID"), "kernel": rec["Kernel_Name"],
                    "duration_ns": duration, "flops": dispatch_flops(rec),
                    "hbm_bytes": dispatch_hbm_bytes(rec),
                    **dispatch_cache_bytes(rec, lds_banks_per_cu)})
    return out


def read_sysinfo(path) -> dict:
    records = dict_records(path, ("gpu_model",), what="rocprof-compute sysinfo.csv")
    return records[0] if records else {}


def find_workload(folder) -> Path:
    """The folder holding pmc_perf.csv (with -p it may sit one level down, in <gpu_model>/)."""
    folder = Path(folder)
    hits = sorted(folder.rglob("pmc_perf.csv"))
    if not hits:
        raise kt.ProfileParseError(f"{folder}: no pmc_perf.csv (not a rocprof-compute workload?)")
    return hits[0].parent


def parse(path) -> kt.KernelTable:
    path = Path(path)
    workload = find_workload(path) if path.is_dir() else path.parent
    pmc = workload / "pmc_perf.csv" if path.is_dir() else path
    sysinfo = read_sysinfo(workload / "sysinfo.csv") if (workload / "sysinfo.csv").is_file() else {}
    banks = int(number(sysinfo.get("lds_banks_per_cu")) or 32)
    launches = [kt.Launch(d["kernel"], d["duration_ns"], d["flops"], d["hbm_bytes"])
                for d in read_pmc_perf(pmc, banks)]
    notes = []
    if sysinfo:
        notes.append(f"GPU: {sysinfo.get('gpu_model', '?')} ({sysinfo.get('gpu_arch', '?')})")
    roofline = workload / "roofline.csv"
    if roofline.is_file():
        for device, metrics in read_roofline(roofline).items():
            notes.append(f"measured ceilings, device {device}: {describe_ceilings(metrics)}")
    return kt.from_launches(launches, SOURCE, files=[pmc], notes=notes)
