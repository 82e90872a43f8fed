"""Compile every V3 kernel for AMD and NVIDIA GPUs - no GPU needed - and read the ISA.

    python -m benchmarks.codegen                          # the full table (minutes)
    python -m benchmarks.codegen --targets gfx942 --head-dims 64 --dtypes bf16
    python -m benchmarks.codegen --json results/codegen.json

For each target (MI50 gfx906, MI100 gfx908, MI200 gfx90a, MI300X gfx942, MI350
gfx950; NVIDIA sm_80 and sm_90 as the cross-check), each kernel (RMSNorm forward
and backward, plain and with the residual add as add_rmsnorm_*, RoPE, attention
forward, backward dK/dV, backward dQ, SwiGLU forward and backward, the cross-entropy of
--fused-linear-ce), dtype and
head size, it compiles every launch configuration the chooser can pick on that
target (`configs.candidates`: the rule's config, or the candidates that fit in
shared memory) with `triton.compile(ASTSource(...), target=GPUTarget(...))`, and
reports what the compiler produced - not estimates:

  LDS / shared  bytes of shared memory per program (kernel.metadata.shared), and
                the target's limit per workgroup
  VGPRs / regs  vector registers per lane (AMD: .vgpr_count of the ISA's metadata,
                AGPRs included on MI200+; NVIDIA: ptxas' "Used N registers")
  spills        registers spilled to scratch memory (AMD: .vgpr_spill_count +
                .sgpr_spill_count, in registers; NVIDIA: ptxas' spill stores, in
                bytes): every spill is a round trip to memory inside the hot loop
  matrix        matrix instructions in the ISA: v_mfma (AMD matrix cores), v_wmma
                (Radeon), mma / wgmma (NVIDIA tensor cores); none = plain FMA
  waves/SIMD    wavefronts one SIMD can hold with this many registers (AMD), warps per
                SM (NVIDIA): the occupancy that hides memory latency

The RMSNorm and RoPE rows use the medium preset's sizes (hidden 1024, 16 + 16 q/k
heads); attention uses GROUP_SIZE 1 and is compiled both ways, plain and with RoPE
on load (attention_rope.py's kernels; the rows marked "+rope"), and on sm_90 at head sizes
64 and 128 also as the Hopper path's Gluon kernels (attention_hopper.py; "+hopper"). Compiled
kernels are cached by Triton (~/.triton/cache), so a second run takes seconds.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for real (before triton is imported)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what the kernels run with, warning-free
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AMD_TARGETS = ("gfx906", "gfx908", "gfx90a", "gfx942", "gfx950")
NVIDIA_TARGETS = ("sm_80", "sm_90")
TARGETS = AMD_TARGETS + NVIDIA_TARGETS
KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd", "add_rmsnorm_bwd", "rope", "attn_fwd",
           "attn_bwd_dkdv", "attn_bwd_dq", "swiglu_fwd", "swiglu_bwd", "cross_entropy")
# add_rmsnorm_*: the RMSNorm kernels with the residual add switched on (constexprs), as
# V3's --fused-residual-norm runs them; same kernels, same launch rule.
NORM_SPEC = {"add_rmsnorm_fwd": "rmsnorm_fwd", "add_rmsnorm_bwd": "rmsnorm_bwd"}
HIDDEN, ROPE_HEADS, FFN = 1024, 32, 2816  # the medium preset: RMSNorm rows, q + k heads per
# position, the MLP's width (SwiGLU's columns)
VOCAB_BLOCK = 4096  # cross-entropy's column block at a 32k vocabulary (the large preset)
MATRIX = re.compile(r"\b(v_mfma\w*|v_wmma\w*|wgmma\.\w+|mma\.sync\.\w+)")
# AMD register file per SIMD lane and the most waves one SIMD holds: MI200/MI300/MI350
# have 512 (VGPRs and AGPRs together) and 8 waves; MI50/MI100 256 VGPRs and 10 waves.
AMD_VGPRS = {"gfx906": (256, 10), "gfx908": (256, 10)}


def target_of(name: str):
    from version3_triton.kernels import common
    if name.startswith("sm_"):
        return common.nvidia_target(int(name[3:]))
    return common.amd_target(name)


def gpu_target(name: str):
    from triton.backends.compiler import GPUTarget
    if name.startswith("sm_"):
        return GPUTarget("cuda", int(name[3:]), 32)
    return GPUTarget("hip", name, 64)


def kernel_fn(kernel: str, rope: bool = False):
    """The @triton.jit function (the package exports functions named like the modules);
    rope: attention's variant that rotates q and k on load."""
    kernel = NORM_SPEC.get(kernel, kernel)
    if rope:
        return getattr(importlib.import_module("version3_triton.kernels.attention_rope"),
                       f"_{kernel}_rope_kernel")
    module, name = {"rmsnorm_fwd": ("rmsnorm", "_rmsnorm_fwd_kernel"),
                    "rmsnorm_bwd": ("rmsnorm", "_rmsnorm_bwd_kernel"),
                    "rope": ("rope", "_rope_kernel"),
                    "attn_fwd": ("flash_attention", "_attn_fwd_kernel"),
                    "attn_bwd_dkdv": ("flash_attention_backward", "_attn_bwd_dkdv_kernel"),
                    "attn_bwd_dq": ("flash_attention_backward", "_attn_bwd_dq_kernel"),
                    "swiglu_fwd": ("swiglu", "_swiglu_fwd_kernel"),
                    "swiglu_bwd": ("swiglu", "_swiglu_bwd_kernel"),
                    "cross_entropy": ("linear_cross_entropy", "_cross_entropy_kernel")}[kernel]
    return getattr(importlib.import_module(f"version3_triton.kernels.{module}"), name)


FP32_POINTERS = {"W", "DW_PARTIAL", "DW", "LSE", "DELTA", "COS", "SIN", "LOSSES"}
INT64_POINTERS = {"TARGETS"}  # token ids
INT32_POINTERS = {"TICKETS"}  # counters
# With the residual add, the norm's input x, its sum h and their gradients are the fp32
# residual stream; delta (a GEMM's output), y and their gradients are in `dtype`.
RESIDUAL_FP32_POINTERS = {"X", "H", "DH", "DX", "W", "DW_PARTIAL", "DW"}


def fp32_pointers(kernel: str) -> set:
    return RESIDUAL_FP32_POINTERS if kernel in NORM_SPEC else FP32_POINTERS


def signature(fn, dtype: str, constexprs: dict, fp32: set = FP32_POINTERS) -> dict:
    """Triton's signature for `fn`: pointers by name (statistics and tables - the names in
    `fp32` - fp32, data in `dtype`), Python floats fp32, integers i32, the rest constexpr."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.isupper() and name != "N_CTX":  # tensors are the upper-case names
            sig[name] = ("*i64" if name in INT64_POINTERS else "*i32" if name in INT32_POINTERS
                         else "*fp32" if name in fp32 else f"*{dtype}")
        elif name in ("eps", "qk_scale", "sm_scale", "grad_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def jobs(targets, kernels, dtypes, head_dims) -> list[dict]:
    """Every (target, kernel, dtype, head size, config) the chooser can produce."""
    from version3_triton.kernels import configs
    out = []
    for name in targets:
        target = target_of(name)
        for kernel in kernels:
            spec = configs.SPECS[NORM_SPEC.get(kernel, kernel)]
            widths = ([HIDDEN] if "rmsnorm" in kernel else [FFN] if "swiglu" in kernel
                      else [VOCAB_BLOCK] if kernel == "cross_entropy" else head_dims)
            for dtype in dtypes:
                for width in widths:
                    # attention: plain, and rotating q and k on load (its own candidates)
                    for variant in (None, "rope") if kernel.startswith("attn") else (None,):
                        for config in configs.candidates(spec, target, width,
                                                         2 if dtype != "fp32" else 4, variant):
                            job = dict(target=name, kernel=kernel, dtype=dtype, width=width,
                                       config=config)
                            if kernel.startswith("attn"):
                                job["rope"] = variant == "rope"
                            out.append(job)
                    if kernel.startswith("attn") and hopper_path(name, dtype, width):
                        out.append(dict(target=name, kernel=kernel, dtype=dtype, width=width,
                                        config=hopper_config(kernel), rope=False, hopper=True))
    return out


# ---- the Hopper path: attention_hopper.py's Gluon kernels (sm_90, head sizes 64 and 128) ---
HOPPER_KERNELS = {"attn_fwd": "_attn_fwd", "attn_bwd_dq": "_attn_bwd_dq",
                  "attn_bwd_dkdv": "_attn_bwd_dkdv"}


def hopper_path(target: str, dtype: str, width: int) -> bool:
    from version3_triton.kernels import attention_hopper as hopper
    return (hopper.AVAILABLE and target == "sm_90" and width in hopper.HEAD_DIMS
            and dtype in ("bf16", "fp16"))


def hopper_config(kernel: str) -> dict:
    from version3_triton.kernels import attention_hopper as hopper
    return dict(BLOCK_M=hopper.BLOCK, BLOCK_N=hopper.BLOCK, num_warps=hopper.WARPS,
                num_stages=hopper.FWD_STAGES if kernel == "attn_fwd" else hopper.BWD_STAGES)


def hopper_source(job: dict):
    """The Gluon kernel with its signature: TMA descriptors of (BLOCK, D) tiles, the model's
    layout (a row per token) for inputs and outputs, one query head per k/v head."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from version3_triton.kernels import attention_hopper as hopper
    fn = getattr(hopper, HOPPER_KERNELS[job["kernel"]])
    config, width, dtype = job["config"], job["width"], job["dtype"]
    layout = gl.NVMMASharedLayout.get_default_for([config["BLOCK_M"], width],
                                                  gl.bfloat16 if dtype == "bf16" else gl.float16)
    constexprs = dict(Q_BY_TOKEN=True, KV_BY_TOKEN=True, O_BY_TOKEN=True, DQ_BY_TOKEN=True,
                      DKV_BY_TOKEN=True, BLOCK_M=config["BLOCK_M"],
                      BLOCK_N=config["BLOCK_N"], HEAD_D=width, STAGES=config["num_stages"],
                      num_warps=config["num_warps"], GROUP=1)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    sig = signature(fn, dtype, constexprs)  # then the TMA descriptors in place of ints
    sig.update({name: f"tensordesc<{dtype}[{config['BLOCK_M']}, {width}],{layout!r}>"
                for name in fn.arg_names if name.endswith("_desc")})
    return GluonASTSource(fn, sig, constexprs=constexprs)


def constexprs_for(job: dict) -> dict:
    from version3_triton.kernels import common
    kernel, width, config = job["kernel"], job["width"], job["config"]
    blocks = {k: v for k, v in config.items() if k.isupper()}
    if "rmsnorm" in kernel:  # a switched-off input or output is a None pointer
        from version3_triton.kernels.row_sums import summing_rows
        add = kernel in NORM_SPEC
        blocks["BLOCK_COLS"] = common.next_power_of_2(width)
        if kernel.endswith("fwd"):
            return dict(blocks, ADD_DELTA=add, **({} if add else dict(DELTA=None, H=None)))
        store = add and job["dtype"] != "fp32"  # delta's gradient in its own (bf16) dtype
        return dict(blocks, ADD_GRAD=add, STORE_DDELTA=store, SUM_ROWS=summing_rows(width),
                    **({} if add else dict(DH=None)), **({} if store else dict(DDELTA=None)))
    if kernel.startswith("swiglu"):
        from version3_triton.kernels.swiglu import _block
        return dict(BLOCK=_block(width))
    if kernel == "cross_entropy":
        return dict(BLOCK_V=width)
    if kernel == "rope":
        return dict(INVERSE=False, HALF=width // 2, BLOCK_H=common.next_power_of_2(ROPE_HEADS),
                    BLOCK_HALF=common.next_power_of_2(width // 2))
    return dict(blocks, GROUP_SIZE=1, HEAD_DIM=width, DOT_PRECISION="ieee",
                BLOCK_D=max(16, common.next_power_of_2(width)))


def amd_numbers(asm: str, arch: str) -> dict:
    def field(key):
        found = re.search(rf"\.{key}:\s+(\d+)", asm)
        return int(found.group(1)) if found else 0
    vgprs, agprs = field("vgpr_count"), field("agpr_count")
    file_size, max_waves = AMD_VGPRS.get(arch, (512, 8))
    # gfx90a+: AGPRs sit after the VGPRs in one file; the count above includes them
    used = max(vgprs, 1) if arch not in AMD_VGPRS else max(vgprs, agprs, 1)
    granule = 8
    waves = min(max_waves, file_size // (-(-used // granule) * granule))
    return dict(registers=vgprs, agprs=agprs, sgprs=field("sgpr_count"),
                spills=field("vgpr_spill_count") + field("sgpr_spill_count"), waves_per_simd=waves)


def ptxas(arch: str = "sm_80") -> str | None:
    """The ptxas Triton itself compiles with (the wheel ships one), else one on PATH."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(int(arch[3:])).path
    except Exception:
        return shutil.which("ptxas")


def nvidia_numbers(ptx: str, arch: str) -> dict:
    tool = ptxas(arch)
    if tool is None:
        raise RuntimeError("no ptxas (the triton wheel ships one in triton/backends/nvidia/bin)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        gpu = f"{arch}a" if arch == "sm_90" else arch
        proc = subprocess.run([tool, "-v", f"--gpu-name={gpu}", str(src), "-o", str(src) + ".o"],
                              capture_output=True, text=True)
    info = proc.stderr + proc.stdout
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    if regs is None:
        raise RuntimeError(f"ptxas said: {info.strip()[-300:]}")
    r = int(regs.group(1))
    return dict(registers=r, spills=int(spill.group(1)) if spill else 0,
                waves_per_simd=min(64, 65536 // (max(r, 1) * 32)))  # warps per SM


def compile_one(job: dict) -> dict:
    """Compile one job; returns the job with the compiler's numbers (or its error)."""
    import triton
    from triton.compiler import ASTSource
    fn = kernel_fn(job["kernel"], job.get("rope", False))
    constexprs = constexprs_for(job)
    options = {k: v for k, v in job["config"].items() if not k.isupper()}
    if job["target"].startswith("gfx"):
        options.setdefault("waves_per_eu", 0)
    row = dict(job, limit=target_of(job["target"]).shared_bytes)
    try:
        src = (hopper_source(job) if job.get("hopper") else
               ASTSource(fn=fn, signature=signature(fn, job["dtype"], constexprs,
                                                    fp32_pointers(job["kernel"])),
                         constexprs=constexprs))
        compiled = triton.compile(src, target=gpu_target(job["target"]), options=options)
        asm = compiled.asm.get("amdgcn") or compiled.asm.get("ptx") or ""
        row["shared"] = compiled.metadata.shared
        row["matrix"] = sorted({m.split(".")[0] if m.startswith(("wgmma", "mma")) else m
                                for m in MATRIX.findall(asm)})
        row.update(amd_numbers(asm, job["target"]) if job["target"].startswith("gfx")
                   else nvidia_numbers(asm, job["target"]))
    except Exception as e:  # a target this Triton cannot compile for: say so in the row
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    return row


def describe(config: dict) -> str:
    short = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_ROWS": "rows", "num_warps": "w",
             "num_stages": "s", "waves_per_eu": "wpe", "matrix_instr_nonkdim": "mfma"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in config.items())


def print_table(rows: list[dict]) -> None:
    print(f"{'target':7s} {'kernel':20s} {'dt':4s} {'D':>4s} {'config':34s} {'LDS/limit KiB':>13s} "
          f"{'regs':>5s} {'spill':>5s} {'waves':>5s}  matrix")
    for r in rows:
        kernel = r["kernel"] + ("+rope" if r.get("rope") else "+hopper" if r.get("hopper")
                                else "")
        head = (f"{r['target']:7s} {kernel:20s} {r['dtype']:4s} {r['width']:4d} "
                f"{describe(r['config']):34s}")
        if "error" in r:
            print(f"{head} error: {r['error']}")
            continue
        lds = f"{r['shared'] / 1024:5.1f}/{r['limit'] // 1024:<4d}"
        print(f"{head} {lds:>13s} {r['registers']:5d} {r['spills']:5d} {r['waves_per_simd']:5d}  "
              f"{','.join(r['matrix']) or '-'}")


def summary(rows: list[dict]) -> dict:
    """Per target: how many configs compiled, spilled, overflowed LDS; register range;
    whether every attention kernel used matrix instructions."""
    out = {}
    for name in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == name]
        ok = [r for r in mine if "error" not in r]
        attention = [r for r in ok if r["kernel"].startswith("attn")]
        out[name] = dict(
            compiled=len(ok), errors=len(mine) - len(ok),
            spilling=sum(r["spills"] > 0 for r in ok),
            max_spills=max((r["spills"] for r in ok), default=0),
            over_lds=sum(r["shared"] > r["limit"] for r in ok),
            max_shared=max((r["shared"] for r in ok), default=0),
            registers=[min((r["registers"] for r in ok), default=0),
                       max((r["registers"] for r in ok), default=0)],
            attention_matrix=bool(attention) and all(r["matrix"] for r in attention),
            min_attention_waves=min((r["waves_per_simd"] for r in attention), default=0))
    return out


def print_summary(summ: dict) -> None:
    print("\nper target: configs compiled, spilling (max spilled regs), over the LDS limit, "
          "registers, attention on matrix units, lowest attention waves/SIMD")
    for name, s in summ.items():
        err = f", {s['errors']} could not compile" if s["errors"] else ""
        print(f"  {name:7s} {s['compiled']:3d} compiled{err}; {s['spilling']} spill "
              f"(max {s['max_spills']}); {s['over_lds']} over LDS (max {s['max_shared'] // 1024} KiB); "
              f"regs {s['registers'][0]}-{s['registers'][1]}; matrix units: "
              f"{'yes' if s['attention_matrix'] else 'NO'}; waves {s['min_attention_waves']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated (default: all)")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    p.add_argument("--json", help="write every row and the summary here")
    args = p.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        print(f"error: unknown target(s) {sorted(unknown)}; known: {', '.join(TARGETS)}",
              file=sys.stderr)
        return 2
    if any(t.startswith("sm_") for t in targets) and ptxas() is None:
        print("note: no ptxas found (the triton wheel ships one): NVIDIA targets skipped")
        targets = [t for t in targets if not t.startswith("sm_")]
    work = jobs(targets, args.kernels.split(","), args.dtypes.split(","),
                [int(d) for d in args.head_dims.split(",")])
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(compile_one, work, chunksize=4))
    print_table(rows)
    summ = summary(rows)
    print_summary(summ)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        import triton
        path.write_text(json.dumps({"triton": triton.__version__, "rows": rows,
                                    "summary": summ}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
