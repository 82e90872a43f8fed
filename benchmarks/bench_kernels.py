"""Benchmark version 3's Triton kernels against PyTorch, forward + backward.

    python benchmarks/bench_kernels.py                  # GPU: the *_SHAPES below, bf16
    python benchmarks/bench_kernels.py --output results/v3_kernels.json
    python benchmarks/bench_kernels.py --quick          # seconds; on a CPU: the interpreter

What is measured:
- RMSNorm at 16384 x 1024: achieved GB/s against the measured device-copy
  bandwidth (a 1 GiB copy, bytes read + written). Bytes are the *minimum* any
  implementation must move: forward reads x and writes y, backward reads x and
  dy and writes dx (5 * M * N * element size), plus the per-row 1/rms (written
  once, read once: 8 * M) and the weight (read twice, its gradient written once).
- Residual add + RMSNorm (add_rms_norm, V3's --fused-residual-norm) at the same
  shape: x fp32 (the residual stream) plus delta in the benchmark's dtype (a
  branch output), against `x + delta` followed by F.rms_norm and by our unfused
  norm. Minimum bytes: the forward reads x and delta and writes h (fp32) and y;
  the backward reads dy, the residual gradient dh_in (fp32) and h, and writes dh
  (fp32) and delta's gradient: (5 * 4 + 4 * elem) * M * N, plus 1/rms and the
  (fp32) weight as above.
- SwiGLU's silu(gate) * up (V3's kernels/swiglu.py) at 8192 x 2816 (the medium
  preset's MLP) on the gate/up GEMM's output, against version 2's maths on its two
  halves, eager and compiled. Minimum bytes: 8 * M * N * elem (gate_up read twice,
  y and dy, the gradient of gate_up written).
- Causal attention, b16 h16 s512 d64 and b4 h16 s2048 d128, and two GQA shapes:
  b16 h16 kv4 s512 d64 and the large preset's b8 h16 kv8 s2048 d128,
  against F.scaled_dot_product_attention: time ratio (SDPA time / ours, > 1 means
  ours is faster) and TFLOP/s in the attention-kernel convention: 4*B*H*N^2*D
  for the forward, halved because causal, backward = 2.5x forward. Beside them,
  the same attention with RoPE: inside the kernels, as a kernel first, and on
  the QKV GEMM's output with its gradient gathered by autograd or written whole
  (qkv_attention, V3's default).

Timing: triton.testing.do_bench, median, L2 cache flushed before every run.
When a call's Python and launch work takes longer than its kernels, do_bench
measures the host, not the GPU. Three extra numbers per forward+backward show
it: "graph ms" replays the same work from a CUDA/HIP graph (GPU time alone; if
capture fails, the JSON says why), "host ms" is the Python + launch time of one
call, and "extra ms" = f+b - fwd - bwd (host work the GPU waits for; ~0 when
the kernels dominate). The targets are checked both ways: do_bench (what one
isolated call costs, host included) and graph replay (kernel time against
kernel time - what a training step sees once launches overlap the GPU's work);
attention's also in paired rounds, each replaying ours, SDPA, SDPA, ours, the
median of 9 rounds' ratios ("paired": a clock drifting over the run cancels out).
On a CPU (--quick, the Triton interpreter) the numbers
are wall-clock medians and only prove it runs. The launch configurations each
kernel ran with (autotuned, forced or by rule) are printed and saved.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
if not torch.cuda.is_available():  # before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
from harness import UsageError, WorkshopError  # noqa: E402
from harness import device as devices  # noqa: E402
from harness.probes import measure_copy_gbs  # noqa: E402
from harness.args import OneLineParser  # noqa: E402
from harness.flops import attention_flops, attention_shape  # noqa: E402
from harness.measure import Timer  # noqa: E402
from harness.results import git_commit, now, write_json  # noqa: E402
from version1_baseline.tiny_llama_v1 import RMSNorm as V1RMSNorm  # noqa: E402
from version1_baseline.tiny_llama_v1 import rope_tables  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# (rows, hidden) and (batch, heads, kv_heads, seq, head_dim)
NORM_SHAPES = {"full": [(16384, 1024), (16384, 2048)], "quick": [(64, 96)]}  # medium, large hidden
SWIGLU_SHAPES = {"full": [(8192, 2816)], "quick": [(64, 80)]}  # rows x ffn (medium: 16 x 512, 2816)
ATTENTION_SHAPES = {"full": [(16, 16, 16, 512, 64), (4, 16, 16, 2048, 128), (16, 16, 4, 512, 64),
                             (8, 16, 8, 2048, 128)],  # the last: the large preset's attention
                    "quick": [(1, 4, 2, 33, 16)]}  # GQA and a ragged last tile, in seconds
KINDS = ("rmsnorm", "add_rmsnorm", "swiglu", "attention")  # the result's row lists, in order
TARGETS = {"rmsnorm_copy_fraction": 0.6, "swiglu_copy_fraction": 0.7,
           (16, 16, 16, 512, 64): 0.8, (4, 16, 16, 2048, 128): 0.7}  # SDPA time / ours


def fwd_bwd_step(op, inputs, grad_out):
    """One forward + backward of op(*inputs) through autograd: what is timed and replayed."""
    return lambda: torch.autograd.grad(op(*inputs), inputs, grad_out)


def fwd_bwd_times(timer: Timer, op, inputs, grad_out) -> dict:
    """Forward, backward and forward+backward times of op(*inputs) (all inputs need
    grad). Only forward+backward is replayed from a graph: it is the one call whose
    autograd graph is built inside the capture, as in a training step."""
    out = op(*inputs)
    fwd = timer.bench(lambda: op(*inputs))
    bwd = timer.bench(lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True))
    # Drop that autograd graph: a graph kept alive across the CUDA-graph capture below
    # makes autograd accumulate on the wrong stream and the capture fail.
    del out
    step = fwd_bwd_step(op, inputs, grad_out)
    both = timer.bench(step)
    graph_ms, graph_error = timer.graph(step, both)
    return {"fwd_ms": fwd, "bwd_ms": bwd, "fwd_bwd_ms": both, "fwd_bwd_graph_ms": graph_ms,
            "fwd_bwd_graph_error": graph_error, "fwd_bwd_host_ms": timer.host(step),
            # > 0: fwd+bwd in one call costs more than the two timed apart - per-call
            # host work (Python, dispatch, launches) that the GPU waits for.
            "fwd_bwd_extra_ms": both - fwd - bwd}


# ---- RMSNorm -------------------------------------------------------------------------
def rmsnorm_min_bytes(rows: int, cols: int, elem: int) -> int:
    return 5 * rows * cols * elem + 3 * cols * elem


def bench_rmsnorm(tk, timer, rows, cols, dtype, device, copy_gbs) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, device=device, dtype=dtype, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(cols, device=device, generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(rows, cols, device=device, dtype=dtype, generator=g)
    v1 = V1RMSNorm(cols, 1e-5).to(device)
    impls = {"triton": lambda x, w: tk.rms_norm(x, w, 1e-5),  # V1's module, with weight w:
             "pytorch (V1 maths)": lambda x, w: torch.func.functional_call(v1, {"weight": w}, (x,))}
    if hasattr(F, "rms_norm"):
        impls["F.rms_norm"] = lambda x, w: F.rms_norm(x, (cols,), w, 1e-5)
    return bandwidth_rows(timer, impls, [x, w], dy, rmsnorm_min_bytes(rows, cols, x.element_size()),
                          f"{rows}x{cols}", dtype, copy_gbs)


def bandwidth_rows(timer, impls: dict, inputs, grads, nbytes: int, shape: str, dtype,
                   copy_gbs) -> list[dict]:
    """One row per implementation of a memory-bound op: its times, and the GB/s that moving
    its minimal `nbytes` in that time means (do_bench, graph replay, share of copy)."""
    out = []
    for name, op in impls.items():
        row = {"shape": shape, "dtype": DTYPE_NAMES[dtype], "impl": name,
               **fwd_bwd_times(timer, op, inputs, grads), "min_bytes": nbytes}
        row["gbs"] = nbytes / (row["fwd_bwd_ms"] / 1000) / 1e9
        row["graph_gbs"] = (nbytes / (row["fwd_bwd_graph_ms"] / 1000) / 1e9
                            if row["fwd_bwd_graph_ms"] else None)
        row["copy_fraction"] = row["gbs"] / copy_gbs if copy_gbs else None
        out.append(row)
    return out


def add_rmsnorm_min_bytes(rows: int, cols: int, elem: int) -> int:
    return (5 * 4 + 4 * elem) * rows * cols + 3 * cols * 4


def bench_add_rmsnorm(tk, timer, rows, cols, dtype, device, copy_gbs) -> list[dict]:
    """(h, y) = (x + delta, rms_norm(x + delta) * w) forward and backward, the gradient
    arriving at both h (the residual path) and y, as inside the model."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, device=device, generator=g).requires_grad_()
    delta = torch.randn(rows, cols, device=device, generator=g).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(cols, device=device, generator=g)).requires_grad_()
    grads = (torch.randn(rows, cols, device=device, generator=g),
             torch.randn(rows, cols, device=device, generator=g).to(dtype))

    def torch_add_norm(x, delta, w):  # y cast to the dtype the next (autocast) GEMM reads
        h = x + delta
        return h, F.rms_norm(h, (cols,), w, 1e-5).to(dtype)

    def triton_add_norm(x, delta, w):
        h = x + delta
        return h, tk.rms_norm(h, w, 1e-5, dtype)

    impls = {"triton add+norm (fused)": lambda x, d, w: tk.add_rms_norm(x, d, w, 1e-5, dtype),
             "x + delta, triton norm": triton_add_norm}
    if hasattr(F, "rms_norm"):
        impls["x + delta, F.rms_norm"] = torch_add_norm
    return bandwidth_rows(timer, impls, [x, delta, w], grads,
                          add_rmsnorm_min_bytes(rows, cols, delta.element_size()),
                          f"{rows}x{cols}", dtype, copy_gbs)


# ---- SwiGLU --------------------------------------------------------------------------
def swiglu_min_bytes(rows: int, cols: int, elem: int) -> int:
    return 8 * rows * cols * elem  # fwd: gate_up in, y out; bwd: gate_up, dy in, d gate_up out


def bench_swiglu(tk, timer, rows, cols, dtype, device, copy_gbs) -> list[dict]:
    """silu(gate) * up on the gate/up GEMM's output, forward and backward: the kernel, and
    version 2's maths on the two halves (autograd gathers their gradients), eager and as the
    one generated kernel V2 uses."""
    from version2_fused.tiny_llama_v2 import silu_mul

    g = torch.Generator(device=device).manual_seed(0)
    gate_up = torch.randn(rows, 2 * cols, device=device, dtype=dtype, generator=g).requires_grad_()
    dy = torch.randn(rows, cols, device=device, dtype=dtype, generator=g)
    impls = {"triton (gradient whole)": tk.swiglu,
             "pytorch on the halves": lambda t: silu_mul(*t.chunk(2, dim=-1))}
    if device.type == "cuda":
        one_kernel = torch.compile(silu_mul, dynamic=False)
        impls["compiled, on the halves"] = lambda t: one_kernel(*t.chunk(2, dim=-1))
    return bandwidth_rows(timer, impls, [gate_up], dy, swiglu_min_bytes(rows, cols, dtype.itemsize),
                          f"{rows}x{cols}", dtype, copy_gbs)


# ---- attention -----------------------------------------------------------------------
def sdpa(q, k, v):
    if k.shape[1] != q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_kernel_name(shape, dtype, device) -> str:
    """Which kernel SDPA dispatches to on this shape and dtype (version 4's probe), if available.

    The probe takes a precision name ("bf16"), as the command line does, and runs
    under that autocast: the kernel it names is the one the benchmark's dtype gets."""
    try:
        from harness import ModelConfig
        from version4_sdpa.sdpa_probe import probe_sdpa_kernel
        from version4_sdpa.tiny_llama_v4 import build_model
        b, h, kv, n, d = shape
        cfg = ModelConfig(hidden_dim=h * d, num_heads=h, num_kv_heads=kv, max_seq_len=n)
        return probe_sdpa_kernel(build_model, cfg, b, n, device, DTYPE_NAMES[dtype])
    except Exception:  # version 4 missing or the probe failed: the name is only a label
        return "?"


def bench_attention(tk, timer, shape, dtype, device) -> list[dict]:
    b, h, kv, n, d = shape
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, heads, n, d, device=device, dtype=dtype, generator=g).requires_grad_()
               for heads in (h, kv, kv))
    do = torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g)
    call = attention_flops(b, h, n, d)
    flops = {"fwd": call["forward"], "bwd": call["backward"],
             "fwd_bwd": call["forward"] + call["backward"]}
    label = attention_shape(b, h, kv, n, d)
    cos, sin = full_width_rope_tables(d, n, device)

    def rope_first(q, k, v):  # a RoPE kernel pass over q and k, then attention
        q, k = (tk.rope(t.transpose(1, 2), cos, sin).transpose(1, 2) for t in (q, k))
        return tk.flash_attention(q, k, v)

    # As the model calls it: q, k, v are slices of the QKV GEMM's output, one leaf.
    qkv = torch.randn(b, n, h + 2 * kv, d, device=device, dtype=dtype,
                      generator=g).requires_grad_()

    def qkv_gathered(qkv):  # RoPE kernel, attention; autograd gathers qkv's gradient
        qk = tk.rope(qkv[:, :, :h + kv], cos, sin)
        return tk.flash_attention(qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2),
                                  qkv[:, :, h + kv:].transpose(1, 2))

    # dO as the model's output projection hands it back to the QKV rows: a row per token
    do_by_token = do.transpose(1, 2).contiguous().transpose(1, 2)

    def timed(name, op, inputs) -> dict:
        times = fwd_bwd_times(timer, op, inputs, do_by_token if inputs[0] is qkv else do)
        return {"shape": label, "dims": list(shape), "dtype": DTYPE_NAMES[dtype], "impl": name,
                **times, "flops": flops,
                "tflops": flops["fwd_bwd"] / (times["fwd_bwd_ms"] / 1000) / 1e12}

    rows = [timed(name, op, inputs) for name, op, inputs in (
            ("triton", tk.flash_attention, [q, k, v]),
            (f"sdpa ({sdpa_kernel_name(shape, dtype, device)})", sdpa, [q, k, v]),
            ("triton, RoPE inside", lambda q, k, v: tk.flash_attention_rope(q, k, v, cos, sin),
             [q, k, v]),
            ("triton, RoPE kernel first", rope_first, [q, k, v]),
            ("on QKV, grad gathered", qkv_gathered, [qkv]),
            ("on QKV, grad whole", lambda qkv: tk.qkv_attention(qkv, cos, sin, h), [qkv]))]
    ours, theirs, inside, first, gathered, whole = rows
    add_time_ratios(ours, theirs, "sdpa", "ours")
    # The ratio the targets judge, once more with both graphs replayed in each round
    ratio, middle, _ = timer.paired(fwd_bwd_step(tk.flash_attention, [q, k, v], do),
                                    fwd_bwd_step(sdpa, [q, k, v], do), ours["fwd_bwd_ms"])
    if ratio is not None:
        ours["sdpa_graph_time_over_ours_paired"], ours["paired_middle_half"] = ratio, middle
    add_time_ratios(inside, first, "rope_first", "inside")
    add_time_ratios(whole, gathered, "gathered", "whole")
    if tk.attention_hopper.supported(q, k, v):  # the Hopper path's "off" row
        with tk.attention_hopper.portable():
            off = timed("triton, portable kernels (no Hopper path)", tk.flash_attention, [q, k, v])
        add_time_ratios(off, theirs, "sdpa", "ours")
        rows.insert(1, off)
    return rows


def add_time_ratios(row: dict, other: dict, other_name: str, row_name: str) -> None:
    """other's forward+backward time over row's (> 1: row is faster), timed with do_bench
    and, where both replayed from a graph, on the GPU alone."""
    row[f"{other_name}_time_over_{row_name}"] = other["fwd_bwd_ms"] / row["fwd_bwd_ms"]
    if row["fwd_bwd_graph_ms"] and other["fwd_bwd_graph_ms"]:
        row[f"{other_name}_graph_time_over_{row_name}"] = \
            other["fwd_bwd_graph_ms"] / row["fwd_bwd_graph_ms"]


def full_width_rope_tables(head_dim: int, seq_len: int, device, theta: float = 10000.0):
    """Full-width (cos, cos) / (sin, sin) tables, as version 2 builds them from V1's
    rope_tables (same arguments, same order)."""
    cos, sin = rope_tables(head_dim, seq_len, theta, device)
    return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)


# ---- report --------------------------------------------------------------------------
def fmt(value, spec=".3f", missing="-"):
    return missing if value is None else format(value, spec)


def report(result: dict) -> str:
    def row(r, *last):
        return (f"  {r['shape'] + ' ' + r['dtype']:26s} {r['impl'][:26]:26s} {fmt(r['fwd_ms']):>8s} "
                f"{fmt(r['bwd_ms']):>8s} {fmt(r['fwd_bwd_ms']):>8s} {fmt(r['fwd_bwd_graph_ms']):>8s} "
                + " ".join(last))

    d = result["device"]
    lines = [f"device: {d['name']} ({d['backend']}), torch {d['torch']}, triton {d['triton']}, "
             f"commit {result['git_commit']}",
             f"device copy bandwidth: {fmt(result['copy_gbs'], ',.0f')} GB/s "
             f"(device-to-device copy, bytes read + written)", ""]
    header = (f"  {'shape':26s} {'impl':26s} {'fwd ms':>8s} {'bwd ms':>8s} {'f+b ms':>8s} "
              f"{'graph ms':>8s} ")
    # The memory-bound kernels: GB/s from each one's minimal bytes, and its share of copy.
    for kind, title in (("rmsnorm", ["RMSNorm forward+backward; GB/s from the minimal bytes "
                                     "(5*M*N*elem + 8*M + 3*N*elem), f+b time"]),
                        ("add_rmsnorm", ["Residual add + RMSNorm forward+backward (x, h fp32; "
                                         "delta, y in the dtype shown);", "GB/s from the minimal "
                                         "bytes ((20 + 4*elem)*M*N + 8*M + 12*N), f+b time"]),
                        ("swiglu", ["SwiGLU's silu(gate) * up forward+backward on the gate/up "
                                    "GEMM's output; GB/s from the minimal bytes (8*M*N*elem), "
                                    "f+b time"])):
        if not result[kind]:  # not asked for (--kernels)
            continue
        lines += [*title, header + f"{'GB/s':>7s} {'% copy':>6s}"]
        for r in result[kind]:
            share = r["copy_fraction"] and 100 * r["copy_fraction"]
            lines.append(row(r, f"{fmt(r['gbs'], '7.0f')} {fmt(share, '5.0f')}%"))
        lines.append("")
    if result["attention"]:
        lines += ["Causal attention forward+backward; TFLOP/s = 3.5 * (4*B*H*N^2*D / 2) / f+b "
                  "time (kernel convention)", header + f"{'TFLOP/s':>7s} {'SDPA/ours':>9s}"]
    for r in result["attention"]:
        lines.append(row(r, f"{fmt(r['tflops'], '7.1f')} "
                            f"{fmt(r.get('sdpa_time_over_ours'), '9.2f', '')}"))
    lines += ["", "Host overhead per forward+backward call: 'extra' = f+b - fwd - bwd (> 0: host "
              "work the GPU waits for);", "  'host' = Python + launch time per call (GPU not "
              "waited for); host > graph (GPU-only time) means host-bound.",
              f"  {'shape':26s} {'impl':26s} {'extra ms':>8s} {'host ms':>8s} {'graph ms':>8s}"]
    every = [r for kind in KINDS for r in result[kind]]
    for r in every:
        lines.append(f"  {r['shape'] + ' ' + r['dtype']:26s} {r['impl'][:26]:26s} "
                     f"{fmt(r['fwd_bwd_extra_ms'], '+.3f'):>8s} {fmt(r['fwd_bwd_host_ms']):>8s} "
                     f"{fmt(r['fwd_bwd_graph_ms']):>8s}")
    errors = {r["fwd_bwd_graph_error"] for r in every
              if r["fwd_bwd_graph_error"] and result["device"]["type"] != "cpu"}
    lines += [f"  graph replay failed: {e}" for e in sorted(errors)]
    lines += ["", "launch configurations used:"]
    lines += [f"  {k:14s} {v}" for k, v in result["kernel_configs"].items()]
    if result["targets"]:
        lines += ["", "kernel targets:"]
        lines += [f"  {'PASS' if t['passed'] else 'MISS'}  {t['claim']}: {t['value']:.2f}"
                  for t in result["targets"]]
    return "\n".join(lines)


def check_targets(result: dict) -> list[dict]:
    if result["device"]["type"] == "cpu" or result["quick"]:
        return []
    targets = []
    triton_norm = [r for r in result["rmsnorm"] if r["impl"] == "triton"]
    goal = TARGETS["rmsnorm_copy_fraction"]
    for r in triton_norm:
        for how, gbs in (("do_bench", r["gbs"]), ("graph replay", r["graph_gbs"])):
            if gbs is not None:
                share = gbs / result["copy_gbs"]
                targets.append({"claim": f"RMSNorm {r['shape']} GB/s ({how}) >= {goal:.0%} of copy",
                                "value": share, "passed": share >= goal})
    goal = TARGETS["swiglu_copy_fraction"]
    for r in (r for r in result["swiglu"] if r["impl"].startswith("triton")):
        if r["graph_gbs"] is not None:
            share = r["graph_gbs"] / result["copy_gbs"]
            targets.append({"claim": f"SwiGLU {r['shape']} GB/s (graph replay) >= {goal:.0%} of copy",
                            "value": share, "passed": share >= goal})
    for r in (r for r in result["attention"] if r["impl"] == "triton"):  # V3 as it runs
        goal = TARGETS.get(tuple(r["dims"]))
        for how, key in (("do_bench", "sdpa_time_over_ours"),
                         ("graph replay", "sdpa_graph_time_over_ours"),
                         ("graph replay, paired rounds", "sdpa_graph_time_over_ours_paired")):
            if goal and key in r:
                targets.append({"claim": f"attention {r['shape']} SDPA time / ours ({how}) >= {goal}",
                                "value": r[key], "passed": r[key] >= goal})
    return targets


def run(args) -> dict:
    device = devices.resolve_device("auto")
    if device.type == "cpu" and not args.quick:
        raise UsageError("without a GPU the kernels run in Triton's interpreter: use --quick")
    dtype = DTYPES[args.dtype] if device.type == "cuda" else torch.float32  # no bf16 dot on CPU
    from version3_triton import kernels as tk

    size = "quick" if args.quick else "full"
    timer = Timer(device, args.quick)
    copy_gbs = measure_copy_gbs(device, nbytes=(64 << 20) if args.quick else None)
    result = {"created": now(),
              "command": " ".join(["python", *sys.argv]), "git_commit": git_commit(),
              "device": devices.describe(device), "quick": args.quick, "copy_gbs": copy_gbs,
              "conventions": {
                  "rmsnorm_bytes": "5*M*N*elem (x read twice, y, dy, dx) + 3*N*elem (w read twice, dw)",
                  "add_rmsnorm_bytes": "(5*4 + 4*elem)*M*N (fp32 x, h read twice, dh_in, dh; "
                                       "delta, y, dy, ddelta in elem) + 3*N*4",
                  "swiglu_bytes": "8*M*N*elem (gate_up read twice, y, dy, d gate_up)",
                  "attention_flops": "4*B*H*N^2*D forward, halved (causal), backward 2.5x forward",
                  "timing": "triton.testing.do_bench median, L2 flushed; graph = CUDA/HIP graph "
                            "replay of f+b (no host launch overhead); paired = 9 rounds "
                            "of both graphs' replays (ours, SDPA, SDPA, ours), median ratio; "
                            "host = wall-clock Python + "
                            "launch time per f+b call, GPU not waited for; extra = f+b - fwd - bwd"},
              **{kind: [] for kind in KINDS}}
    for rows, cols in NORM_SHAPES[size] if args.kernels in ("all", "rmsnorm") else []:
        result["rmsnorm"] += bench_rmsnorm(tk, timer, rows, cols, dtype, device, copy_gbs)
        result["add_rmsnorm"] += bench_add_rmsnorm(tk, timer, rows, cols, dtype, device, copy_gbs)
    for rows, cols in SWIGLU_SHAPES[size] if args.kernels in ("all", "swiglu") else []:
        result["swiglu"] += bench_swiglu(tk, timer, rows, cols, dtype, device, copy_gbs)
    for shape in ATTENTION_SHAPES[size] if args.kernels in ("all", "attention") else []:
        result["attention"] += bench_attention(tk, timer, shape, dtype, device)
    result["kernel_configs"] = tk.chosen_configs()
    result["targets"] = check_targets(result)
    return result


def main(argv=None) -> int:
    parser = OneLineParser(prog="bench_kernels.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, few repeats: a smoke test (the only mode on a CPU)")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                        help="GPU precision (the CPU interpreter always uses fp32)")
    parser.add_argument("--kernels", choices=("all", "rmsnorm", "swiglu", "attention"), default="all",
                        help="benchmark only these kernels (rmsnorm: with the fused residual add)")
    parser.add_argument("--output", help="write the results as JSON here")
    try:
        args = parser.parse_args(argv)
        if args.output and not args.output.endswith(".json"):
            raise UsageError("--output must end in .json")
        result = run(args)
    except WorkshopError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(report(result))
    if args.output:
        print(f"results: {write_json(args.output, result)}")  # never a half-written file
    return 0


if __name__ == "__main__":
    sys.exit(main())
