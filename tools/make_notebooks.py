"""Write the instructor notebooks (clean JSON, no outputs) from the cells below.

    python tools/make_notebooks.py           # (re)write exercises/notebooks/*.ipynb
    python tools/make_notebooks.py --check   # exit 1 if a notebook is out of date

Keeping the cells here, as plain Python strings, gives reviewable diffs and notebooks
that are always committed without outputs. Every notebook runs top to bottom on a
CPU in well under a minute (tiny preset, a few steps; Triton in its interpreter);
the parameter cell switches to the workshop's GPU sizes when a GPU is present.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO_ROOT / "exercises" / "notebooks"

PARAMETERS = '''\
# Parameters: tiny shapes on a CPU, the workshop's sizes on a GPU. Change freely.
import torch

GPU = torch.cuda.is_available()
PRESET = "medium" if GPU else "tiny"    # tiny: seconds on a CPU; small/medium: a GPU
STEPS = 30 if GPU else 6                # training steps per run (warm-up included)
WARMUP = 10 if GPU else 2               # steps excluded from timing'''

SETUP = '''\
import os
import sys
from pathlib import Path

if not GPU:  # Triton kernels run in its CPU interpreter; must be set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "harness").is_dir())
sys.path.insert(0, str(REPO))
OUT = REPO / "results" / "notebooks"

import pandas as pd

from harness.config import VERSIONS, load_version
from harness.results import format_table
from harness.results import load


def train(version, name, *flags, preset=None):
    """Run a version exactly as its command line would, in this kernel; return its results."""
    out = OUT / f"{name}.json"
    argv = ["--preset", preset or PRESET, "--num-steps", str(STEPS), "--warmup-steps", str(WARMUP),
            "--quiet", "--output", str(out), *flags]
    code = load_version(version).main(argv)
    assert code == 0, f"{name}: exit code {code} (see the error line above)"
    return load(out)


print(f"repository: {REPO}\\ndevice: {'GPU ' + torch.cuda.get_device_name(0) if GPU else 'CPU'}, "
      f"preset {PRESET}, {STEPS} steps")'''


# ---------------------------------------------------------------- 01 baseline + profiling
NB1 = [
    ("md", """\
# 1 - The baseline, and how to read a profile

Version 1 is the tiny LLaMA in plain PyTorch (`version1_baseline/tiny_llama_v1.py`). In this
notebook: train it through the shared harness, read every part of its results JSON, check the
FLOP formula behind MFU against PyTorch's own FLOP counter, and read an operator table.
Exercises: `exercises/version1/`."""),
    ("code", PARAMETERS),
    ("code", SETUP),
    ("md", """\
## 1. Train V1

`train("v1", ...)` calls `version1_baseline/tiny_llama_v1.py`'s `main` with command-line flags:
the same code path as `python version1_baseline/tiny_llama_v1.py --preset ...`."""),
    ("code", '''\
from training.trainer import summary_line

r1 = train("v1", "nb1_v1")
print(summary_line(r1))
pd.Series(r1["losses"], name="loss").plot(xlabel="step", ylabel="loss", title="V1 loss");'''),
    ("md", """\
## 2. What the results JSON records

Timing comes from device events (a wall clock on the CPU) around forward, backward and the
optimizer; medians over the steps after warm-up, with p10/p90 to show the spread. MFU divides
the model FLOPs per second by the device's datasheet peak for the precision (no peak is known
for a CPU)."""),
    ("code", '''\
pd.DataFrame(r1["timing_ms"]).T.round(3)'''),
    ("code", '''\
{key: r1[key] for key in ("throughput", "flops", "mfu", "memory", "gradient_guard", "warnings")}'''),
    ("md", """\
## 3. FLOPs: the formula against a counter

The harness counts `6 * N_matmul + 12 * L * d * T` FLOPs per token (forward + backward; see
`harness/flops.py`). `torch.utils.flop_counter.FlopCounterMode` counts what really ran, operator
by operator. They should agree up to the attention mask: V1 computes every score and masks half
of them afterwards, and both count that work."""),
    ("code", '''\
from torch.utils.flop_counter import FlopCounterMode

from harness import ModelConfig, flops
from version1_baseline import tiny_llama_v1 as v1

cfg = ModelConfig(**r1["config"])
B, T = r1["run"]["batch_size"], r1["run"]["seq_len"]
model = v1.build_model(cfg)
ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
with FlopCounterMode(display=False) as counter:
    logits = model(ids[:, :-1])
    torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab_size), ids[:, 1:].reshape(-1)).backward()
formula = flops.step_flops(cfg, B, T)
print(f"formula: {formula:,} FLOPs per step\\ncounted: {counter.get_total_flops():,} "
      f"(ratio {counter.get_total_flops() / formula:.3f})")
print(f"matmul parameters N = {flops.matmul_params(cfg):,}; total parameters {flops.total_params(cfg):,}")'''),
    ("md", """\
### A second counter: DeepSpeed's FLOPS profiler, on every version

`--profile deepspeed` counts one forward pass (a third of the formula's step) in another way.
While it profiles, DeepSpeed replaces Python functions - `F.linear`, `F.silu`, `F.softmax`,
`F.scaled_dot_product_attention`, `torch.matmul`, ... - with wrappers that compute each call's
FLOPs from its arguments, and hooks every module so that each call is added to the module whose
forward is running. It counts a multiply-add as 2 FLOPs, so `2 x MACs` is its count of the matrix
products alone; the rest is elementwise work."""),
    ("code", '''\
import importlib.util
import json

if importlib.util.find_spec("deepspeed") is None:
    print("DeepSpeed is not installed here: `bash setup/install.sh` installs it (the 'profile' extra)")
else:
    rows = []
    for version in VERSIONS:  # one counted step is enough: 2 steps, the first one counted
        r = train(version, f"nb1_{version}_deepspeed", "--num-steps", "2", "--warmup-steps", "1",
                  "--profile", "deepspeed", "--profile-dir", str(OUT / "deepspeed" / version))
        p = r["profile"]
        macs = json.loads(Path(p["files"]["flops"]).read_text())["macs"]
        rows.append({"version": version, "counted": p["counted_flops"], "2 x MACs": 2 * macs,
                     "analytic (forward)": p["analytic_flops"], "ratio": round(p["ratio"], 3)})
    print(pd.DataFrame(rows).set_index("version").to_string())'''),
    ("md", """\
V1, V2 and V4 make every matrix product through a wrapped function, so their `2 x MACs` is the
formula exactly, and the ratio sits just above 1 (the elementwise work). V3 comes out low (0.935
on the tiny preset): its flash attention is a Triton kernel launched from a `torch.autograd.Function`. The
attention module's hooks fire, but the kernel calls none of the wrapped functions, so attention's
QK^T and PV products - exactly the formula's attention term, 4·L·d·T per token in forward - count
0. Module hooks see *where* the work happens; only the wrapped functions say *how much*, and a
custom kernel hides it. FlopCounterMode misses the same kernel: it sees only operators that go
through PyTorch's dispatcher. docs/PROFILING.md has the measured numbers."""),
    ("md", """\
## 4. The operator table

`--profile pytorch` records 3 steps right after warm-up and writes the operator table, the kernel
table (operators grouped into categories) and a trace for https://ui.perfetto.dev. On a CPU the
operators' CPU time stands in for kernel time; on a GPU use the device columns."""),
    ("code", '''\
profile_dir = OUT / "profiles_v1"
train("v1", "nb1_v1_profiled", "--profile", "pytorch", "--profile-dir", str(profile_dir))
ops = pd.read_csv(profile_dir / "pytorch" / "operators.csv")
time_col = "self_device_us" if GPU else "self_cpu_us"
ops.sort_values(time_col, ascending=False)[["name", "calls", time_col]].head(10)'''),
    ("code", '''\
kernels = pd.read_csv(profile_dir / "pytorch" / "kernel_table.csv")
kernels.groupby("category")["share"].sum().sort_values(ascending=False).mul(100).round(1)'''),
    ("md", """\
## 5. Check the table against the code

Each linear layer is one `aten::mm` in forward and two in backward (the gradients of its input
and of its weight); per block V1 has 7 linear layers, plus the output head."""),
    ("code", '''\
profiled_steps = 3
linears_per_step = 7 * cfg.num_layers + 1
mm_calls = int(ops.loc[ops["name"] == "aten::mm", "calls"].sum())
print(f"aten::mm: {mm_calls} calls = {profiled_steps} steps x {linears_per_step} linears x 3 "
      f"(1 forward + 2 backward) = {profiled_steps * linears_per_step * 3}")'''),
    ("md", """\
## Questions

1. Which operators take the most time, and which category? Is that where the FLOPs are?
2. Why are there so many `aten::copy_` and `aten::_to_copy` calls?
3. Run the same cells with `--precision bf16` (add it to the `train` calls). What changes in
   the table, and in the FLOP count?
4. Which FLOPs does DeepSpeed miss in V3, and why does it count them in V4, which also uses
   a fused attention kernel? (Question 6 of the answers.)

Answers: `exercises/version1/01_operator_table.md`."""),
]

# ---------------------------------------------------------------- 02 fusion + compile
NB2 = [
    ("md", """\
# 2 - Fusion and torch.compile

Version 2 computes exactly what V1 computes with fewer, larger kernels: one QKV GEMM, one
gate+up GEMM, a one-kernel RMSNorm and SiLU*mul, and optionally `torch.compile` for everything
else. In this notebook: check that V2 is the same model, count what it launches, measure each
fusion alone, and compile it. Exercises: `exercises/version2/`."""),
    ("code", PARAMETERS),
    ("code", SETUP),
    ("md", """\
## 1. Same model: same logits from the same weights

V2 stacks V1's q/k/v (and gate/up) weights when it loads a V1 state dict, so the harness starts
every version from V1's weights."""),
    ("code", '''\
from harness import PRESETS
from version1_baseline import tiny_llama_v1 as v1
from version2_fused import tiny_llama_v2 as v2

cfg = PRESETS["tiny"].model  # small enough for any machine
torch.manual_seed(0)
m1 = v1.build_model(cfg)
m2 = v2.build_model(cfg)
m2.load_state_dict(m1.state_dict())
ids = torch.randint(0, cfg.vocab_size, (4, 32))
print("max |logits V1 - V2| =", (m1(ids) - m2(ids)).abs().max().item())'''),
    ("md", """\
## 2. Count what runs

`count_ops` runs one forward + backward under the PyTorch profiler and counts the operators that
do work (views and metadata-only operators are left out). GEMMs are counted separately."""),
    ("code", '''\
from torch.profiler import ProfilerActivity, profile

from profiling.sessions import native_stderr_filtered  # drops the profiler's start/stop lines

NO_WORK = ("view", "reshape", "transpose", "t", "as_strided", "slice", "expand", "split",
           "split_with_sizes", "unsqueeze", "permute", "_unsafe_view", "select", "alias", "detach",
           "chunk", "empty", "empty_strided", "new_empty_strided", "to", "result_type",
           "contiguous", "matmul", "linear")


def count_ops(model):
    def step():
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab_size), ids.view(-1)).backward()
    step()  # warm-up (lazy initialisations)
    with native_stderr_filtered(), profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    calls = {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}
    work = {k: n for k, n in calls.items() if k.removeprefix("aten::") not in NO_WORK}
    return {"operators": sum(work.values()), "aten::mm": calls.get("aten::mm", 0),
            "aten::bmm": calls.get("aten::bmm", 0)}


variants = {"V1": v1.build_model(cfg), "V2": v2.build_model(cfg)}
for fusion in ("fused_qkv", "fused_gate_up", "fused_rmsnorm", "fused_swiglu"):
    variants[f"V2 without {fusion}"] = v2.build_model(cfg, **{fusion: False})
pd.DataFrame({name: count_ops(m) for name, m in variants.items()}).T'''),
    ("md", """\
## 3. Each fusion alone, timed

The same ablation as `--no-fused-*` on the command line. On a CPU the differences are small and
noisy (and `fused_swiglu` only exists on a GPU); on a GPU at the medium preset they are the
point of the exercise."""),
    ("code", '''\
runs, labels = [train("v1", "nb2_v1"), train("v2", "nb2_v2")], ["v1", "v2"]
for flag in ("--no-fused-qkv", "--no-fused-gate-up", "--no-fused-rmsnorm", "--no-fused-swiglu"):
    runs.append(train("v2", f"nb2_v2{flag.replace('--no-fused', '_no')}", flag))
    labels.append(f"v2 {flag}")
# Each row is labelled with the run's switch (the results' "version" is v2 for all of them).
print(format_table([{**r, "version": label} for r, label in zip(runs, labels)]))'''),
    ("md", """\
## 4. torch.compile

`--compile` hands the model to `torch.compile`: Inductor fuses the remaining elementwise chains
into generated kernels (C++ on a CPU, Triton on a GPU) and keeps the GEMMs on the vendor BLAS.
The first steps compile (seconds); the timed steps do not include that. To see the generated
kernels: `TORCH_LOGS=output_code python version2_fused/tiny_llama_v2.py --compile ...`."""),
    ("code", '''\
compiled = train("v2", "nb2_v2_compiled", "--compile")
print(format_table([runs[1], compiled]))
print("same losses:", [round(x, 4) for x in runs[1]["losses"][:3]], [round(x, 4) for x in compiled["losses"][:3]])'''),
    ("md", """\
## Questions

1. How many GEMMs does each fusion save per step? Check against the number of linear layers.
2. Which fusion helps most on your device, and is it the one that saves the most operators?
3. What does `--compile` still leave to the vendor BLAS, and why?

Answers: `exercises/version2/01_fusion_ablations.md`, `exercises/version2/02_torch_compile.md`."""),
]

# ---------------------------------------------------------------- 03 Triton kernels
NB3 = [
    ("md", """\
# 3 - Triton kernels: read, test, benchmark

Version 3 replaces RMSNorm, RoPE and attention by hand-written Triton kernels, each with a forward and a
backward (`version3_triton/kernels/`, one file per kernel). On a CPU they run in Triton's interpreter: slow,
but the same program, so everything except timing can be checked here.
Exercises: `exercises/version3/`."""),
    ("code", PARAMETERS),
    ("code", SETUP),
    ("code", '''\
import inspect
import math

import torch.nn.functional as F

from version1_baseline import tiny_llama_v1 as v1
from version3_triton import kernels as tk
from version3_triton.kernels import rmsnorm

print("Triton backend:", tk.triton_backend())'''),
    ("md", """\
## 1. Read a kernel

The RMSNorm forward: each program owns `BLOCK_ROWS` whole rows, reads them once, keeps the
statistic in fp32 registers and writes the output once. (The backward recomputes `1/rms` from the
rows it loads anyway: no buffer to allocate per call.)"""),
    ("code", '''\
print(inspect.getsource(rmsnorm._rmsnorm_fwd_kernel.fn))'''),
    ("md", """\
## 2. Test it against PyTorch - forward and backward

The rule of this workshop: a kernel is correct when its output *and its gradients* match the
reference. Shapes are deliberately ragged (not multiples of the block sizes)."""),
    ("code", '''\
torch.manual_seed(0)
x = torch.randn(3, 37, 64, requires_grad=True)
norm = v1.RMSNorm(64, 1e-5)
ref = norm(x)
grad = torch.randn_like(ref)
ref_dx, ref_dw = torch.autograd.grad(ref, (x, norm.weight), grad)
out = tk.rms_norm(x, norm.weight, 1e-5)
dx, dw = torch.autograd.grad(out, (x, norm.weight), grad)
print(f"rms_norm  forward {(out - ref).abs().max():.2e}  d_x {(dx - ref_dx).abs().max():.2e}  "
      f"d_weight {(dw - ref_dw).abs().max():.2e}")'''),
    ("code", '''\
B, H, KV, T, D = 1, 4, 2, 40, 16   # grouped-query attention, T not a multiple of the tile
q = torch.randn(B, H, T, D, requires_grad=True)
k, v = (torch.randn(B, KV, T, D, requires_grad=True) for _ in range(2))
o = tk.flash_attention(q, k, v)
g = torch.randn_like(o)
grads = torch.autograd.grad(o, (q, k, v), g)
ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
ref_grads = torch.autograd.grad(ref, (q, k, v), g.double())
print(f"flash_attention forward {(o.double() - ref).abs().max():.2e}", *(
    f"d{n} {(a.double() - b).abs().max():.2e}" for n, a, b in zip("qkv", grads, ref_grads)))
print(tk.chosen_configs())'''),
    ("md", """\
## 3. The online softmax, in PyTorch

The heart of the attention kernel (`_attn_fwd_inner`), without Triton: keys arrive block by
block; a running max `m`, a running sum `l` and a running output `acc` are corrected by
`alpha = exp(m_old - m_new)` whenever the max grows. No row of scores is ever complete."""),
    ("code", '''\
def online_softmax_attention(q, k, v, block=8):
    """One head, no mask: softmax(q k^T / sqrt(d)) v, one key block at a time."""
    scale = 1 / math.sqrt(q.shape[-1])
    m = torch.full((q.shape[0],), -math.inf)
    l = torch.zeros(q.shape[0])
    acc = torch.zeros_like(q)
    for k_blk, v_blk in zip(k.split(block), v.split(block)):
        s = (q @ k_blk.T) * scale
        m_new = torch.maximum(m, s.max(dim=1).values)
        p = torch.exp(s - m_new[:, None])
        alpha = torch.exp(m - m_new)          # rescale what was summed under the old max
        l = l * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + p @ v_blk
        m = m_new
    return acc / l[:, None]


qh, kh, vh = torch.randn(20, 16), torch.randn(37, 16), torch.randn(37, 16)
exact = torch.softmax(qh @ kh.T / 4, dim=1) @ vh
print("max difference:", (online_softmax_attention(qh, kh, vh) - exact).abs().max().item())'''),
    ("md", """\
## 4. Change the block sizes the model runs with

`FORCED_CONFIGS` (or the environment variable `V3_ATTN_FWD_CONFIG`) pins a kernel's launch
configuration instead of autotuning; `chosen_configs()` says what ran. The result must not change -
only the speed."""),
    ("code", '''\
tk.FORCED_CONFIGS["attn_fwd"] = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4)
try:
    o_forced = tk.flash_attention(q, k, v)
    print("forced:", tk.chosen_configs()["attn_fwd"])
    print("same output:", torch.allclose(o_forced, o, atol=1e-5))
finally:
    del tk.FORCED_CONFIGS["attn_fwd"]'''),
    ("md", """\
## 5. Benchmark (GPU)

`triton.testing.do_bench` times a function on the GPU (warm-up, many repetitions, median). For a
memory-bound kernel report bandwidth - bytes moved per second - not FLOP/s."""),
    ("code", '''\
if not GPU:
    print("timing needs a GPU: the interpreter runs each kernel as numpy code, one program at a time")
else:
    from triton.testing import do_bench
    rows, hidden = 16 * 512, 1024
    xb = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(hidden, device="cuda")
    for name, fn in [("V1 RMSNorm (6 kernels)", lambda: v1.RMSNorm(hidden, 1e-5).cuda()(xb)),
                     ("F.rms_norm", lambda: F.rms_norm(xb.float(), (hidden,), w, 1e-5)),
                     ("Triton rms_norm", lambda: tk.rms_norm(xb, w, 1e-5, torch.bfloat16))]:
        ms = do_bench(fn)
        print(f"{name:<24} {ms * 1e3:8.1f} us  {2 * xb.numel() * 2 / ms / 1e6:8.1f} GB/s (bf16 in+out)")
    qb, kb, vb = (torch.randn(16, 16, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, fn in [("Triton flash attention", lambda: tk.flash_attention(qb, kb, vb)),
                     ("SDPA", lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True))]:
        ms = do_bench(fn)
        tflops = 4 * 16 * 16 * 512 * 512 * 64 / 2 / ms / 1e9
        print(f"{name:<24} {ms * 1e3:8.1f} us  {tflops:6.1f} TFLOP/s (causal convention)")'''),
    ("md", """\
## 6. The whole model

V3 in the harness: the gradient guard checks that every parameter got a gradient through the
kernels' backward passes."""),
    ("code", '''\
r3 = train("v3", "nb3_v3", *([] if GPU else ["--num-steps", "3", "--warmup-steps", "1"]))
print(format_table([r3]))
print("gradient guard:", r3["gradient_guard"])'''),
    ("md", """\
## Questions

1. Why does the backward recompute the scores instead of saving them?
2. Which block sizes fit in 64 KiB of LDS (AMD) for head dim 64 in bf16?
3. How far is the Triton attention from SDPA on your GPU, and the Triton RMSNorm from the HBM
   bandwidth?

Answers: `exercises/version3/`."""),
]

# ---------------------------------------------------------------- 04 SDPA + roofline + comparison
NB4 = [
    ("md", """\
# 4 - SDPA, the roofline, and the final comparison

Version 4 uses PyTorch's `scaled_dot_product_attention`, which dispatches to the vendor's fused
attention kernels. In this notebook: see which kernel runs here, how attention memory scales with
the sequence length, where every operation sits on the roofline, and all four versions side by
side. Exercises: `exercises/version4/`."""),
    ("code", PARAMETERS),
    ("code", SETUP),
    ("md", """\
## 1. Which attention kernel runs here?

V4 runs SDPA once, forward and backward, on the training shapes and records which ATen kernel
PyTorch dispatched to. Each backend can be forced; unavailable ones say why."""),
    ("code", '''\
from harness import PRESETS
from harness.errors import UsageError
from version4_sdpa import tiny_llama_v4 as v4

cfg = PRESETS[PRESET].model
device = torch.device("cuda" if GPU else "cpu")
precision = "bf16" if GPU else "fp32"  # as a training run here defaults to
batch, seq = PRESETS[PRESET].batch_size, PRESETS[PRESET].seq_len
for backend in ("auto", *v4.BACKENDS):
    try:
        kernel, gqa = v4.choose_sdpa(v4.build_model, cfg, batch, seq, device, precision, backend)
        print(f"{backend:>9}: runs {kernel} (gqa: {gqa})")
    except UsageError as e:
        print(f"{backend:>9}: cannot run - {str(e)[:110]}...")'''),
    ("md", """\
## 2. Attention memory: explicit vs flash

The memory model (`python -m analysis_tools memory`) predicts the peak of a training step from
the shapes. V1 keeps the `(B, heads, T, T)` attention probabilities of every layer for backward;
V4's flash kernels keep O(T) per layer."""),
    ("code", '''\
from analysis_tools.__main__ import main as analysis

for version in ("v1", "v4"):
    for seq_len in (256, 512, 1024):
        analysis(["memory", "--preset", "medium", "--version", version, "--precision", "bf16",
                  "--batch-size", "8", "--seq-len", str(seq_len)])'''),
    ("md", """\
## 3. The roofline

Every operation of one training step, with its FLOPs and the minimum bytes it must move:
arithmetic intensity = FLOPs / bytes. Left of the ridge point (peak / bandwidth) an operation is
memory-bound, right of it compute-bound. Without a measured ceilings file the plot shows the
datasheet roof of a known GPU (none for a CPU); `python -m benchmarks.ceilings` measures one."""),
    ("code", '''\
from IPython.display import Image

analysis(["roofline", "--preset", "medium", "--precision", "bf16", "--out-dir", str(OUT / "roofline")])
Image(filename=str(OUT / "roofline" / "roofline.png"))'''),
    ("md", """\
## 4. All four versions, same model, same data

Every version starts from V1's weights with the same seed, so the loss of each step must agree
(the second table shows the first three steps of every version); the speed and memory are what
the optimizations changed. On a CPU V3's kernels run in the interpreter, so V3 runs 3 steps only:
its "final loss" in the first table is step 3's and differs from the others' for that reason
alone, and the timings say little. On a GPU this is the workshop's result table."""),
    ("code", '''\
final = [train("v1", "nb4_v1"), train("v2", "nb4_v2")]
final.append(train("v3", "nb4_v3", *([] if GPU else ["--num-steps", "3", "--warmup-steps", "1"])))
final.append(train("v4", "nb4_v4"))
print(format_table(final))'''),
    ("code", '''\
pd.DataFrame({r["version"]: pd.Series(r["losses"]) for r in final}).round(4).head(3)'''),
    ("md", """\
## Questions

1. Which SDPA kernel runs on your GPU, and how does forcing `math` change time and memory?
2. Which operations lie left of the ridge point? Which version removed the worst of them?
3. Is the speed-up of each version where the roofline said it would be?

Answers: `exercises/version4/`."""),
]

NOTEBOOKS = {
    "01_baseline_and_profiling.ipynb": NB1,
    "02_fusion_and_compile.ipynb": NB2,
    "03_triton_kernels.ipynb": NB3,
    "04_sdpa_roofline_comparison.ipynb": NB4,
}


def build(name: str, cells) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    stem = name.split("_")[0]
    for i, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell.id = f"nb{stem}-{i:02d}"  # stable ids: regenerating gives the same file
        if kind == "code" and source is PARAMETERS:
            cell.metadata["tags"] = ["parameters"]  # papermill can override this cell
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name, NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a notebook is out of date")
    args = p.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path, text = NOTEBOOK_DIR / name, render(name)
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    for name in stale:
        print(f"{name} is out of date: run python tools/make_notebooks.py",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
