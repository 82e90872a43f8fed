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

Backward runs as an eager training step runs it (harness/training_step.py: on the
calling thread, the garbage collector at fixed steps); one pair of rows shows what the
autograd engine's worker thread, its default, adds to a backward.

Two tables. The layers of one call: a plain torch op, Triton's own launch, V3's
bound launch (common.py), the launcher with its output buffers, without and with its
launch plan, the torch.library operator. Then every V3 operation beside the PyTorch
call it replaces in version 4, with the kernels each launches: the forward as a training
step runs it (under bf16 autocast, inputs requiring gradients) and forward + backward
through autograd. A V3 row names its PyTorch row in "replaces", and costs the host no
more when its ratio is <= 1.

What a V3 call replaces is what the step would run without it. V3's norms write the bf16
copy the next GEMM reads (the dtype autocast would cast to); V4's F.rms_norm writes fp32
and that GEMM casts it, one more kernel: the PyTorch rows hold that cast (as a Python
`.to`, which parses its arguments; autocast makes it from C++, a microsecond or so less).
The fused linear + cross-entropy runs where the GPU sets the pace (chunks of a large
GEMM): its row stands "beside" PyTorch's with its launches, and is not judged on host time.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
from harness import results  # noqa: E402
from harness import device as devices  # noqa: E402
from harness.measure import host_ms  # noqa: E402
from harness.training_step import host_settings  # noqa: E402


def cases(tk, dev: str = "cuda", dt: torch.dtype = torch.bfloat16):
    """[(name, call, replaces)] on tiny tensors: the GPU work is a few microseconds.
    `replaces` names the PyTorch row a V3 row stands in for (None: a layer or a torch row).
    (On the CPU, under Triton's interpreter and in fp32, the tests call each once.)"""
    from version2_fused import tiny_llama_v2 as v2
    from version3_triton.kernels import common, rmsnorm
    from version3_triton.tiny_llama_v3 import TritonRMSNorm
    from version4_sdpa.tiny_llama_v4 import causal_sdpa

    out_dtype = TritonRMSNorm.out_dtype  # what V3's norm module passes: the autocast dtype

    def leaf(*shape, dtype=dt):
        return torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)

    # RMSNorm at the small preset's width on the fp32 residual stream (autocast leaves the
    # embedding and the adds in fp32: what the norms of every version see); attention with 4
    # query and 2 key/value heads.
    x, w = leaf(8, 1024, dtype=torch.float32), leaf(1024, dtype=torch.float32)
    delta = leaf(8, 1024)  # a GEMM's output, in the compute dtype
    B, T, H, H_kv, D = 1, 64, 4, 2, 64
    qkv = leaf(B, T, H + 2 * H_kv, D)
    q, k, v = (leaf(B, heads, T, D) for heads in (H, H_kv, H_kv))
    # head size 128: the large preset's (an sm_90 GPU runs V3's Hopper kernels, TMA descriptors
    # and all, at 64 and 128)
    q128, k128, v128 = (leaf(B, heads, T, 128) for heads in (H, H_kv, H_kv))
    angles = torch.rand(T, D // 2, device=dev)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1) for f in (torch.cos, torch.sin))
    gate_up = leaf(8, 2 * 1024)
    h, lm_head, targets = leaf(64, 256), leaf(1024, 256), torch.randint(0, 1024, (64,), device=dev)
    y = tk.rmsnorm_forward(x.detach(), w.detach(), 1e-5)

    def jit_launch():  # Triton's own launch, every argument fixed, no autotuner
        rmsnorm._rmsnorm_fwd_kernel[(8,)](x, None, w, None, y, 8, 1024, 1024, 0, 1024, 1e-5,
                                          ADD_DELTA=False, BLOCK_ROWS=1, BLOCK_COLS=1024,
                                          num_warps=4, num_stages=1)

    def v3_launch():  # the same kernel through common.launch: bound after the first call
        common.launch(rmsnorm.FWD, rmsnorm._rmsnorm_fwd_kernel, rmsnorm.TUNING_KEY, lambda c: (8,),
                      x, None, w, None, y, 8, 1024, 1024, 0, 1024, 1e-5,
                      ADD_DELTA=False, BLOCK_COLS=1024)

    def through_triton():
        bind, common.BIND = common.BIND, False
        try:
            v3_launch()
        finally:
            common.BIND = bind

    def without_plan(call):  # the launcher's own way, a bound launch keyed by every argument
        def run():
            common.USE_PLANS = False
            try:
                call()
            finally:
                common.USE_PLANS = True
        return run

    def attention_forward():
        return tk.attention_forward(q.detach(), k.detach(), v.detach(), 0.125)

    def torch_rope(t):  # V4: V2's rotation on the (B, heads, T, D) view
        return v2.apply_rope(t.transpose(1, 2), cos, sin).transpose(1, 2)

    def torch_qkv_attention(t):  # V4: split, rotate q and k, SDPA
        q_, k_, v_ = t.split([H, H_kv, H_kv], dim=2)
        return causal_sdpa(*(v2.apply_rope(s.transpose(1, 2), cos, sin) for s in (q_, k_)),
                           v_.transpose(1, 2))

    silu_mul = (v2.silu_mul_one_kernel() if dev == "cuda" and v2.can_generate_kernels()
                else v2.silu_mul)  # what V2/V4's SwiGLU runs on this device

    def torch_swiglu(t):
        return silu_mul(*t.chunk(2, dim=-1))

    def torch_add_rms_norm(a, b, weight):
        s = a + b
        return s, F.rms_norm(s, (1024,), weight, 1e-5).to(dt)

    def torch_cross_entropy(a, weight):
        return F.cross_entropy(F.linear(a, weight).float(), targets)

    # (V3 name, V3 call, PyTorch name, PyTorch call, the inputs, their gradient's shape)
    pairs = [
        ("rms_norm", lambda a, b: tk.rms_norm(a, b, 1e-5, out_dtype(a)),
         "F.rms_norm, cast for the GEMM", lambda a, b: F.rms_norm(a, (1024,), b, 1e-5).to(dt),
         (x, w)),
        ("add_rms_norm", lambda a, b, c: tk.add_rms_norm(a, b, c, 1e-5, out_dtype(a))[1],
         "x + delta, F.rms_norm, cast for the GEMM",
         lambda a, b, c: torch_add_rms_norm(a, b, c)[1], (x, delta, w)),
        ("rope", lambda t: tk.rope(t, cos, sin), "V2's apply_rope", torch_rope, (q.transpose(1, 2),)),
        ("swiglu", tk.swiglu, "V2's silu_mul", torch_swiglu, (gate_up,)),
        ("qkv_attention", lambda t: tk.qkv_attention(t, cos, sin, H),
         "split, apply_rope x2, SDPA", torch_qkv_attention, (qkv,)),
        ("flash_attention", tk.flash_attention,
         "SDPA", lambda a, b, c: causal_sdpa(a, b, c), (q, k, v)),
        ("flash_attention at head size 128", tk.flash_attention,
         "SDPA at head size 128", lambda a, b, c: causal_sdpa(a, b, c), (q128, k128, v128)),
        ("linear_cross_entropy", lambda a, b: tk.linear_cross_entropy(a, b, targets),
         "linear, cross_entropy", torch_cross_entropy, (h, lm_head)),
    ]
    def engine_worker_thread(fn):  # the autograd engine's default for a CUDA backward
        def call():
            with torch.autograd.set_multithreading_enabled(True):
                fn()
        return call

    scaled = _call("fwd+bwd", lambda a: a * 2, (x,), torch.ones_like(x))
    rows = [
        ("torch: x + 1 (one elementwise kernel)", lambda: x.detach() + 1, None),
        ("torch: x * 2 fwd+bwd, the backward on the calling thread", scaled, None),
        ("torch: x * 2 fwd+bwd, the backward on autograd's worker thread",
         engine_worker_thread(scaled), None),
        ("triton: JIT launch through kernel[grid]", jit_launch, None),
        ("v3: common.launch, bound (CompiledKernel called directly)", v3_launch, None),
        ("v3: common.launch through Triton (V3_JIT_LAUNCH=1)", through_triton, None),
        ("v3: rmsnorm_forward, bound launch, no plan (+ its output buffer)",
         without_plan(lambda: tk.rmsnorm_forward(x.detach(), w.detach(), 1e-5)), None),
        ("v3: rmsnorm_forward, its plan replayed (+ its output buffer)",
         lambda: tk.rmsnorm_forward(x.detach(), w.detach(), 1e-5), None),
        ("v3: attention_forward, bound launch, no plan (+ o and lse)",
         without_plan(attention_forward), None),
        ("v3: attention_forward, its plan replayed (+ o and lse)", attention_forward, None),
        ("v3: the torch.library operator (torch.compile's path)",
         lambda: rmsnorm._forward_op(x.detach(), w.detach(), 1e-5), None),
    ]
    for v3_name, v3_call, torch_name, torch_call, inputs in pairs:
        grad_out = torch.ones_like(torch_call(*inputs))
        for part in ("forward", "fwd+bwd"):
            torch_row = f"torch: {torch_name} {part}"
            rows.append((torch_row, _call(part, torch_call, inputs, grad_out), None))
            rows.append((f"v3: {v3_name} {part}", _call(part, v3_call, inputs, grad_out), torch_row))
    return rows


def _call(part: str, fn, inputs, grad_out):
    """The forward as a training step runs it (inputs requiring gradients), or forward +
    backward through autograd."""
    if part == "forward":
        return lambda: fn(*inputs)
    return lambda: torch.autograd.grad(fn(*inputs), inputs, grad_out)


def launches(fn) -> int:
    """Kernels (and memsets/copies) one call puts on the GPU, counted by PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    from torch.autograd import DeviceType

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


GPU_PACED = ("linear_cross_entropy",)  # V3 operations shown beside PyTorch's, not judged


ROUNDS, CALLS_PER_SAMPLE = 21, 100


def measure(calls, rounds: int = ROUNDS, calls_per_sample: int = CALLS_PER_SAMPLE) -> list[dict]:
    """Each row's median of `rounds` samples of `calls_per_sample` calls, all rows taken in
    turn each round (in the listed order, reversed on alternate rounds). A V3 row's ratio is the median over rounds
    of its sample over its PyTorch row's sample of the same round, taken moments apart: a host
    whose speed drifts by a third over a minute moves both alike, and the ratio keeps still
    where the microseconds do not. `ratio_iqr`: the middle half of those ratios."""
    samples = {name: [] for name, _, _ in calls}
    for round_ in range(rounds):
        for name, fn, _ in calls if round_ % 2 == 0 else calls[::-1]:
            samples[name].append(1000 * host_ms(fn, calls=calls_per_sample,
                                                warmup=5 if round_ == 0 else 0))
    rows = [{"call": name, "host_us": statistics.median(samples[name]),
             "launches": launches(fn), "replaces": replaces} for name, fn, replaces in calls]
    for row in rows:
        if row["replaces"]:
            ratios = [a / b for a, b in zip(samples[row["call"]], samples[row["replaces"]])]
            quartiles = statistics.quantiles(ratios, n=4)
            row["ratio"], row["ratio_iqr"] = statistics.median(ratios), [quartiles[0], quartiles[2]]
            if row["call"].split()[1] in GPU_PACED:
                row["beside"] = row.pop("replaces")
        else:
            del row["replaces"]
    return rows


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
                        help="also print the N functions with the most Python time per V3 fwd+bwd")
    parser.add_argument("--output", help="write the table as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: host_overhead.py measures GPU launches; no CUDA/ROCm GPU here", file=sys.stderr)
        return 2
    from version3_triton import kernels as tk
    from version3_triton.kernels import common
    import triton

    calls = cases(tk)
    # As eager training runs: under bf16 autocast, the backward on this thread (where
    # cProfile sees it too).
    with (host_settings(torch.device("cuda"), world_size=1, compiled=False),
          torch.autocast("cuda", dtype=torch.bfloat16)):
        rows = measure(calls)
        profiles = [(name, profile_text(fn, args.cprofile)) for name, fn, _ in calls
                    if args.cprofile and name.startswith("v3:") and name.endswith("fwd+bwd")]
    print(f"{devices.device_name(torch.device('cuda'))}, torch {torch.__version__}, "
          f"triton {triton.__version__}, V3 launches {common.launch_path()}: "
          f"host microseconds per call (median of {ROUNDS} rounds of {CALLS_PER_SAMPLE} calls, the "
          f"rows in turn; "
          f"v3/torch: the median of each round's ratio, with the middle half of them)")
    print(f"  {'call':58s} {'us':>7s} {'kernels':>7s} {'v3/torch':>8s} {'middle half':>11s}")
    for row in rows:
        ratio = (f"{row['ratio']:8.2f} {row['ratio_iqr'][0]:5.2f}-{row['ratio_iqr'][1]:<5.2f}"
                 if "ratio" in row else "")
        print(f"  {row['call']:58s} {row['host_us']:7.1f} {row['launches']:7d} {ratio}")
    paired = [r for r in rows if "replaces" in r]
    dearer = [r["call"] for r in paired if r["ratio"] > 1]
    print(f"{len(paired) - len(dearer)} of {len(paired)} V3 calls cost the host no more than the "
          f"PyTorch call they replace" + (f"; dearer: {', '.join(dearer)}" if dearer else "")
          + f" (beside, not judged: {', '.join(GPU_PACED)}, paced by the GPU)")
    for name, text in profiles:
        print(f"\n=== cProfile: {name} (300 calls, sorted by own time)")
        print(text)
    if args.output:
        results.write_json(args.output, {  # never a half-written file
            "device": devices.device_name(torch.device("cuda")), "torch": torch.__version__,
            "triton": triton.__version__, "git_commit": results.git_commit(),
            "created": results.now(), "bound_launch": common.BIND,
            "launch_path": common.launch_path(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
