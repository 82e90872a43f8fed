"""scaling: how well N GPUs did against one, from the results JSONs of a
1-GPU run and of torchrun runs (DDP, FSDP2) of the same per-GPU batch; and,
from a PyTorch profiler trace per rank, how much of the communication kernels'
time hid behind compute.

    python -m analysis_tools scaling single.json ddp.json [fsdp.json ...] [--json out.json]
    python -m analysis_tools overlap rank0/pytorch/*.pt.trace.json

The runs come from training/parallel.py (the DDP/FSDP2 wrapping) and record
the communication probe of training/parallel.py; docs/MULTI_GPU.md explains both.
"""
from __future__ import annotations

from harness.errors import UsageError
from harness.results import numbers
from training.parallel import BUCKET_MB, DEFAULTS


# ---------------------------------------------------------------- scaling efficiency
def scaling(single: dict, multi: dict) -> dict:
    """Efficiency = global tokens/s / (N x tokens/s of one GPU at the same per-GPU batch).

    100% means N GPUs do N times the work per second; what is lost is
    communication that backward could not hide, plus waiting for the slowest rank.
    """
    n = multi["run"].get("world_size", 1)
    mismatched = [k for k in ("batch_size", "seq_len", "precision", "grad_accum", "compile",
                              "compile_mode", "optimizer")
                  if single["run"].get(k) != multi["run"].get(k)]
    if single["run"].get("world_size", 1) != 1 or mismatched or single["config"] != multi["config"]:
        what = ", ".join(mismatched) or ("model config" if single["config"] != multi["config"]
                                         else "world size of the baseline")
        raise UsageError(f"not comparable to the 1-GPU baseline (differs in {what}): "
                         f"use the same model and per-GPU batch")
    (tps_1, step_1), (tps_n, step_n) = ((m["tokens_per_s"], m["step_ms"])
                                        for m in (numbers(single), numbers(multi)))
    comm = (multi.get("distributed") or {}).get("communication") or {}
    return {"kind": multi["run"].get("parallel", "single"), "variant": variant(multi),
            "world_size": n,
            "global_batch_size": multi["run"].get("global_batch_size"),
            "tokens_per_s": tps_n, "tokens_per_s_per_gpu": tps_n / n,
            "efficiency": tps_n / (n * tps_1) if tps_1 and tps_n else None,
            "step_ms": step_n, "extra_ms_vs_1gpu": step_n - step_1,
            "comm_ms_if_not_overlapped": comm.get("per_step_ms"),
            "bus_bandwidth_gb_s": comm.get("bus_bandwidth_gb_s")}


def variant(result: dict) -> str:
    """The data-parallel knobs of a run, in words (older results: the defaults they ran with)."""
    d = result.get("distributed") or {}
    if d.get("kind") == "fsdp2":
        keep = not d.get("reshard_after_forward", True)
        dtype = [f"{d['param_dtype']} parameters"] if d.get("param_dtype", "fp32") != "fp32" else []
        return ", ".join(["keep weights fwd->bwd" if keep else "reshard after fwd", *dtype,
                          *_priority(d)])
    if d.get("kind") != "ddp":
        return ""
    if d.get("shard_optimizer"):  # no DDP buckets: one reduce-scatter, one all-gather
        return ", ".join(["sharded optimizer (reduce-scatter + all-gather)", *_priority(d)])
    if d.get("reduce_after_backward"):  # no DDP buckets: the all-reduce after the backward
        return ", ".join(["all-reduce after backward", *_priority(d)])
    parts = [f"bucket {d.get('bucket_cap_mb', BUCKET_MB):g} MB"]
    if d.get("comm_hook", "none") != "none":
        parts.append(f"{d['comm_hook']} all-reduce")
    if result["run"].get("compile"):
        parts.append("one graph" if d.get("compile_ddp") == "whole" else "graph split per bucket")
    parts += _priority(d)
    if d.get("static_graph"):
        parts.append("static graph")
    if "NCCL_MAX_NCHANNELS" in d.get("env", {}):
        parts.append(f"NCCL <= {d['env']['NCCL_MAX_NCHANNELS']} channels")
    return ", ".join(parts)


def _priority(d: dict) -> list[str]:
    """The communication stream's priority where it is not the default (results from before
    --comm-priority existed ran at normal priority)."""
    priority = d.get("comm_priority", "normal")
    return [] if priority == DEFAULTS["comm_priority"] else [f"{priority}-priority comm stream"]


COLUMNS = (  # header, key in a scaling() row, format; text columns are left-aligned
    ("run", "kind", "s"), ("variant", "variant", "s"), ("GPUs", "world_size", "d"),
    ("global batch", "global_batch_size", "d"),
    ("tokens/s", "tokens_per_s", ",.0f"), ("tok/s/GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("efficiency", "efficiency", ".1%"), ("step ms", "step_ms", ".2f"),
    ("+ms vs 1 GPU", "extra_ms_vs_1gpu", ".2f"),
    ("comm ms alone", "comm_ms_if_not_overlapped", ".2f"),
    ("bus GB/s", "bus_bandwidth_gb_s", ".1f"))


def format_scaling(single: dict, rows: list[dict]) -> str:
    m = numbers(single)
    tps = m["tokens_per_s"]
    base = {"kind": "1 GPU", "variant": "", "world_size": 1,
            "global_batch_size": single["run"].get("global_batch_size"), "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps, "efficiency": 1.0, "step_ms": m["step_ms"]}
    cells = [[h for h, _, _ in COLUMNS]]
    cells += [["n/a" if r.get(key) is None else format(r[key], spec) for _, key, spec in COLUMNS]
              for r in [base, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if spec == "s" else c.rjust(w)
                       for c, w, (_, _, spec) in zip(row, widths, COLUMNS)).rstrip()
             for row in cells]
    run, d = single["run"], single["device"]
    return "\n".join([f"device: {d['name']} ({d['backend']}), torch {d['torch']}, "
                      f"{single['version']}, per-GPU batch {run['batch_size']} x "
                      f"seq {run['seq_len']}, {run['precision']}, "
                      f"{'compiled' if run.get('compile') else 'eager'}",
                      lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


# ---------------------------------------------------------------- overlap, from a profiler trace
def communication_overlap(trace_path) -> dict:
    """How much of the NCCL/RCCL kernel time ran while compute kernels ran too.

    Reads the PyTorch profiler trace that `--profile pytorch` writes per rank.
    Communication kernels are the ones named nccl* (RCCL keeps NCCL's names);
    every other kernel counts as compute. Overlapped = time in which a
    communication kernel and at least one compute kernel ran at once; exposed =
    communication time with no compute beside it, which the step pays in full.
    A communication kernel also runs while it waits for the slower rank, so
    exposed time includes waiting for a straggler.

    Which side paces the rank: the host's median step (the profiler's
    ProfilerStep ranges on the CPU) against the GPU's, and the GPU's idle time,
    in which no kernel ran at all: a GPU waiting for the host to queue work.
    The profiler itself slows the host, so both read high against an unprofiled run.
    """
    from profiling.parsers.kernel_table import ProfileParseError
    from profiling.parsers.torch_profiler import kernels_launched_in, profiler_steps, trace_events

    try:
        events = trace_events(trace_path)
    except ProfileParseError as e:
        raise UsageError(str(e)) from None
    step_ranges = profiler_steps(events)
    kernels = [(e["ts"], e["ts"] + e.get("dur", 0), "nccl" in str(e.get("name", "")).lower())
               for e in kernels_launched_in(events, step_ranges)]
    if not kernels:
        raise UsageError(f"{trace_path}: no GPU kernels in this trace (a CPU run?)")
    comm = _union([(a, b) for a, b, is_comm in kernels if is_comm])
    compute = _union([(a, b) for a, b, is_comm in kernels if not is_comm])
    host_steps = sorted(b - a for a, b in step_ranges)
    steps = len(host_steps) or 1
    comm_us, overlapped_us = _length(comm), _overlap(comm, compute)
    window_us = max(b for _, b, _ in kernels) - min(a for a, _, _ in kernels)

    def per_step(us: float) -> float:  # microseconds in the trace -> ms per step
        return us / 1000 / steps
    return {"trace": str(trace_path), "steps": steps,
            "comm_kernels": sum(is_comm for _, _, is_comm in kernels),
            "comm_ms_per_step": per_step(comm_us),
            "overlapped_ms_per_step": per_step(overlapped_us),
            "exposed_ms_per_step": per_step(comm_us - overlapped_us),
            "overlap_fraction": overlapped_us / comm_us if comm_us else None,
            "compute_ms_per_step": per_step(_length(compute)),
            "gpu_window_ms_per_step": per_step(window_us),
            "gpu_idle_ms_per_step": per_step(window_us - _length(_union(comm + compute))),
            "host_step_ms": host_steps[len(host_steps) // 2] / 1000 if host_steps else None}


def _union(intervals) -> list[list[float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a, b) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def format_overlap(row: dict) -> str:
    share = "n/a" if row["overlap_fraction"] is None else f"{row['overlap_fraction']:.0%}"
    return (f"{row['trace']}: {row['steps']} steps; communication kernels "
            f"{row['comm_ms_per_step']:.2f} ms/step, {row['overlapped_ms_per_step']:.2f} ms "
            f"({share}) beside compute, {row['exposed_ms_per_step']:.2f} ms exposed; compute "
            f"kernels {row['compute_ms_per_step']:.2f} ms/step in a "
            f"{row['gpu_window_ms_per_step']:.2f} ms/step GPU window, "
            f"{row['gpu_idle_ms_per_step']:.2f} ms of it idle; the host's median step "
            + ("n/a" if row["host_step_ms"] is None else f"{row['host_step_ms']:.2f} ms"))
