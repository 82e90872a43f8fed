"""Data parallelism through torchrun: DDP, or FSDP2 with --fsdp. One process per GPU.

    torchrun --nproc-per-node 2 version4_sdpa/tiny_llama_v4.py --preset medium

torchrun starts N copies of the same script and tells each one, in environment
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), who it is
and where to meet the others. Each copy then

  1. joins a process group: backend "nccl" on a GPU (on ROCm the same name
     loads RCCL), "gloo" on the CPU;
  2. builds the same model from the same seed and wraps it:
     - DDP keeps a full replica on every GPU. During backward it averages the
       gradients across GPUs with all-reduce, in ~25 MB buckets, each one sent
       as soon as its gradients are ready - so communication overlaps compute;
     - FSDP2 (--fsdp) keeps only 1/N of every parameter, gradient and optimizer
       state per GPU. It all-gathers a block's weights just before the block
       runs (forward and again in backward) and reduce-scatters its gradients;
  3. trains on its own slice of the global batch (see harness/data.py).

Rank 0 prints and writes the results; the others gather their timings to it.
Started with plain `python`, none of this happens: `SingleProcess` below is what
the trainer gets, and it talks to both through the same methods.

Knobs (docs/MULTI_GPU.md, "Tuning DDP"): --ddp-bucket-mb, --ddp-comm-hook,
--compile-ddp for DDP; --fsdp-reshard-after-forward for FSDP2.

Run as a module to compare runs (scaling efficiency), or to see in a PyTorch
profiler trace how much of the NCCL time hid behind compute:
    python -m harness.distributed single.json ddp.json [fsdp.json ...] [--json out.json]
    python -m harness.distributed overlap rank0/pytorch/*.pt.trace.json
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import inspect
import json
import math
import os
import sys
import time
from types import SimpleNamespace

import torch

from . import device as dev
from . import measure
from .config import PRECISIONS, RunSettings
from .errors import UsageError

BUCKET_MB = 25  # DDP's default gradient bucket (--ddp-bucket-mb); FSDP2's comm is timed in these
# Knobs that only one wrapper reads, with their flags: asking for one that will not
# be used is an error under torchrun, and a note without it (see check_knobs).
DDP_KNOBS = {"ddp_bucket_mb": "--ddp-bucket-mb", "ddp_comm_hook": "--ddp-comm-hook",
             "compile_ddp": "--compile-ddp", "ddp_static_graph": "--ddp-static-graph"}
FSDP_KNOBS = {"fsdp_reshard_after_forward": "--fsdp-reshard-after-forward"}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunSettings)}
BUS_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (N-1)/N, as nccl-tests
ENV_PREFIXES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_")  # recorded with the results


class SingleProcess:
    """One process, nothing to synchronise: every method is the identity."""
    rank, world_size, is_main, kind, device, extra = 0, 1, True, "single", None, None

    def wrap(self, model, settings):
        return model

    def no_sync(self, model, micro_step):
        return contextlib.nullcontext()

    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def check_gradient_flow(self, model) -> int:
        return measure.check_gradient_flow(model)

    def aggregate_timing(self, timing: dict) -> dict:
        return timing

    def close(self):
        pass


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def check_knobs(settings, under_torchrun: bool) -> None:
    """DDP knobs need DDP, FSDP knobs need --fsdp.

    Without torchrun there is one process and nothing to tune: the knobs are
    ignored with a note, so the 1-GPU baseline can take the same flags as the
    multi-GPU run. Under torchrun, a knob the chosen wrapper never reads is
    almost certainly a mistake, so it stops the run (exit code 2).
    """
    ddp_set = [flag for name, flag in DDP_KNOBS.items() if getattr(settings, name) != DEFAULTS[name]]
    fsdp_set = [flag for name, flag in FSDP_KNOBS.items()
                if getattr(settings, name) != DEFAULTS[name]]
    if not under_torchrun:
        if ddp_set or fsdp_set:
            print(f"note: {', '.join(ddp_set + fsdp_set)} only act under torchrun; ignored in "
                  f"this single-process run", file=sys.stderr)
        return
    wrong = ddp_set if settings.fsdp else fsdp_set
    if wrong:
        raise UsageError(f"{', '.join(wrong)} configure{'s' if len(wrong) == 1 else ''} "
                         f"{'DDP' if settings.fsdp else 'FSDP2 (--fsdp)'}, but this run uses "
                         f"{'FSDP2' if settings.fsdp else 'DDP'}: drop "
                         f"{'it' if len(wrong) == 1 else 'them'}")


def setup(settings):
    """SingleProcess under plain python; a joined DataParallel under torchrun."""
    if not launched_by_torchrun():
        if settings.fsdp:
            raise UsageError("--fsdp shards the model over several processes: launch with "
                             "torchrun --nproc-per-node N <script> --fsdp ...")
        check_knobs(settings, under_torchrun=False)
        return SingleProcess()
    check_knobs(settings, under_torchrun=True)
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("this PyTorch build has no torch.distributed: run without torchrun")
    fully_shard = find_fully_shard() if settings.fsdp else None  # fail before joining
    device = dev.resolve_device(settings.device)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if device.type == "cuda":
        if local_size > torch.cuda.device_count():
            raise UsageError(f"torchrun started {local_size} processes on this node but only "
                             f"{torch.cuda.device_count()} GPUs are visible: use one process "
                             f"per GPU (--nproc-per-node {torch.cuda.device_count()})")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # device_id binds this process to its GPU and lets NCCL connect right away.
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return DataParallel(settings, device, backend, fully_shard)


def find_fully_shard():
    """FSDP2's entry point: public since torch 2.6, under _composable in 2.4-2.5."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            raise UsageError(f"--fsdp needs FSDP2 (fully_shard, torch >= 2.4); torch "
                             f"{torch.__version__} lacks it: run without --fsdp for DDP") from None
    return fully_shard


class DataParallel(SingleProcess):
    def __init__(self, settings, device: torch.device, backend: str, fully_shard=None):
        import torch.distributed as dist

        self.dist, self.device, self.fully_shard = dist, device, fully_shard
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.kind = "fsdp2" if fully_shard else "ddp"
        self.grad_accum = settings.grad_accum
        self.bucket_mb, self.comm_hook = settings.ddp_bucket_mb, settings.ddp_comm_hook
        self.static_graph = settings.ddp_static_graph
        self.compile_ddp = settings.compile_ddp if settings.compile else None  # only compile reads it
        self.reshard_after_forward = settings.fsdp_reshard_after_forward
        if self.is_main and self.compile_ddp is None and settings.compile_ddp != "split":
            print("note: --compile-ddp only acts with --compile; ignored", file=sys.stderr)
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.gradient_numel = 0
        self.extra = {
            "launcher": "torchrun", "kind": self.kind, "backend": backend,
            "world_size": self.world_size, "nodes": self.world_size // local_size,
            "processes_per_node": local_size,
            "per_device_batch_size": settings.batch_size, "grad_accum": settings.grad_accum,
            "global_batch_size": settings.batch_size * settings.grad_accum * self.world_size,
            **({"bucket_cap_mb": self.bucket_mb, "comm_hook": self.comm_hook,
                "compile_ddp": self.compile_ddp, "static_graph": self.static_graph}
               if self.kind == "ddp" else
               {"reshard_after_forward": self.reshard_after_forward}),
            "nccl_version": _nccl_version() if backend == "nccl" else None,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        }

    # ------------------------------------------------------------ the model
    def wrap(self, model, settings):
        trained = [p for p in model.parameters() if p.requires_grad]
        self.gradient_numel = sum(p.numel() for p in trained)
        # Gradients have their parameter's dtype: fp32, or bf16 for most of them
        # with --optimizer master. The comm probe times the dtype that dominates.
        numel_by_dtype = collections.Counter()
        for p in trained:
            numel_by_dtype[p.dtype] += p.numel()
        self.gradient_dtype = max(numel_by_dtype, key=numel_by_dtype.get, default=torch.float32)
        if self.kind == "ddp":
            return self._wrap_ddp(model)
        if not hasattr(model, "layers"):
            raise UsageError("--fsdp shards one transformer block at a time and needs model.layers")
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        # One FSDP unit per block: only one block's full weights exist at a time,
        # and the next block's all-gather overlaps this block's compute.
        # reshard_after_forward=False keeps each block's gathered weights from
        # forward until its backward: one all-gather per block fewer, more memory.
        for block in model.layers:
            self.fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        self.fully_shard(model, mesh=mesh)  # the rest: embeddings, final norm, output head
        return model

    def _wrap_ddp(self, model):
        from torch.nn.parallel import DistributedDataParallel

        if self.compile_ddp is not None:
            # torch.compile of a DDP model: Dynamo's DDPOptimizer cuts the graph at
            # bucket boundaries, so each bucket's all-reduce can start while the
            # rest of backward runs ("split"); "whole" compiles one graph whose
            # gradients all appear at its end, then all-reduces them.
            import torch._dynamo

            torch._dynamo.config.optimize_ddp = self.compile_ddp == "split"
        # DDP broadcasts rank 0's weights at construction, so replicas start equal.
        # broadcast_buffers=False: our only buffers are the RoPE tables, equal
        # on every rank, so re-broadcasting them before every forward is a
        # wasted collective (and a sync point). gradient_as_bucket_view: the
        # gradients live inside the all-reduce buckets instead of being copied in.
        # static_graph (--ddp-static-graph): every step uses every parameter in the
        # same order, so DDP can fix its bucket order after the first step.
        # (torch 2.13 renamed broadcast_buffers to forward_sync_buffers.)
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                          inspect.signature(DistributedDataParallel).parameters
                          else {"broadcast_buffers": False})
        ddp = DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_mb, gradient_as_bucket_view=True,
            static_graph=self.static_graph, **no_buffer_sync)
        if self.comm_hook != "none":
            self._register_comm_hook(ddp)
        return ddp

    def _register_comm_hook(self, ddp) -> None:
        """--ddp-comm-hook: all-reduce the gradients in 16 bits.

        The hook casts each fp32 bucket to bf16/fp16, all-reduces it, divides by
        the world size and writes the result back into the fp32 gradients: half
        the bytes on the wire, an average rounded to 16 bits. DDP accepts the
        bf16 hook only with NCCL/RCCL, and a backend may lack 16-bit all-reduce:
        both stop here in one line instead of a traceback in the first backward.
        """
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        try:
            # One tiny all-reduce in the wire type now (every rank does it together).
            self.dist.all_reduce(torch.zeros(1, dtype=PRECISIONS[self.comm_hook].dtype,
                                             device=self.device))
            hook = getattr(default_hooks, f"{self.comm_hook}_compress_hook")
            ddp.register_comm_hook(None, hook)  # None: the default (whole-world) group
        except (RuntimeError, TypeError) as e:
            other = "fp16 or none" if self.comm_hook == "bf16" else "none"
            raise UsageError(f"--ddp-comm-hook {self.comm_hook} does not work with the "
                             f"{self.extra['backend']} backend here "
                             f"({str(e).splitlines()[0][:120]}); use --ddp-comm-hook {other}"
                             ) from None

    def no_sync(self, model, micro_step):
        """Gradient accumulation: communicate only on the last micro-step."""
        if micro_step == self.grad_accum - 1:
            return contextlib.nullcontext()
        return model.no_sync() if self.kind == "ddp" else _fsdp_no_sync(model)

    # ------------------------------------------------------------ results
    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        total = values.detach().clone()
        self.dist.all_reduce(total)  # SUM: the one reduction every backend has (gloo lacks AVG)
        return total / self.world_size

    def check_gradient_flow(self, model) -> int:
        if self.kind == "ddp":
            # After the all-reduce every replica holds the full averaged gradient.
            return measure.check_gradient_flow(model.module)
        return measure.check_gradient_flow(self._sharded_gradient_summary(model))

    def _sharded_gradient_summary(self, model):
        """FSDP2 gradients are sharded: each rank holds a slice (maybe empty) of each.

        Summarise every parameter by three sums over all ranks - has a gradient,
        non-finite entries, sum of |g| - in one all-reduce, and hand
        measure.check_gradient_flow one number per parameter in a stand-in that
        has just what it reads (named_parameters, requires_grad, grad).
        """
        names, rows = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            names.append(name)
            if p.grad is None:
                rows.append(torch.zeros(3, device=self.device))
                continue
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            rows.append(torch.stack([torch.ones((), device=local.device),
                                     (~torch.isfinite(local)).sum().float(),
                                     local.float().abs().sum()]))
        sums = torch.stack(rows).to(self.device)
        self.dist.all_reduce(sums)
        params = [(name, SimpleNamespace(requires_grad=True, grad=None if has == 0 else
                                         torch.tensor([math.nan if bad else size])))
                  for name, (has, bad, size) in zip(names, sums.tolist())]
        return SimpleNamespace(named_parameters=lambda: iter(params))

    def aggregate_timing(self, timing: dict) -> dict:
        """Every rank's medians go into `distributed`; the slowest rank sets the pace.

        Ranks wait for each other at every gradient all-reduce, so throughput is
        set by the slowest one: for each phase we report that rank's statistics.
        """
        per_rank = [None] * self.world_size
        self.dist.all_gather_object(per_rank, timing)
        self.extra["per_rank_median_ms"] = {phase: [t[phase]["median"] for t in per_rank]
                                            for phase in timing}
        self.extra["communication"] = self.measure_communication()
        return {phase: max((t[phase] for t in per_rank), key=lambda s: s["median"] or 0.0)
                for phase in timing}

    # ------------------------------------------------------------ communication
    def measure_communication(self, reps: int = 10) -> dict:
        """Time the collectives of one step alone, after training.

        Method: one gradient-bucket-sized buffer (--ddp-bucket-mb of the
        gradients' dtype for DDP - fp32, or bf16 with --optimizer master - 25 MB
        of fp32 for FSDP2, or the whole model if smaller; in 16 bits with
        --ddp-comm-hook), timed over `reps` calls after two warm-up calls, the
        slowest rank's mean, scaled by the number of buckets the model fills.
        DDP: one all-reduce of all gradients per step. FSDP2: two all-gathers of
        the weights (forward and backward) and one reduce-scatter of the gradients.
        This is the cost if nothing overlapped; DDP hides most of it behind
        backward, and the part it cannot hide is (multi-GPU step - 1-GPU step):
        `python -m harness.distributed` prints both.
        Bus bandwidth follows the nccl-tests convention (comparable across N).
        """
        n = self.world_size
        ddp = self.kind == "ddp"
        hooked = ddp and self.comm_hook != "none"  # --ddp-comm-hook names a precision
        wire = (PRECISIONS[self.comm_hook].dtype if hooked else
                self.gradient_dtype if ddp else torch.float32)
        # DDP fills its buckets in the gradients' own dtype; a hook converts each bucket after.
        held = (self.gradient_dtype if ddp else torch.float32).itemsize
        numel = min(self.gradient_numel, int((self.bucket_mb if ddp else BUCKET_MB) * 2**20 // held))
        numel = max(n, numel - numel % n)  # divisible by n for all-gather / reduce-scatter
        buckets = math.ceil(self.gradient_numel / numel)
        full = torch.ones(numel, device=self.device, dtype=wire)
        shard = torch.ones(numel // n, device=self.device)
        if ddp:
            ops = {"all_reduce": self._time(lambda: self.dist.all_reduce(full), reps)}
            per_step = ops["all_reduce"] * buckets
        else:
            # all_gather_single/reduce_scatter_single: the newer names (torch 2.13+)
            all_gather = getattr(self.dist, "all_gather_single", self.dist.all_gather_into_tensor)
            reduce_scatter = getattr(self.dist, "reduce_scatter_single",
                                     self.dist.reduce_scatter_tensor)
            ops = {"all_gather": self._time(lambda: all_gather(full, shard), reps),
                   "reduce_scatter": self._time(lambda: reduce_scatter(shard, full), reps)}
            per_step = (2 * ops["all_gather"] + ops["reduce_scatter"]) * buckets
        nbytes = numel * full.element_size()
        busbw = {op: nbytes / ms / 1e6 * BUS_FACTOR[op] * (n - 1) / n for op, ms in ops.items()}
        return {"method": f"{reps} timed calls on an idle device, slowest rank, "
                          f"x {buckets} buckets; not overlapped with compute",
                "bucket_mib": nbytes / 2**20, "buckets": buckets,
                "gradient_mib": self.gradient_numel * held / 2**20,
                "ms_per_bucket": ops, "per_step_ms": per_step,
                "bus_bandwidth_gb_s_per_op": busbw,
                "bus_bandwidth_gb_s": next(iter(busbw.values()))}  # all-reduce / all-gather

    def _time(self, collective, reps: int) -> float:
        for _ in range(2):  # the first calls set up connections and buffers
            collective()
        dev.synchronize(self.device)
        self.dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            collective()
        dev.synchronize(self.device)
        ms = torch.tensor([(time.perf_counter() - start) * 1000 / reps], device=self.device)
        self.dist.all_reduce(ms, op=self.dist.ReduceOp.MAX)
        return ms.item()

    def close(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)  # keep unsharded grads, skip the reduce-scatter
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL/RCCL: just record nothing
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


# ---------------------------------------------------------------- scaling efficiency
def scaling(single: dict, multi: dict) -> dict:
    """Efficiency = global tokens/s / (N x tokens/s of one GPU at the same per-GPU batch).

    100% means N GPUs do N times the work per second; what is lost is
    communication that backward could not hide, plus waiting for the slowest rank.
    """
    n = multi["run"].get("world_size", 1)
    mismatched = [k for k in ("batch_size", "seq_len", "precision", "grad_accum", "compile")
                  if single["run"].get(k) != multi["run"].get(k)]
    if single["run"].get("world_size", 1) != 1 or mismatched or single["config"] != multi["config"]:
        what = ", ".join(mismatched) or ("model config" if single["config"] != multi["config"]
                                         else "world size of the baseline")
        raise UsageError(f"not comparable to the 1-GPU baseline (differs in {what}): "
                         f"use the same model and per-GPU batch")
    tps_1, tps_n = single["throughput"]["tokens_per_s"], multi["throughput"]["tokens_per_s"]
    step_1, step_n = single["timing_ms"]["step"]["median"], multi["timing_ms"]["step"]["median"]
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
        return "keep weights fwd->bwd" if keep else "reshard after fwd"
    if d.get("kind") != "ddp":
        return ""
    parts = [f"bucket {d.get('bucket_cap_mb', BUCKET_MB):g} MB"]
    if d.get("comm_hook", "none") != "none":
        parts.append(f"{d['comm_hook']} all-reduce")
    if result["run"].get("compile"):
        parts.append("one graph" if d.get("compile_ddp") == "whole" else "graph split per bucket")
    if d.get("static_graph"):
        parts.append("static graph")
    if "NCCL_MAX_NCHANNELS" in d.get("env", {}):
        parts.append(f"NCCL <= {d['env']['NCCL_MAX_NCHANNELS']} channels")
    return ", ".join(parts)


COLUMNS = (  # header, key in a scaling() row, format; text columns are left-aligned
    ("run", "kind", "s"), ("variant", "variant", "s"), ("GPUs", "world_size", "d"),
    ("global batch", "global_batch_size", "d"),
    ("tokens/s", "tokens_per_s", ",.0f"), ("tok/s/GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("efficiency", "efficiency", ".1%"), ("step ms", "step_ms", ".2f"),
    ("+ms vs 1 GPU", "extra_ms_vs_1gpu", ".2f"),
    ("comm ms alone", "comm_ms_if_not_overlapped", ".2f"),
    ("bus GB/s", "bus_bandwidth_gb_s", ".1f"))


def format_scaling(single: dict, rows: list[dict]) -> str:
    tps = single["throughput"]["tokens_per_s"]
    base = {"kind": "1 GPU", "variant": "", "world_size": 1,
            "global_batch_size": single["run"].get("global_batch_size"), "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps, "efficiency": 1.0,
            "step_ms": single["timing_ms"]["step"]["median"]}
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
    """
    from profilers.kernel_table import ProfileParseError
    from profilers.readers import read_text

    try:
        trace = json.loads(read_text(trace_path))
    except (json.JSONDecodeError, ProfileParseError) as e:
        raise UsageError(f"{trace_path}: not a readable PyTorch profiler trace "
                         f"({getattr(e, 'msg', e)})") from None
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    kernels = [(e["ts"], e["ts"] + e.get("dur", 0), "nccl" in str(e.get("name", "")).lower())
               for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    if not kernels:
        raise UsageError(f"{trace_path}: no GPU kernels in this trace (a CPU run?)")
    comm = _union([(a, b) for a, b, is_comm in kernels if is_comm])
    compute = _union([(a, b) for a, b, is_comm in kernels if not is_comm])
    steps = sum(1 for e in events if e.get("cat") == "user_annotation"
                and str(e.get("name", "")).startswith("ProfilerStep#")) or 1
    comm_us, overlapped_us = _length(comm), _overlap(comm, compute)

    def per_step(us: float) -> float:  # microseconds in the trace -> ms per step
        return us / 1000 / steps
    return {"trace": str(trace_path), "steps": steps,
            "comm_kernels": sum(is_comm for _, _, is_comm in kernels),
            "comm_ms_per_step": per_step(comm_us),
            "overlapped_ms_per_step": per_step(overlapped_us),
            "exposed_ms_per_step": per_step(comm_us - overlapped_us),
            "overlap_fraction": overlapped_us / comm_us if comm_us else None,
            "compute_ms_per_step": per_step(_length(compute)),
            "gpu_window_ms_per_step": per_step(max(b for _, b, _ in kernels)
                                               - min(a for a, _, _ in kernels))}


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
            f"{row['gpu_window_ms_per_step']:.2f} ms/step GPU window")


def overlap_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.distributed overlap",
                                description="Communication/compute overlap in PyTorch profiler "
                                            "traces (one per rank) of a DDP or FSDP2 run.")
    p.add_argument("traces", nargs="+", help="*.pt.trace.json[.gz] written by --profile pytorch")
    args = p.parse_args(argv)
    try:
        rows = [communication_overlap(path) for path in args.traces]
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(map(format_overlap, rows)))
    return 0


def compare_main(argv: list[str] | None = None) -> int:
    from . import results

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["overlap"]:
        return overlap_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m harness.distributed",
                                description="Scaling efficiency of data-parallel runs "
                                            "against a 1-GPU run of the same per-GPU batch.")
    p.add_argument("single", help="results JSON of the 1-GPU run")
    p.add_argument("multi", nargs="+", help="results JSONs of torchrun runs")
    p.add_argument("--json", help="also write the comparison here")
    args = p.parse_args(argv)
    try:
        single = results.load(args.single)
        rows = [scaling(single, results.load(path)) for path in args.multi]
    except (results.SchemaError, UsageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_scaling(single, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"single": args.single, "runs": dict(zip(args.multi, rows))}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(compare_main())
