"""What autograd runs between your kernels: the operators of one backward, counted.

    python benchmarks/backward_ops.py

Two places where V3 has the kernels write a gradient in one piece, each against the
separate steps it replaces: attention on the QKV GEMM's output (RoPE kernel, attention
kernel, slices of one tensor) and SwiGLU's middle on the gate/up GEMM's output. For each,
the PyTorch operators the backward dispatches besides the kernels: the separate steps'
gradients come back as tensors of their own, and autograd gathers them into the GEMM
output's gradient with slice_backward (a zero-filled buffer of the whole output and a copy
into it, per slice) and add. Runs on a GPU, or on a CPU in Triton's interpreter.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
if not torch.cuda.is_available():  # before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
from version2_fused.tiny_llama_v2 import silu_mul  # noqa: E402
from version3_triton import kernels as tk  # noqa: E402
from benchmarks.bench_kernels import full_width_rope_tables  # noqa: E402

# Allocation and bookkeeping every path has (Triton's CPU interpreter adds copies of its own).
BOOKKEEPING = {"empty", "empty_strided", "new_empty", "new_empty_strided", "set_", "detach",
               "fill_"} | ({"copy_"} if tk.INTERPRET else set())


class Operators(TorchDispatchMode):
    """Counts the aten operators dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def backward_operators(fn, x: torch.Tensor) -> Counter:
    out = fn(x.detach().requires_grad_())
    grad = torch.randn_like(out)
    with Operators() as seen:
        out.backward(grad)
    return Counter({k: n for k, n in seen.counts.items() if k not in BOOKKEEPING})


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter: fp32
    B, T, H, H_kv, D, ffn = 2, 64, 4, 2, 32, 96
    qkv = torch.randn(B, T, H + 2 * H_kv, D, device=device, dtype=dtype)
    gate_up = torch.randn(B, T, 2 * ffn, device=device, dtype=dtype)
    cos, sin = full_width_rope_tables(D, T, device)

    def attention_separate(qkv):  # what V3 runs with --no-fused-qkv-grad
        qk = tk.rope(qkv[:, :, :H + H_kv], cos, sin)
        return tk.flash_attention(qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2),
                                  qkv[:, :, H + H_kv:].transpose(1, 2))

    cases = [("attention on QKV, separate steps", attention_separate, qkv),
             ("attention on QKV, qkv_attention", lambda t: tk.qkv_attention(t, cos, sin, H), qkv),
             ("SwiGLU, silu_mul on the halves", lambda t: silu_mul(*t.chunk(2, dim=-1)), gate_up),
             ("SwiGLU, swiglu", tk.swiglu, gate_up)]
    print(f"aten operators of one backward on {device} (Triton kernels not listed; "
          f"{', '.join(sorted(BOOKKEEPING))} left out)")
    for name, fn, x in cases:
        ops = backward_operators(fn, x)
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())) or "none"
        print(f"  {name:34s} {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
