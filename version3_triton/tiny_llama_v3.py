"""Version 3: V2's fused model with hand-written Triton kernels.

Four operations of V2 are replaced by our own kernels (the kernels/ package),
each with a forward AND a backward kernel (1-3, 6), and two fusions cross the
boundaries between operations that neither PyTorch nor torch.compile crosses (4-5):

1. RMSNorm: one read of x and one write of y per element, the row statistic
   kept for the backward. Under autocast the kernel writes bf16/fp16 directly -
   the dtype the next matrix product would cast to anyway - which saves a cast
   kernel and half the bytes of each norm's output.
2. Attention: flash attention. V2 writes the T x T score matrix to memory,
   masks it, softmaxes it and reads it back; the kernel computes scores tile by
   tile in on-chip memory with an online softmax, skips the tiles above the
   causal diagonal, reads each k/v head once for its whole GQA group, and
   recomputes the scores in the backward instead of storing them.
3. RoPE: V2 rotates q and k with eight small PyTorch operations each; one
   kernel rotates both (their heads are neighbours in the QKV GEMM's output)
   with one read and one write. With --rope-in-attention (eager only) the
   attention kernels instead rotate each q and k tile in registers as they
   load it, forward and backward (whose dq and dk they rotate back before
   storing), so RoPE moves no bytes of its own.
4. The QKV gradient in one piece: q, k and v are slices of the QKV GEMM's
   output, and handed to autograd separately (RoPE, attention, slices) their
   gradients come back as separate tensors that autograd then gathers into the
   QKV gradient (zero-filled buffers, copies, adds). RoPE and attention as one
   autograd step (kernels/qkv_attention.py) let the kernels store dv and the
   rotated-back dq, dk straight into their slots of one QKV-shaped gradient.
   With --recompute-rope (off by default) the rotated q and k are not kept for
   the backward, which rotates them again from the QKV output.
5. Residual add + RMSNorm: every norm but the first follows an add to the
   residual stream, h = x + branch output. The norm's kernels do that add too:
   the forward reads x and the branch output once and writes h and the norm's
   output, so the add's own pass (two reads, one write) and the norm's re-read
   of h disappear; the backward adds the residual path's gradient inside the
   norm's backward kernel instead of in a separate add. With --recompute-norm
   (off by default) the norm's output is not kept for the GEMM after it: the
   backward runs the norm's forward kernel again.
6. SwiGLU's middle, silu(gate) * up, as one kernel each way on the gate/up
   GEMM's output: the backward recomputes sigmoid(gate) instead of saving it and
   writes [d gate | d up] whole, where V2 hands gate and up to autograd as two
   views whose gradients it then gathers. With --recompute-swiglu (off by default)
   silu(gate) * up is not kept for the down projection's backward at all: the
   backward runs the forward kernel again (memory for one cheap kernel).

The matrix products stay with the vendor's BLAS (cuBLAS / hipBLASLt): the
lesson is "Triton for memory-bound and fused ops, vendor BLAS for GEMMs".

Switches (--no-triton-rmsnorm, --no-triton-attention, --no-triton-rope,
--no-fused-residual-norm, --no-fused-qkv-grad, --no-triton-swiglu, V2's fusion
flags; spec.py declares them and which needs which) measure each piece alone; --rope-in-attention
and the recomputations (--recompute-norm, --recompute-rope, --recompute-swiglu) are options,
off by default, measured against the default the same way. Block sizes of the kernels can be
forced for an exercise, e.g.
V3_ATTN_FWD_CONFIG="BLOCK_M=64,BLOCK_N=32,num_warps=4" - see the top of
kernels/configs.py; the results JSON records any forced configuration.

Without a GPU the kernels run in Triton's CPU interpreter (slow, tiny preset).

Run:  python version3_triton/tiny_llama_v3.py --preset tiny
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
import training  # noqa: E402
from harness import ModelConfig, UsageError  # noqa: E402
from version2_fused import tiny_llama_v2 as v2  # noqa: E402
from version3_triton.spec import SPEC  # noqa: E402

if not torch.cuda.is_available():  # must happen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    from version3_triton import kernels  # noqa: E402
    TRITON_MISSING = None
except ImportError as e:  # no triton: V3 cannot run, everything else still imports
    kernels, TRITON_MISSING = None, e


def silence_interpreter_warnings() -> None:
    """Triton's interpreter computes in numpy, which warns of every overflow and NaN where
    it happens, a dozen lines a step; the training loop names the step whose loss became
    NaN in one line."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


if kernels is not None and kernels.INTERPRET:
    silence_interpreter_warnings()


def require_triton() -> None:
    if kernels is None:
        raise UsageError(f"version 3 needs Triton ({TRITON_MISSING}); install the triton that "
                         f"matches your torch (pip install triton, or pytorch-triton-rocm)")


@dataclass(frozen=True)
class Kernels:
    """V3's kernel switches as the model runs them (settled by SPEC.settle: spec.py
    declares their defaults and which switch needs which)."""
    triton_rmsnorm: bool
    triton_attention: bool
    triton_rope: bool
    rope_in_attention: bool
    fused_residual_norm: bool
    fused_qkv_grad: bool
    recompute_rope: bool
    triton_swiglu: bool
    recompute_swiglu: bool
    recompute_norm: bool
    fused_linear_ce: bool

    @property
    def any_kernel(self) -> bool:
        return self.triton_rmsnorm or self.triton_attention or self.triton_rope or self.triton_swiglu


def split_switches(settled: dict) -> tuple[v2.Fusions, Kernels]:
    """V2's fusions and V3's kernels from one dict of settled switches (SPEC.settle's, as
    the command line records them; a recorded fact such as kernel_configs is left out)."""
    fusions = {f.name for f in fields(v2.Fusions)}
    kernels = {f.name for f in fields(Kernels)}
    return (v2.Fusions(**{k: v for k, v in settled.items() if k in fusions}),
            Kernels(**{k: v for k, v in settled.items() if k in kernels}))


class TritonRMSNorm(v2.PlainRMSNorm):
    """V1's RMSNorm (same `weight` parameter) computed by the Triton kernels."""

    def forward(self, x):
        return kernels.rms_norm(x, self.weight, self.eps, self.out_dtype(x))

    def add_and_norm(self, x, delta):
        """(x + delta, norm(x + delta)) in one kernel each way; delta None: (x, norm(x))."""
        return kernels.add_rms_norm(x, delta, self.weight, self.eps, self.out_dtype(x))

    @staticmethod
    def out_dtype(x):
        """Under autocast, the dtype the next matmul casts to anyway (the kernel writes it)."""
        device = x.device.type
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


class TritonAttention(v2.Attention):
    """V2's attention (one QKV GEMM) with Triton kernels for RoPE and/or its core."""

    def __init__(self, cfg: ModelConfig, fusions: v2.Fusions, use: Kernels):
        super().__init__(cfg, fusions)
        self.flash = use.triton_attention
        self.triton_rope = use.triton_rope
        self.rope_in_attention = use.rope_in_attention
        self.fused_qkv_grad = use.fused_qkv_grad
        self.recompute_rope = use.recompute_rope

    def forward(self, x, cos, sin):
        if not self.triton_rope:
            return super().forward(x, cos, sin)
        return self.from_qkv(F.linear(x, self.qkv_proj.weight), cos, sin)

    def from_qkv(self, qkv, cos, sin):
        """The rest of forward, from the QKV GEMM's output (B, T, all heads * head_dim)."""
        B, T, _ = qkv.shape
        H, H_kv = self.num_heads, self.num_kv_heads
        qkv = qkv.view(B, T, H + 2 * H_kv, self.head_dim)
        if self.fused_qkv_grad and not self.rope_in_attention:
            # RoPE + attention on qkv itself; the backward writes qkv's gradient whole
            out = kernels.qkv_attention(qkv, cos, sin, H, recompute_rope=self.recompute_rope)
        else:
            # (B, T, heads, D) memory seen as (B, heads, T, D): views, no copies (made only
            # here: each view is a dispatch and an autograd node the fused path has no use for)
            q, k, v = (t.transpose(1, 2) for t in qkv.split([H, H_kv, H_kv], dim=2))
            if self.rope_in_attention:  # the attention kernels rotate q and k as they load them
                out = kernels.flash_attention_rope(q, k, v, cos, sin)
            else:
                qk = kernels.rope(qkv[:, :, :H + H_kv], cos, sin)  # q and k heads, rotated in one kernel
                out = self.attend(qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def attend(self, q, k, v):
        return kernels.flash_attention(q, k, v) if self.flash else super().attend(q, k, v)


class TritonSwiGLU(v2.SwiGLU):
    """V2's MLP (same parameters) with silu(gate) * up as one Triton kernel each way on the
    gate/up GEMM's output; the backward kernel writes that output's gradient whole."""

    def forward(self, x):
        return self.from_gate_up(F.linear(x, self.gate_up_proj.weight))

    def from_gate_up(self, gate_up):
        """The rest of forward, from the gate/up GEMM's output."""
        return self.down_proj(kernels.swiglu(gate_up))


class RecomputingSwiGLU(TritonSwiGLU):
    """TritonSwiGLU whose silu(gate) * up is rebuilt in the backward (--recompute-swiglu):
    the down projection runs inside kernels.swiglu_linear, so autograd never keeps its input."""

    def from_gate_up(self, gate_up):
        return kernels.swiglu_linear(gate_up, self.down_proj.weight)


class ResidualNormBlock(v2.Block):
    """V2's block (same modules) that takes the residual stream x and the previous
    block's output `delta` not yet added to it, so each norm does the add in front
    of it; returns (x, this block's output)."""

    def forward(self, x, delta, cos, sin):
        x, h = self.attn_norm.add_and_norm(x, delta)  # x += delta; h = norm(x)
        x, h = self.mlp_norm.add_and_norm(x, self.attn(h, cos, sin))
        return x, self.mlp(h)


class RecomputingNormBlock(ResidualNormBlock):
    """ResidualNormBlock whose norm outputs are rebuilt in the backward (--recompute-norm):
    each norm runs with the GEMM after it (the QKV, the gate/up) in kernels.add_rms_norm_linear,
    so autograd never keeps the norm's output."""

    def forward(self, x, delta, cos, sin):
        attn, mlp = self.attn, self.mlp
        x, qkv = kernels.add_rms_norm_linear(x, delta, self.attn_norm.weight,
                                             attn.qkv_proj.weight, self.attn_norm.eps)
        x, gate_up = kernels.add_rms_norm_linear(x, attn.from_qkv(qkv, cos, sin), self.mlp_norm.weight,
                                                 mlp.gate_up_proj.weight, self.mlp_norm.eps)
        return x, mlp.from_gate_up(gate_up)


class ResidualNormLlama(v2.TinyLlama):
    """V2's model (same modules, same parameter names) built of ResidualNormBlocks;
    the final norm adds the last block's output. With --fused-linear-ce, forward(ids,
    targets) returns the mean loss, computed with the output layer a chunk of rows at a
    time (the harness passes the targets to a model with loss_in_forward set)."""

    def __init__(self, *args, fused_linear_ce: bool = False, block=ResidualNormBlock, **parts):
        super().__init__(*args, block=block, **parts)
        self.loss_in_forward = fused_linear_ce

    def forward(self, ids, targets=None):
        T = ids.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x, delta = self.embed(ids), None
        for block in self.layers:
            x, delta = block(x, delta, cos, sin)
        h = self.norm.add_and_norm(x, delta)[1]
        if targets is not None and self.loss_in_forward:
            return _chunked_loss(h, self.lm_head.weight, targets)
        return self.lm_head(h)


# The chunk loop runs in Python: torch.compile leaves it out of its graph and it runs eagerly.
_chunked_loss = torch.compiler.disable(kernels.linear_cross_entropy) if kernels is not None else None


def build_model(config: ModelConfig, kernel_configs: dict | None = None, **switches) -> nn.Module:
    """switches: V2's fusions and V3's Kernels by name; the ones not given take their
    defaults and a switch whose needs are off is off (SPEC.settle: what the command line
    passes is settled already, and settling it again changes nothing). kernel_configs is
    only recorded (forced launch configurations); it changes nothing."""
    fusions, use = split_switches(SPEC.settle(switches, config))
    any_kernel = use.any_kernel
    if any_kernel:
        require_triton()

    def attention(cfg, fusions):
        if use.triton_attention or use.triton_rope:
            return TritonAttention(cfg, fusions, use)
        return v2.Attention(cfg, fusions)

    def norm(dim, eps, fused):  # the Triton norm has V2's `weight`: V1's weights load
        return TritonRMSNorm(dim, eps) if use.triton_rmsnorm else v2.RMSNorm(dim, eps, fused)

    mlp = (RecomputingSwiGLU if use.recompute_swiglu else TritonSwiGLU if use.triton_swiglu
           else v2.SwiGLU)
    parts = dict(attention=attention, norm=norm, mlp=mlp)
    if use.fused_residual_norm:
        block = RecomputingNormBlock if use.recompute_norm else ResidualNormBlock
        model = ResidualNormLlama(config, fusions, fused_linear_ce=use.fused_linear_ce,
                                  block=block, **parts)
    else:
        model = v2.TinyLlama(config, fusions, **parts)
    if any_kernel:
        # `with model.flop_counting():` routes the kernels' eager calls through their
        # torch.library operators, the only calls FlopCounterMode sees (it counts
        # attention by the FLOP formula registered on the operator). The FLOP-counting
        # profiler enters it around the step it counts; ordinary runs skip the
        # operators' host cost (kernels/common.py, "operators").
        model.flop_counting = kernels.eager_operators
    if any_kernel and kernels.INTERPRET:  # the harness adds these to the results
        model.run_warnings = ["the Triton kernels ran in Triton's CPU interpreter "
                              "(TRITON_INTERPRET=1): a correctness demo, not a speed measurement"]
    elif use.triton_attention and kernels.triton_backend() == "hip" and torch.cuda.is_available():
        slow = kernels.attention_warning(kernels.current_target())  # MI50, Radeon: no tuned configs
        if slow:
            print(f"warning: {slow}", file=sys.stderr)
            model.run_warnings = [slow]
    return model


# ---- command line (the switches' flags come from SPEC) ----------------------------
def forced_configs(run) -> dict:
    """Launch configurations forced through the environment, checked before training
    starts (ValueError says what is wrong), with their defaults filled in. The variables
    are read here, once: a launch never reads the environment."""
    cfg = run.settings.model
    kernels.read_environment()
    checked = {}
    for name in kernels.KERNEL_NAMES:
        config = kernels.forced_config(name)
        if config is not None:
            width = (cfg.hidden_dim if name.startswith("rmsnorm") else
                     cfg.vocab_size if name == "cross_entropy" else cfg.head_dim)
            checked[name] = kernels.check_config(name, config, width, run.bytes_per_value)
    return checked


def preflight(args, run) -> dict:
    """Once, before training: can the kernels run here, and which launch configs are forced?"""
    forced = {}
    _, use = split_switches(run.settings.options)  # settled by the command line (SPEC.options)
    if use.any_kernel:
        require_triton()
        if use.rope_in_attention and use.recompute_rope:
            raise UsageError("--recompute-rope has nothing to recompute with --rope-in-attention, "
                             "which keeps no rotated q and k (drop one of the two)")
        if use.rope_in_attention and args.compile:
            raise UsageError("--rope-in-attention runs eager only: its kernels do not yet run "
                             "correctly under --compile (drop one of the two)")
        on_cpu = run.device.type == "cpu"
        if on_cpu and not kernels.INTERPRET:
            raise UsageError("the Triton kernels need a GPU; for --device cpu set "
                             "TRITON_INTERPRET=1 (Triton's slow CPU interpreter)")
        if on_cpu and args.precision == "bf16" and use.triton_attention:
            raise UsageError("Triton's CPU interpreter cannot run bf16 attention "
                             "(use --precision fp32 on the CPU)")
        try:
            forced = forced_configs(run)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return {"kernel_configs": forced}


def main(argv=None) -> int:
    return training.main(SPEC, build_model, argv=argv, preflight=preflight,
                         interpreted=kernels is not None and kernels.INTERPRET,
                         description="Version 3: V2 with Triton RMSNorm and flash-attention "
                                    "kernels (forward and backward).")


if __name__ == "__main__":
    sys.exit(main())
