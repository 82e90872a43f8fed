"""How much host (CPU) time does one call cost before the GPU can start it?

    python benchmarks/host_overhead.py                 # table, GPU
    python benchmarks/host_overhead.py --cprofile 25   # plus where the Python time goes
    python benchmarks/host_overhead.py --output results/host_overhead.json

At the workshop's sizes a kernel runs for 5-100 us, about what Python, the
PyTorch dispatcher and a kernel launcher spend deciding how to launch it. When
the host is slower than the GPU, the GPU waits, and a faster kernel changes
nothing. This script measures that host cost alone: every call gets a tiny
input (so the GPU finishes each kernel long before the next is launched) and
we time many calls back to back on the CPU clock without waiting for the GPU.
Microseconds per call = host time, the floor under any step that makes that call.

Compare a raw Triton launch, version 3's launchers and autograd functions, and
the PyTorch operations version 4 uses instead (F.rms_norm, SDPA).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
from harness import results  # noqa: E402
from harness import device as devices  # noqa: E402
from harness.measure import host_ms  # noqa: E402


def cases(tk, dev: str = "cuda", dt: torch.dtype = torch.bfloat16):
    """(name, callable) pairs on tiny tensors: the GPU work is a few microseconds.
    (On the CPU, under Triton's interpreter and in fp32, the tests call each once.)"""
    x = torch.randn(8, 1024, device=dev, dtype=dt, requires_grad=True)
    w = torch.ones(1024, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn_like(x)
    q, k, v = (torch.randn(1, 2, 64, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    go = torch.randn_like(q)
    y, rstd = tk.rmsnorm_forward(x.detach(), w.detach(), 1e-5)
    o, lse = tk.attention_forward(q.detach(), k.detach(), v.detach(), 0.125)

    from version3_triton.kernels.rmsnorm import _rmsnorm_fwd_kernel

    def raw_rmsnorm_launch():  # the Triton launch alone, every argument fixed, no autotuner
        _rmsnorm_fwd_kernel[(8,)](x, x, w, y, y, rstd, 8, 1024, 1024, 0, 1024, 1e-5,
                                  ADD_DELTA=False, BLOCK_ROWS=1, BLOCK_COLS=1024,
                                  num_warps=4, num_stages=1)

    def grads(fn, inputs, grad_out):
        return lambda: torch.autograd.grad(fn(*inputs), inputs, grad_out)

    return [
        ("torch: x + 1 (one elementwise kernel)", lambda: x.detach() + 1),
        ("triton: raw rmsnorm launch", raw_rmsnorm_launch),
        ("v3: rmsnorm_forward (operator)", lambda: tk.rmsnorm_forward(x.detach(), w.detach(), 1e-5)),
        ("v3: rmsnorm_backward (operator)",
         lambda: tk.rmsnorm_backward(gy, x.detach(), w.detach(), rstd)),
        ("torch: F.rms_norm forward", lambda: F.rms_norm(x.detach(), (1024,), w.detach(), 1e-5)),
        ("v3: rms_norm fwd+bwd (autograd)", grads(lambda a, b: tk.rms_norm(a, b, 1e-5), (x, w), gy)),
        ("torch: F.rms_norm fwd+bwd", grads(lambda a, b: F.rms_norm(a, (1024,), b, 1e-5), (x, w), gy)),
        ("v3: attention_forward (operator)",
         lambda: tk.attention_forward(q.detach(), k.detach(), v.detach(), 0.125)),
        ("v3: attention_backward (operator)",
         lambda: tk.attention_backward(go, q.detach(), k.detach(), v.detach(), o, lse, 0.125)),
        ("torch: SDPA forward", lambda: F.scaled_dot_product_attention(
            q.detach(), k.detach(), v.detach(), is_causal=True)),
        ("v3: flash_attention fwd+bwd (autograd)", grads(tk.flash_attention, (q, k, v), go)),
        ("torch: SDPA fwd+bwd", grads(lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, is_causal=True), (q, k, v), go)),
    ]


def profile_text(fn, top: int, calls: int = 300) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N functions with the most Python time per fwd+bwd")
    parser.add_argument("--output", help="write the table as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: host_overhead.py measures GPU launches; no CUDA/ROCm GPU here", file=sys.stderr)
        return 2
    from version3_triton import kernels as tk
    import triton

    calls = cases(tk)
    rows = [{"call": name, "host_us": 1000 * host_ms(fn, calls=200, repeats=5, warmup=5)}
            for name, fn in calls]
    print(f"{devices.device_name(torch.device('cuda'))}, torch {torch.__version__}, "
          f"triton {triton.__version__}: host microseconds per call (median of 5 x 200 calls)")
    print(f"  {'call':42s} {'us':>8s}")
    for row in rows:
        print(f"  {row['call']:42s} {row['host_us']:8.1f}")
    if args.cprofile:
        for name, fn in calls:
            if "fwd+bwd (autograd)" in name:
                print(f"\n=== cProfile: {name} (300 calls, sorted by own time)")
                print(profile_text(fn, args.cprofile))
    if args.output:
        results.write_json(args.output, {  # never a half-written file
            "device": devices.device_name(torch.device("cuda")), "torch": torch.__version__,
            "triton": triton.__version__, "git_commit": results.git_commit(),
            "created": results.now(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
