"""memory: predict the peak memory of a training step, and check the prediction.

Fine-tuning guides estimate memory by hand ("weights + gradients + 2x for AdamW +
some activations"); this module does the same bookkeeping carefully enough to
land within ~15% of `torch.cuda.max_memory_allocated`. docs/ANALYSIS.md walks
through the derivation; in short, at any moment of a step the live bytes are

    persistent  fp32 weights (4 B/param) + AdamW's two fp32 moments (8 B/param)
                + bf16/fp16 copies of every matmul weight (autocast casts each
                  weight once per forward and autograd keeps the copy for backward)
    activations what autograd saved for backward, per block (listed item by item
                  below: with explicit attention the T x T probabilities dominate,
                  flash attention saves only q, k, v, the output and a log-sum-exp)
    gradients   fp32, appearing during backward (they are None in forward:
                  the trainer zeroes them with set_to_none=True)
    transients  short-lived buffers: logits and their gradient, the softmax
                  gradients of one block, the optimizer's scratch space

and the peak is the largest of a few candidate *moments* (end of forward,
start of backward, the last block's attention backward, the optimizer step).

Everything here is checked on the CPU (tests): parameter, gradient and
optimizer-state bytes exactly on the real models, saved activations against
autograd's saved-tensor hooks, and the whole-step peak against a tracker of
live tensor storages (`trace_step`). The GPU comparison is
the `memory` step of `benchmarks/reproduce.sh`.
"""
from __future__ import annotations

import types
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness import config, flops, training_step
from harness import precision as precision_mod
from harness.config import PRECISIONS, PRESETS, VERSIONS, ModelConfig

from .common import (AnalysisError, load_results, measured_on_gpu_allocator, model_config,
                     peak_memory_mb, plt, save_figure, unique_labels)

MiB = 1024 * 1024


# ---------------------------------------------------------------- implementations
@dataclass(frozen=True)
class Implementation:
    """The choices of a run that change what autograd keeps alive. A version's spec
    (<version folder>/spec.py) sets them: its `memory`, then each switch's `memory`."""
    attention: str = "explicit"   # explicit: T x T scores in memory; flash: never materialised
    fused_qkv: bool = False       # one x@W_qkv: one cast copy of the input instead of three
    fused_gate_up: bool = False   # one x@W_gate_up: one cast copy instead of two
    # RMSNorm kernel saving only its input (and 1/rms, norm_stats); SiLU*mul kernel saving
    # only g and u.
    # "gpu": a kernel that is fused on GPUs only (F.rms_norm, V2's generated SiLU*mul).
    fused_norm: bool | str = False
    norm_stats: bool = True       # the norm keeps 1/rms per row (V3's backward recomputes it)
    fused_swiglu: bool | str = False
    # silu(gate)*up rebuilt in backward (V3's --recompute-swiglu): the down projection keeps
    # no input; the rebuilt copy is freed before the MLP's activation gradients exist
    swiglu_recompute: bool = False
    # the rotated q, k: kept for attention's backward; recomputed (rotated again in the
    # backward: V3's --recompute-rope); on load (the kernels rotate tiles: --rope-in-attention)
    rotated_qk: str = "kept"
    # each norm's output rebuilt in backward (V3's --recompute-norm): the QKV and gate/up
    # GEMMs keep no input
    norm_recompute: bool = False
    gqa_native: bool = False      # k/v stay at num_kv_heads (no repeat_interleave copies)
    scores_fp32_copy: bool = False  # V1 casts the T x T scores to fp32 before softmax (a copy)
    optimizer: str = "foreach"    # AdamW: single (for-loop), foreach (one scratch copy), fused
    # logits: the whole (rows, vocab) logits, their fp32 copy and gradient exist; chunked:
    # the loss and both gradients come a chunk of rows at a time (V3's linear_cross_entropy)
    loss: str = "logits"

    def describe(self) -> str:
        fused = [n for n in ("qkv", "gate_up", "norm", "swiglu") if getattr(self, f"fused_{n}")]
        return (f"{self.attention} attention, fused: {', '.join(fused) or 'none'}, "
                f"AdamW {self.optimizer}")


def implementation_for(version: str, options: dict | None = None, run: dict | None = None,
                       device_type: str = "cuda", model: ModelConfig | None = None) -> Implementation:
    """What a run keeps alive: its version's spec, changed by the switches its results
    JSON records (exact names; a switch the spec does not declare is refused). A switch
    not recorded counts at its default, which for some switches depends on `model`."""
    try:
        spec = config.load_spec(version)
    except KeyError:  # not a version (the HF peer, the debugging stages): plain defaults
        spec = None
    impl = Implementation()
    if spec is not None:
        try:
            changes = spec.memory_changes(dict(options or {}), model)
        except KeyError as e:
            raise AnalysisError(f"{version} declares no switch {e.args[0]}: a switch and what it "
                                f"changes in memory are declared in {VERSIONS[version].folder}/spec.py") from None
        for change in [spec.memory, *changes]:
            impl = replace(impl, **change)
    gpu = device_type != "cpu"
    impl = replace(impl, fused_norm=impl.fused_norm is True or (impl.fused_norm == "gpu" and gpu),
                   fused_swiglu=impl.fused_swiglu is True or (impl.fused_swiglu == "gpu" and gpu))
    choice = (run or {}).get("optimizer", "default")
    if choice == "fused" and device_type == "cuda":
        impl = replace(impl, optimizer="fused")
    elif choice in ("foreach", "fused") or (choice == "default" and device_type == "cuda"):
        impl = replace(impl, optimizer="foreach")  # torch's default on GPUs
    else:
        impl = replace(impl, optimizer="single")   # torch's default on the CPU
    return impl


# ---------------------------------------------------------------- the model
@dataclass(frozen=True)
class Shape:
    cfg: ModelConfig
    batch: int
    seq: int
    precision: str

    @property
    def a(self) -> int:          # bytes of an activation inside matmuls (autocast dtype)
        return PRECISIONS[self.precision].bytes

    @property
    def n(self) -> int:          # tokens in the batch
        return self.batch * self.seq

    @property
    def scores(self) -> int:     # elements of one block's attention score matrices
        return self.batch * self.cfg.num_heads * self.seq * self.seq


def _norm(sh: Shape, impl: Implementation, name: str) -> dict:
    nd = sh.n * sh.cfg.hidden_dim
    out = {f"{name}: 1/rms (fp32)": sh.n * 4} if impl.norm_stats else {}
    if not impl.fused_norm:
        out[f"{name}: normalised x (fp32)"] = nd * 4
    return out


def _linear_inputs(sh: Shape, copies: int, name: str) -> dict:
    """What matmuls keep of their input: one bf16 cast per projection under autocast
    (activations are not cached like weights), or the fp32 tensor itself."""
    nd = sh.n * sh.cfg.hidden_dim
    if sh.a == 4:
        return {f"{name} input (fp32)": nd * 4}
    return {f"{name} input, {copies} cast cop{'y' if copies == 1 else 'ies'}": copies * nd * sh.a}


def _kv_heads(c: ModelConfig, impl: Implementation) -> int:
    """Heads of k and v as attention holds them: num_kv_heads where flash attention reads
    them natively, else repeated to every query head."""
    return c.num_kv_heads if (impl.gqa_native and impl.attention == "flash") else c.num_heads


def block_activations(sh: Shape, impl: Implementation) -> tuple[dict, dict]:
    """Bytes saved for backward by one transformer block: (attention half, MLP half)."""
    c, a, n = sh.cfg, sh.a, sh.n
    nd, hd = n * c.hidden_dim, c.head_dim
    q = n * c.num_heads * hd * a
    kv_heads = _kv_heads(c, impl)
    attn = {"block input x (fp32 residual)": nd * 4, **_norm(sh, impl, "attn norm"),
            **({} if impl.norm_recompute else
               _linear_inputs(sh, 1 if impl.fused_qkv else 3, "q/k/v proj"))}
    if impl.attention == "explicit":
        attn["q, k, v after RoPE (k, v repeated to all heads)"] = 3 * q
        attn["softmax output P (fp32)"] = sh.scores * 4
        if a != 4:
            attn["P cast for P@V"] = sh.scores * a
        attn["causal mask (bool)"] = sh.seq * sh.seq
    else:
        k = n * kv_heads * hd * a
        # A saved view keeps its whole storage alive: v sliced from a fused qkv
        # output keeps all of q, k and v of that projection.
        v = n * (c.num_heads + 2 * c.num_kv_heads) * hd * a if impl.fused_qkv else k
        if impl.rotated_qk == "kept":
            attn["q, k after RoPE"] = q + k
        attn["v (its whole projection output)" if impl.fused_qkv else "v"] = v
        # Flash kernels write the output as (B, T, heads, hd) in memory, so merging
        # heads for o_proj is a view: o_proj saves this very tensor.
        attn["attention output (= o_proj input) + log-sum-exp"] = q + sh.batch * c.num_heads * sh.seq * 4
    if impl.attention == "explicit":
        attn["o_proj input (heads merged: a copy)"] = q
    nf = n * c.ffn_dim
    mlp = {"residual after attention (fp32)": nd * 4, **_norm(sh, impl, "mlp norm"),
           **({} if impl.norm_recompute else
              _linear_inputs(sh, 1 if impl.fused_gate_up else 2, "gate/up proj")),
           "gate and up outputs": 2 * nf * a}
    if not impl.fused_swiglu:
        mlp["silu(gate)"] = nf * a
    if not impl.swiglu_recompute:
        mlp["down_proj input silu(gate)*up"] = nf * a
    return attn, mlp


def head_activations(sh: Shape, impl: Implementation) -> dict:
    n, v, d = sh.n, sh.cfg.vocab_size, sh.cfg.hidden_dim
    out = {"final norm input (fp32)": n * d * 4, **_norm(sh, impl, "final norm"),
           "token ids (int64, inputs + targets)": 2 * n * 8}
    if impl.loss == "chunked":  # forward leaves the gradients of h and of lm_head's weight
        return {**out, "d h of the loss (compute dtype)": n * d * sh.a,
                "d lm_head weight of the loss (fp32)": v * d * 4}
    return {**out, **_linear_inputs(sh, 1, "lm_head"), "log-softmax of logits (fp32)": n * v * 4}


def loss_chunk_rows(sh: Shape) -> int:
    """Rows per chunk of V3's linear_cross_entropy (its own rule, repeated here)."""
    return max(1, min(sh.n, 2 ** 26 // max(sh.cfg.vocab_size, 1)))


def persistent(sh: Shape, impl: Implementation) -> dict:
    p = flops.total_params(sh.cfg)
    out = {"parameters (fp32)": p * 4, "AdamW exp_avg + exp_avg_sq (fp32)": 2 * p * 4}
    if sh.a != 4:
        out["bf16/fp16 weight copies (autocast)"] = flops.matmul_params(sh.cfg) * sh.a
    return out


def optimizer_scratch(sh: Shape, impl: Implementation) -> int:
    p = flops.total_params(sh.cfg)
    if impl.optimizer == "foreach":
        return p * 4  # _foreach_sqrt(exp_avg_sq): one fp32 copy of every parameter
    if impl.optimizer == "single":
        c = sh.cfg
        return max(c.vocab_size * c.hidden_dim, c.ffn_dim * c.hidden_dim) * 4  # largest tensor
    return 0


def workspace_bytes(device: str | None) -> int:
    """cuBLAS keeps a workspace in the caching allocator: 32 MiB on Hopper (sm_90)
    and later, as torch sets it; we assume the same for hipBLASLt on ROCm."""
    if not device or device == "cpu":
        return 0
    return 32 * MiB


@dataclass
class Prediction:
    peak_bytes: int
    moment: str
    moments: dict      # moment -> bytes
    breakdown: dict    # item -> bytes, at the peak moment

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB


def predict(cfg: ModelConfig, batch: int, seq: int, precision: str = "bf16",
            impl: Implementation | str = "v1", grad_checkpoint: bool = False,
            grad_accum: int = 1, device: str | None = "cuda") -> Prediction:
    """Peak bytes of a steady-state training step (optimizer state already exists)."""
    impl = implementation_for(impl, device_type=device or "cuda", model=cfg) if isinstance(impl, str) else impl
    sh = Shape(cfg, batch, seq, precision)
    c, a, n, L = cfg, sh.a, sh.n, cfg.num_layers
    nd, nf, nv = n * c.hidden_dim, n * c.ffn_dim, n * c.vocab_size
    base = persistent(sh, impl)
    if workspace_bytes(device):
        base["BLAS workspace"] = workspace_bytes(device)
    if grad_accum > 1:  # from the second micro-batch on, gradients are alive all the time
        base["gradients (accumulating)"] = flops.total_params(c) * 4
    attn, mlp = block_activations(sh, impl)
    attn_bytes, block = sum(attn.values()), sum(attn.values()) + sum(mlp.values())
    head = head_activations(sh, impl)
    if grad_checkpoint:  # only each block's input is kept; backward recomputes one block at a time
        all_blocks = {f"{L} checkpointed block inputs (fp32)": L * nd * 4}
        before_last = all_blocks
    else:
        all_blocks = {f"{L} blocks of saved activations": L * block}
        before_last = {f"{L - 1} blocks of saved activations": (L - 1) * block}

    # Transients at each moment (docs/ANALYSIS.md follows the allocations and frees).
    ce_forward = nv * a + (nv * 4 if a != 4 else 0)      # logits and their fp32 copy
    ce_backward = 2 * nv * 4                             # d(log-softmax) and d(logits), fp32
    if impl.loss == "chunked":  # one chunk's logits; backward scales the saved gradients
        ce_forward = loss_chunk_rows(sh) * c.vocab_size * a
        ce_backward = nd * a + c.hidden_dim * c.vocab_size * 4
    if impl.attention == "explicit":
        # masked scores alive next to the softmax output (+ V1's fp32 copy of them);
        # in backward dP (fp32) and dS around the softmax (fp32 if its input was)
        copy = impl.scores_fp32_copy and a != 4
        attn_forward = sh.scores * (a + (4 if copy else 0))
        attn_backward = sh.scores * (4 + (4 if copy else a))
    else:
        q = n * c.num_heads * c.head_dim
        attn_forward = 0
        attn_backward = q * 4 + 3 * q * a                # fp32 dq accumulator, dq/dk/dv
        if impl.rotated_qk == "recomputed":              # q and k rotated again, alive throughout
            attn_backward += (q + n * _kv_heads(c, impl) * c.head_dim) * a
    head_grads = (c.hidden_dim * c.vocab_size + c.hidden_dim) * 4
    mlp_grads = (3 * c.hidden_dim * c.ffn_dim + c.hidden_dim) * 4
    # By the softmax backward, P@V's backward has freed P's low-precision copy and
    # o_proj's backward its input.
    attn_left = attn_bytes - attn.get("P cast for P@V", 0) - attn.get("o_proj input (heads merged: a copy)", 0)

    moments = {
        "end of forward (loss)": {**base, **all_blocks, **head,
                                  "logits + fp32 copy (transient)": ce_forward},
        "start of backward (loss gradient)": {**base, **all_blocks, **head,
                                              "d logits (transient)": ce_backward},
        "backward of the last block's MLP": {
            **base, **before_last, "last block's saved activations": block,
            "gradients so far (lm_head, last MLP)": head_grads + mlp_grads,
            "MLP activation gradients (transient)": 3 * nf * a},
        "backward of the last block's attention": {
            **base, **before_last, "attention half of the last block": attn_left,
            "gradients so far (lm_head, last MLP)": head_grads + mlp_grads,
            "attention gradients (transient)": attn_backward},
        "forward of the last block's attention": {
            **base, **before_last, **({} if grad_checkpoint else {"attention half of the last block": attn_bytes}),
            "scores (transient)": attn_forward},
        "optimizer step": {**{k: v for k, v in base.items() if "copies" not in k and "accumulating" not in k},
                           "gradients (fp32)": flops.total_params(c) * 4,
                           f"AdamW scratch ({impl.optimizer})": optimizer_scratch(sh, impl)},
    }
    totals = {m: sum(items.values()) for m, items in moments.items()}
    peak_moment = max(totals, key=totals.get)
    return Prediction(totals[peak_moment], peak_moment, totals, moments[peak_moment])


def predict_for_result(result: dict) -> Prediction:
    run, device, cfg = result["run"], result["device"], model_config(result)
    impl = implementation_for(result["version"], result.get("options"), run, device["type"], cfg)
    return predict(cfg, run["batch_size"], run["seq_len"], run["precision"],
                   impl, run.get("grad_checkpoint", False), run.get("grad_accum", 1), device["type"])


# ---------------------------------------------------------------- measuring (CPU or GPU)
def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Exact bytes of parameters, gradients and optimizer state of real objects."""
    params = list({p.data_ptr(): p for p in model.parameters()}.values())
    grads = [p.grad for p in params if p.grad is not None]
    state = [t for s in (optimizer.state.values() if optimizer else []) for t in s.values()
             if torch.is_tensor(t) and t.numel() > 1]
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {"parameters": size(params), "gradients": size(grads), "optimizer_state": size(state)}


def saved_activation_bytes(model: torch.nn.Module, ids: torch.Tensor, precision: str) -> dict:
    """Bytes autograd saves for backward in one forward + loss, from saved-tensor hooks.

    Distinct storages only (views share them); parameters are excluded and
    low-precision weight copies reported separately.
    """
    from harness.precision import autocast_for

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple] = {}

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_ptrs and ptr not in seen:
            seen[ptr] = (storage.nbytes(), _is_weight_copy(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_for(precision, ids.device):
            logits = model(ids)
        torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), ids.reshape(-1))
    return {"activations": sum(b for b, copy in seen.values() if not copy),
            "weight_copies": sum(b for b, copy in seen.values() if copy)}


def _is_weight_copy(t: torch.Tensor) -> bool:
    """A cast (or transposed view of a cast) of a parameter: its autograd history
    leads straight to a leaf through copies and views only."""
    fn = t.grad_fn
    for _ in range(4):
        if fn is None:
            return False
        if type(fn).__name__ == "AccumulateGrad":
            return True
        if not any(k in fn.name() for k in ("ToCopy", "TBackward", "View", "Transpose", "Permute")):
            return False
        fn = next((f for f, _ in fn.next_functions if f is not None), None)
    return False


class LiveTensorTracker(TorchDispatchMode):
    """Follows every tensor storage created while active and when it dies.

    The CPU has no `max_memory_allocated`; this gives the same number (live
    tensor bytes, its peak, and the operator that reached it) on any device.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, object] = {}
        self.current = self.peak = 0
        self.peak_op = None

    def reset_peak(self):
        self.peak, self.peak_op = self.current, None

    def _free(self, key, size):
        if self.live.pop(key, None) is not None:
            self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size and key not in self.live and key not in inputs:  # new, not a view/in-place
                self.live[key] = weakref.ref(storage, lambda _, k=key, s=size: self._free(k, s))
                self.current += size
                if self.current > self.peak:
                    self.peak, self.peak_op = self.current, str(func)
        return out


def load_version(version: str):
    try:
        return config.load_version(version)
    except KeyError:
        raise AnalysisError(f"unknown version {version!r} (choose from {', '.join(VERSIONS)})") from None
    except ModuleNotFoundError:
        raise AnalysisError(f"{version} is not in this checkout yet") from None


def trace_step(version: str, cfg: ModelConfig, batch: int, seq: int, precision: str = "fp32",
               device: str = "cpu", grad_checkpoint: bool = False, optimizer: str = "default",
               options: dict | None = None) -> dict:
    """Run two real training steps of a version and measure the second one's peak.

    Everything (model, optimizer state, activations) is created under the
    tracker, so its peak is comparable with max_memory_allocated.
    """
    module = load_version(version)
    dev = torch.device(device)
    precision_mod.configure_matmul_precision(precision)
    settings = types.SimpleNamespace(learning_rate=1e-4, optimizer=optimizer)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=gen).to(dev)
    with LiveTensorTracker() as tracker:
        model = module.build_model(cfg, **(options or {})).to(dev)
        if grad_checkpoint:
            training_step.enable_grad_checkpointing(model)
        opt = training_step.make_optimizer(model, settings, dev)
        for step in range(2):
            if step == 1:
                tracker.reset_peak()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
                    start_cuda = torch.cuda.memory_allocated(dev)
            opt.zero_grad(set_to_none=True)
            with precision_mod.autocast_for(precision, dev):
                logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                     ids[:, 1:].reshape(-1))
            del logits
            loss.backward()
            opt.step()
        out = {"peak_bytes": tracker.peak, "peak_op": tracker.peak_op,
               **state_bytes(model, opt)}
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        out["cuda_allocated_before_step_bytes"] = start_cuda
    return out


# ---------------------------------------------------------------- command
def trace_result(result: dict) -> dict:
    """trace_step with the settings of a results JSON (on the device it ran on)."""
    run = result["run"]
    device = "cuda" if result["device"]["type"] == "cuda" else "cpu"
    return trace_step(result["version"], model_config(result), run["batch_size"], run["seq_len"],
                      run["precision"], device, run.get("grad_checkpoint", False),
                      run.get("optimizer", "default"), result.get("options"))


def memory_table(results: list[dict], trace: bool = False) -> pd.DataFrame:
    """Predicted vs measured peak per run; with trace, also a traced rerun of one step."""
    rows = []
    for label, r in zip(unique_labels(results), results):
        pred = predict_for_result(r)
        measured = peak_memory_mb(r)
        gpu = measured_on_gpu_allocator(r)
        row = {"run": label, "file": Path(r["_path"]).stem if "_path" in r else None,
               "predicted MiB": pred.peak_mib,
               "measured MiB": measured if gpu else None,
               "error %": (pred.peak_mib / measured - 1) * 100 if gpu and measured else None,
               "peak moment": pred.moment,
               "note": "" if gpu else f"CPU run: RSS {measured:,.0f} MiB includes the runtime"}
        if trace:
            traced = trace_result(r)
            row["traced MiB"] = traced["peak_bytes"] / MiB
            row["traced peak at"] = traced["peak_op"]
            if "cuda_max_allocated_bytes" in traced:
                row["traced max_allocated MiB"] = traced["cuda_max_allocated_bytes"] / MiB
        rows.append(row)
    return pd.DataFrame(rows)


def breakdown_table(pred: Prediction) -> pd.DataFrame:
    df = pd.DataFrame({"component": list(pred.breakdown), "MiB": [b / MiB for b in pred.breakdown.values()]})
    return df.sort_values("MiB", ascending=False, ignore_index=True)


def plot_memory_model(results: list[dict], out_dir, name="memory_model.png"):
    """Stacked predicted components (persistent / activations / transient) vs the measured bar."""
    labels = unique_labels(results)
    groups = {"weights + AdamW state": ("parameters", "AdamW exp", "workspace"),
              "weight copies": ("copies",), "gradients": ("grad",), "transients": ("transient", "scratch")}
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results) + 2), 4.5))
    x = range(len(results))
    stacks = {g: [] for g in [*groups, "activations"]}
    for r in results:
        pred = predict_for_result(r)
        sums = dict.fromkeys(stacks, 0.0)
        for item, b in pred.breakdown.items():
            group = next((g for g, keys in groups.items() if any(k in item for k in keys)), "activations")
            sums[group] += b / MiB
        for g in stacks:
            stacks[g].append(sums[g])
    bottom = [0.0] * len(results)
    for g, values in stacks.items():
        ax.bar([i - 0.2 for i in x], values, width=0.4, bottom=bottom, label=f"predicted: {g}")
        bottom = [b + v for b, v in zip(bottom, values)]
    measured = [peak_memory_mb(r) if measured_on_gpu_allocator(r) else float("nan") for r in results]
    ax.bar([i + 0.2 for i in x], measured, width=0.4, color="black", label="measured peak allocated")
    ax.set_xticks(list(x), labels, rotation=20)
    ax.set_ylabel("memory (MiB)")
    ax.set_title("Peak memory: model vs measurement")
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir, name)


def memory_for_results(paths_or_results, out_dir=None, trace: bool = False) -> dict:
    results = (paths_or_results if paths_or_results and isinstance(paths_or_results[0], dict)
               else load_results(paths_or_results))
    out = {"table": memory_table(results, trace), "results": results, "plots": []}
    if out_dir is not None:
        out["plots"].append(plot_memory_model(results, out_dir))
    return out


def predict_preset(preset: str, version: str = "v1", batch: int | None = None, seq: int | None = None,
                   precision: str = "bf16", grad_checkpoint: bool = False,
                   device: str = "cuda", switches: dict | None = None,
                   optimizer: str = "default") -> Prediction:
    """A preset's peak as `version` would run it with these switches (name -> value, the
    others at their defaults; settled as the version's command line settles them) and
    this --optimizer choice."""
    if preset not in PRESETS:
        raise AnalysisError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    p = PRESETS[preset]
    options = None
    if switches:
        try:
            options = config.load_spec(version).settle(switches, p.model)
        except KeyError as e:
            raise AnalysisError(f"{e.args[0]} (--switch takes a switch of --version {version}, "
                                f"as its flag without the dashes)") from None
    impl = implementation_for(version, options, {"optimizer": optimizer}, device, p.model)
    return predict(p.model, batch or p.batch_size, seq or p.seq_len, precision, impl,
                   grad_checkpoint, 1, device)
