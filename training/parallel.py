"""Data parallelism through torchrun: DDP, or FSDP2 with --fsdp. One process per GPU.

    torchrun --nproc-per-node 2 version4_sdpa/tiny_llama_v4.py --preset medium

torchrun starts N copies of the same script and tells each one, in environment
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), who it is
and where to meet the others. Each copy then

  1. joins a process group: backend "nccl" on a GPU (on ROCm the same name
     loads RCCL), "gloo" on the CPU;
  2. builds the same model from the same seed and wraps it:
     - DDP keeps a full replica on every GPU. During backward it averages the
       gradients across GPUs with all-reduce, in buckets (25 MB; 200 when compiled
       without CUDA graphs, see COMPILED_BUCKET_MB), each one sent
       as soon as its gradients are ready - so communication overlaps compute;
     - FSDP2 (--fsdp) keeps only 1/N of every parameter, gradient and optimizer
       state per GPU. It all-gathers a block's weights just before the block
       runs (forward and again in backward) and reduce-scatters its gradients;
  3. trains on its own slice of the global batch (see harness/data.py).

Rank 0 prints and writes the results; the others gather their timings to it.
Started with plain `python`, none of this happens: `SingleProcess` below is what
the trainer gets, and it talks to both through the same methods.

Knobs (docs/MULTI_GPU.md, "Tuning DDP"): --ddp-bucket-mb, --ddp-comm-hook,
--compile-ddp, --ddp-static-graph for DDP; --fsdp-reshard-after-forward and
--fsdp-param-dtype for FSDP2; --comm-priority for both. --shard-optimizer
(training/sharded_optimizer.py) replaces DDP with a sharded optimizer: the default with
--optimizer master (sharded_by_default), --no-shard-optimizer keeps DDP. --reduce-after-backward
replaces DDP with the same flat optimizer unsharded, the gradients all-reduced after the
backward: the default compiled without graphs, with fp32 weights
(reduced_after_backward_by_default).

After training, each rank times the step's collectives alone
(measure_communication, at the end of this file) and rank 0 records them with the results. The scaling
table and the overlap read from a profiler trace are analysis of results:
    python -m analysis_tools scaling single.json ddp.json [fsdp.json ...] [--json out.json]
    python -m analysis_tools overlap rank0/pytorch/*.pt.trace.json
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import math
import os
import sys
from types import SimpleNamespace

import torch

from harness import device as dev
from harness import measure
from harness.config import PRECISIONS, RunSettings
from harness.errors import UsageError
from harness.precision import choose_precision
from harness.training_step import adamw_settings, make_optimizer

BUCKET_MB = 25  # DDP's default gradient bucket (--ddp-bucket-mb); FSDP2's comm is timed in these
# Under torch.compile each bucket is also a graph piece of its own, whose kernels the host
# launches one by one: 200 MiB buckets cut the medium model (~0.6 GB of fp32 gradients) into
# 3-4 pieces, not ~25. Where CUDA graphs replay the pieces, DDP's default is as fast.
COMPILED_BUCKET_MB = 200
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that add CUDA graphs
# Knobs that only one wrapper reads, with their flags: asking for one that will not
# be used is an error under torchrun, and a note without it (see check_knobs).
DDP_KNOBS = {"ddp_bucket_mb": "--ddp-bucket-mb", "ddp_comm_hook": "--ddp-comm-hook",
             "compile_ddp": "--compile-ddp", "ddp_static_graph": "--ddp-static-graph"}
# In place of DDP (so not with --fsdp, nor beside DDP's knobs); they act in one process too
FLAT_KNOBS = {"shard_optimizer": "--shard-optimizer",
              "reduce_after_backward": "--reduce-after-backward"}
FSDP_KNOBS = {"fsdp_reshard_after_forward": "--fsdp-reshard-after-forward",
              "fsdp_param_dtype": "--fsdp-param-dtype"}
SHARED_KNOBS = {"comm_priority": "--comm-priority"}  # both wrappers read it
DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunSettings)}
ENV_PREFIXES = ("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_")  # recorded with the results


class SingleProcess:
    """One process, nothing to synchronise: every method is the identity, except that
    --shard-optimizer and --reduce-after-backward run their flat AdamW update here too (one
    piece: the whole model, nothing sent), so that their rows' 1-GPU baseline runs the same
    optimizer code."""
    rank, world_size, is_main, kind, device, extra, dist = 0, 1, True, "single", None, None, None

    def __init__(self, settings=None):
        self.shard_optimizer = bool(settings and settings.shard_optimizer)
        self.reduce_after_backward = bool(settings and settings.reduce_after_backward)
        self.flat_optimizer = self.shard_optimizer or self.reduce_after_backward
        if self.flat_optimizer:
            _check_flat_optimizer(settings)
            # the flat buffer holds the weights the optimizer steps: bf16 with master weights
            self.flat_dtype = torch.bfloat16 if settings.optimizer == "master" else torch.float32
            # the gradients on the wire: unsharded under bf16 autocast, bf16 (sharded_optimizer.py)
            unsharded_bf16 = self.reduce_after_backward and _precision(settings) == "bf16"
            self.wire = torch.bfloat16 if unsharded_bf16 else self.flat_dtype

    def wrap(self, model, settings):
        return self._flatten(model) if self.flat_optimizer else model

    def _flatten(self, model):
        """The flat optimizer: no DDP wrapper; the weights become views of one flat buffer
        (training/sharded_optimizer.py), and every rank starts from rank 0's weights, as
        DDP would make it."""
        from training.sharded_optimizer import flatten_parameters

        self.flat, self.flat_params = flatten_parameters(model, self.flat_dtype, self.world_size)
        if self.dist is not None:
            self.dist.broadcast(self.flat, src=0)
            for p in model.parameters():
                if p.dtype != self.flat_dtype:
                    self.dist.broadcast(p.data, src=0)
        return model

    def make_optimizer(self, model, settings, device, masters):
        if not self.flat_optimizer:
            return make_optimizer(model, settings, device, masters)
        from training.sharded_optimizer import ShardedAdamW

        return ShardedAdamW(model.parameters(), self.flat, self.flat_params,
                            masters if settings.optimizer == "master" else None, self.dist,
                            **adamw_settings(settings), shard=self.shard_optimizer,
                            wire=self.wire)

    def check_precision(self, precision: str) -> None:
        pass

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


def changed_flags(settings, knobs: dict) -> list[str]:
    """The flags of `knobs` ({setting: flag}) set to other than their default."""
    return [flag for name, flag in knobs.items() if getattr(settings, name) != DEFAULTS[name]]


def _flat_by_default(settings) -> bool:
    """What both flat optimizers' defaults ask: data parallelism over several processes, and
    neither DDP's knobs, FSDP2 nor the other flat optimizer asked for."""
    return (launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1 and not settings.fsdp
            and not (settings.shard_optimizer or settings.reduce_after_backward)
            and not changed_flags(settings, DDP_KNOBS))


def sharded_by_default(settings) -> bool:
    """--shard-optimizer's default: on for data parallelism over several processes with master
    weights (--optimizer master), where it scales better than DDP (docs/MULTI_GPU.md, the
    scaling table); off where the run asks for what it does not do: DDP's knobs, FSDP2, fp16
    loss scaling, --reduce-after-backward. --no-shard-optimizer keeps DDP."""
    return (_flat_by_default(settings) and settings.optimizer == "master"
            and settings.precision != "fp16")


def reduced_after_backward_by_default(settings) -> bool:
    """--reduce-after-backward's default: on for data parallelism over several processes under
    --compile without CUDA graphs, with fp32 weights and bf16 autocast, where DDP cuts the
    compiled model into graph pieces the host launches and scales worse (docs/MULTI_GPU.md,
    the scaling table); off where the run shards its optimizer or asks for what it does not
    do: DDP's knobs, FSDP2, torch's foreach/fused AdamW. --no-reduce-after-backward keeps DDP."""
    return (_flat_by_default(settings) and settings.compile
            and settings.compile_mode not in CUDA_GRAPH_MODES
            and settings.optimizer == "default" and _precision(settings) == "bf16")


def _precision(settings) -> str:
    """The precision the run will train in (--precision, or the device's default)."""
    return settings.precision or choose_precision(None, dev.resolve_device(settings.device))


def _flat_flag(chosen) -> str:
    """The flat optimizer's flag that `chosen` (the settings, or a process group) runs."""
    return FLAT_KNOBS["shard_optimizer" if chosen.shard_optimizer else "reduce_after_backward"]


def _check_flat_optimizer(settings) -> None:
    """--shard-optimizer and --reduce-after-backward run their own AdamW update and replace
    DDP's buckets: one of them at a time."""
    flag = _flat_flag(settings)
    if settings.shard_optimizer and settings.reduce_after_backward:
        raise UsageError("--shard-optimizer and --reduce-after-backward each replace DDP (sharded "
                         "or not): pick one")
    if settings.optimizer in ("foreach", "fused"):
        raise UsageError(f"{flag} updates the weights with its own flat AdamW step, not "
                         f"torch's {settings.optimizer} one: drop --optimizer "
                         f"{settings.optimizer} (or use --optimizer master)")
    replaced = changed_flags(settings, DDP_KNOBS)
    if replaced:
        raise _unread_knobs(replaced, "DDP", f"which {flag} replaces")


def _unread_knobs(flags: list[str], wrapper: str, why: str) -> UsageError:
    """The one line for knobs set for a wrapper this run does not use."""
    one = len(flags) == 1
    return UsageError(f"{', '.join(flags)} configure{'s' if one else ''} {wrapper}, {why}: "
                      f"drop {'it' if one else 'them'}")


def check_knobs(settings, under_torchrun: bool) -> None:
    """DDP knobs need DDP, FSDP knobs need --fsdp.

    Without torchrun there is one process and nothing to tune: the knobs are
    ignored with a note, so the 1-GPU baseline can take the same flags as the
    multi-GPU run. Under torchrun, a knob the chosen wrapper never reads is
    almost certainly a mistake, so it stops the run (exit code 2).
    """
    ddp_set, fsdp_set = changed_flags(settings, DDP_KNOBS), changed_flags(settings, FSDP_KNOBS)
    if not under_torchrun:
        ignored = ddp_set + fsdp_set + changed_flags(settings, SHARED_KNOBS)
        if ignored:
            print(f"note: {', '.join(ignored)} only act under torchrun; ignored in "
                  f"this single-process run", file=sys.stderr)
        return
    wrong = ddp_set + changed_flags(settings, FLAT_KNOBS) if settings.fsdp else fsdp_set
    if wrong:
        raise _unread_knobs(wrong, "DDP" if settings.fsdp else "FSDP2 (--fsdp)",
                            f"but this run uses {'FSDP2' if settings.fsdp else 'DDP'}")


def setup(settings):
    """SingleProcess under plain python; a joined DataParallel under torchrun."""
    if not launched_by_torchrun():
        if settings.fsdp:
            raise UsageError("--fsdp shards the model over several processes: launch with "
                             "torchrun --nproc-per-node N <script> --fsdp ...")
        check_knobs(settings, under_torchrun=False)
        return SingleProcess(settings)
    check_knobs(settings, under_torchrun=True)
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("this PyTorch build has no torch.distributed: run without torchrun")
    fully_shard = find_fsdp("fully_shard") if settings.fsdp else None  # fail before joining
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
    # --comm-priority high: NCCL/RCCL launches on a high-priority stream, so when a
    # bucket's all-reduce and backward's kernels both wait for SMs, the all-reduce
    # gets them first instead of queueing behind the backward it is meant to overlap.
    options = None
    if backend == "nccl" and settings.comm_priority == "high":
        options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None,
                            pg_options=options)
    try:
        return DataParallel(settings, device, backend, fully_shard)
    except BaseException:  # a bad combination of flags: leave no process group behind
        dist.destroy_process_group()
        raise


def find_fsdp(name: str):
    """A name of FSDP2 (fully_shard, MixedPrecisionPolicy): public since torch 2.6, under
    _composable in 2.4-2.5."""
    import importlib

    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise UsageError(f"--fsdp needs FSDP2 ({name}, torch >= 2.4); torch "
                     f"{torch.__version__} lacks it: run without --fsdp for DDP")


class DataParallel(SingleProcess):
    def __init__(self, settings, device: torch.device, backend: str, fully_shard=None):
        import torch.distributed as dist

        self.dist, self.device, self.fully_shard = dist, device, fully_shard
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.kind = "fsdp2" if fully_shard else "ddp"
        self.grad_accum = settings.grad_accum
        launched_pieces = settings.compile and settings.compile_mode not in CUDA_GRAPH_MODES
        self.bucket_mb = settings.ddp_bucket_mb or (COMPILED_BUCKET_MB if launched_pieces
                                                    else BUCKET_MB)
        self.comm_hook = settings.ddp_comm_hook
        self.static_graph = settings.ddp_static_graph
        super().__init__(settings if not fully_shard else None)
        self.compile_ddp = settings.compile_ddp if settings.compile else None  # only compile reads it
        self.reshard_after_forward = settings.fsdp_reshard_after_forward
        self.param_dtype = settings.fsdp_param_dtype
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
            **({"bucket_cap_mb": None if self.flat_optimizer else self.bucket_mb,
                "comm_hook": self.comm_hook,
                "compile_ddp": self.compile_ddp, "static_graph": self.static_graph,
                "shard_optimizer": self.shard_optimizer,
                "reduce_after_backward": self.reduce_after_backward}
               if self.kind == "ddp" else
               {"reshard_after_forward": self.reshard_after_forward,
                "param_dtype": self.param_dtype}),
            "comm_priority": settings.comm_priority,
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
        if self.flat_optimizer:
            return self._flatten(model)
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
        # --fsdp-param-dtype bf16: the shards stay fp32 (the optimizer's weights), each
        # all-gather sends and each block computes with bf16 copies, and the gradients are
        # reduce-scattered in fp32.
        mixed = {}
        if self.param_dtype != "fp32":
            mixed["mp_policy"] = find_fsdp("MixedPrecisionPolicy")(
                param_dtype=PRECISIONS[self.param_dtype].dtype, reduce_dtype=torch.float32)
        for block in model.layers:
            self.fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                             **mixed)
        self.fully_shard(model, mesh=mesh, **mixed)  # the rest: embeddings, final norm, output head
        return model

    def check_precision(self, precision: str) -> None:
        """fp16's loss scaler skips a step where its rank's gradients overflow: under DDP every
        rank sees the same averaged gradients, but a sharded optimizer's ranks would decide
        apart, and one would wait in a reduce-scatter the other never joins (the flat
        optimizer's scaler, unsharded, would check the gradients before they are averaged)."""
        if self.flat_optimizer and precision == "fp16":
            raise UsageError(f"{_flat_flag(self)} does not run with fp16 loss scaling (each GPU "
                             f"would skip overflowing steps on its own): use --precision bf16 "
                             f"or fp32")

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
        if micro_step == self.grad_accum - 1 or self.flat_optimizer:  # it syncs in its step
            return contextlib.nullcontext()
        return model.no_sync() if self.kind == "ddp" else _fsdp_no_sync(model)

    # ------------------------------------------------------------ results
    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        total = values.detach().clone()
        self.dist.all_reduce(total)  # SUM: the one reduction every backend has (gloo lacks AVG)
        return total / self.world_size

    def check_gradient_flow(self, model) -> int:
        if self.flat_optimizer:  # each rank's own gradients, whole (the optimizer averages them)
            return measure.check_gradient_flow(model)
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
        self.extra["communication"] = measure_communication(self)
        return {phase: max((t[phase] for t in per_rank), key=lambda s: s["median"] or 0.0)
                for phase in timing}

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


# ---------------------------------------------------------------- the communication probe
# How long one step's collectives take on this machine's interconnect when nothing else
# runs: DataParallel calls it after training, on every rank together; rank 0 records the
# result in the run's `distributed` section ("Communication alone" in docs/MULTI_GPU.md).
# Against it, `python -m analysis_tools scaling` sets how much of the multi-GPU step was
# communication that backward could not hide.
BUS_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (N-1)/N, as nccl-tests


def measure_communication(group, reps: int = 10) -> dict:
    """Time the collectives of one step alone, after training.

    `group` is the trainer's training.parallel.DataParallel: its process group
    (`dist`), device, world size, wrapper kind and the gradients it wrapped.

    Method: one gradient-bucket-sized buffer (--ddp-bucket-mb of the
    gradients' dtype for DDP - fp32, or bf16 with --optimizer master - 25 MB
    of fp32 for FSDP2, or the whole model if smaller; in 16 bits with
    --ddp-comm-hook), timed over `reps` calls after two warm-up calls, the
    slowest rank's mean, scaled by the number of buckets the model fills.
    DDP: one all-reduce of all gradients per step. FSDP2: two all-gathers of
    the weights (forward and backward) and one reduce-scatter of the gradients.
    --shard-optimizer: one reduce-scatter of the flat gradients and one
    all-gather of the weights (the flat weights' dtype), each timed at its full
    size (the step moves them in pieces). --reduce-after-backward: one all-reduce
    of the flat gradients in the dtype they travel in, at its full size.
    This is the cost if nothing overlapped; DDP runs it beside the backward, and
    what the step pays for it shows as (multi-GPU step - 1-GPU step):
    `python -m analysis_tools scaling` prints both.
    Bus bandwidth follows the nccl-tests convention (comparable across N).
    """
    n = group.world_size
    ddp = group.kind == "ddp"
    hooked = ddp and group.comm_hook != "none"  # --ddp-comm-hook names a precision
    wire = (PRECISIONS[group.comm_hook].dtype if hooked else
            group.gradient_dtype if ddp else torch.float32)
    # DDP fills its buckets in the gradients' own dtype; a hook converts each bucket after.
    held = (group.gradient_dtype if ddp else torch.float32).itemsize
    if group.flat_optimizer:
        # the flat gradients and (sharded) weights, whole (with master weights, the fp32
        # embeddings' and norms' small all-reduce is left out)
        numel, buckets, wire = group.flat.numel(), 1, group.wire
    else:
        numel = min(group.gradient_numel, int((group.bucket_mb if ddp else BUCKET_MB) * 2**20 // held))
        numel = max(n, numel - numel % n)  # divisible by n for all-gather / reduce-scatter
        buckets = math.ceil(group.gradient_numel / numel)
    full = torch.ones(numel, device=group.device, dtype=wire)
    if ddp and not group.shard_optimizer:  # DDP's buckets, or --reduce-after-backward's one
        ops = {"all_reduce": _time(group, lambda: group.dist.all_reduce(full), reps)}
        per_step = ops["all_reduce"] * buckets
    else:
        shard = torch.ones(numel // n, device=group.device, dtype=wire)
        # all_gather_single/reduce_scatter_single: the newer names (torch 2.13+)
        all_gather = getattr(group.dist, "all_gather_single", group.dist.all_gather_into_tensor)
        reduce_scatter = getattr(group.dist, "reduce_scatter_single", group.dist.reduce_scatter_tensor)
        ops = {"all_gather": _time(group, lambda: all_gather(full, shard), reps),
               "reduce_scatter": _time(group, lambda: reduce_scatter(shard, full), reps)}
        # FSDP2 gathers each block's weights twice a step (forward, backward); the sharded
        # optimizer once, after its update
        gathers = 1 if group.shard_optimizer else 2
        per_step = (gathers * ops["all_gather"] + ops["reduce_scatter"]) * buckets
    nbytes = numel * full.element_size()
    busbw = {op: nbytes / ms / 1e6 * BUS_FACTOR[op] * (n - 1) / n for op, ms in ops.items()}
    return {"method": f"{reps} timed calls on an idle device, slowest rank, "
                      f"x {buckets} buckets; not overlapped with compute",
            "bucket_mib": nbytes / 2**20, "buckets": buckets,
            "gradient_mib": group.gradient_numel * held / 2**20,
            "ms_per_bucket": ops, "per_step_ms": per_step,
            "bus_bandwidth_gb_s_per_op": busbw,
            "bus_bandwidth_gb_s": next(iter(busbw.values()))}  # all-reduce / all-gather


def _time(group, collective, reps: int) -> float:
    """ms per call of `collective` on the slowest rank: `reps` calls back to back, timed
    by harness.measure.median_ms after two warm-up calls (they set up connections and
    buffers) and a barrier (every rank starts together)."""
    for _ in range(2):
        collective()
    dev.synchronize(group.device)
    group.dist.barrier()
    ms = measure.median_ms(group.device, collective, warmup=0, repeats=1, calls_per_sample=reps)
    slowest = torch.tensor([ms], device=group.device)
    group.dist.all_reduce(slowest, op=group.dist.ReduceOp.MAX)
    return slowest.item()
