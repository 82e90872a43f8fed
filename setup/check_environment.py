"""Is this machine ready for the workshop? Prints a checklist and says how to fix what is missing.

    python setup/check_environment.py              # the checklist
    python setup/check_environment.py --require triton --require rocprofv3
                                                   # also insist on optional items
    python setup/check_environment.py --json       # the same, machine-readable

Each line is one of
    [ ok ]  present and working
    [warn]  optional and missing (a GPU, a profiler, DeepSpeed, ...): some parts of
            the workshop will skip, the rest works
    [FAIL]  something the workshop needs (Python >= 3.9, torch >= 2.4) is missing
            or broken - the line says how to fix it
    [info]  facts worth knowing (environment variables, the device's limits)

Exit code: 0 when nothing failed, 1 when something needed is missing, 2 for bad flags.
The device facts come from harness.device, the same code the training runs use.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from harness.args import OneLineParser  # noqa: E402  (imports no torch: works without it)
from harness.errors import UsageError  # noqa: E402

MIN_PYTHON = (3, 9)
MIN_TORCH = "2.4"
INSTALL_DOC = "setup/INSTALL.md"

# Profilers per backend: the command that must be on PATH and what it is for.
PROFILERS = {
    "rocm": [("rocprofv3", "kernel traces and hardware counters"),
             ("rocprof-sys-run", "system timeline (CPU, GPU, runtime)"),
             ("rocprof-compute", "per-kernel roofline and bottleneck analysis")],
    "cuda": [("ncu", "per-kernel metrics and roofline (Nsight Compute)"),
             ("nsys", "system timeline (Nsight Systems)")],
}
VENDOR_NAMES = {"rocm": "AMD", "cuda": "NVIDIA"}
# Environment variables that change how ROCm/CUDA PyTorch behaves (see setup/TROUBLESHOOTING.md).
ENV_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
            "HSA_OVERRIDE_GFX_VERSION", "PYTORCH_ROCM_ARCH", "PYTORCH_HIP_ALLOC_CONF",
            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_TUNABLEOP_ENABLED", "TRITON_INTERPRET")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""
    missing: bool = False  # an optional item that is absent (--require turns it into a failure)


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.4.1+rocm6.0' -> (2, 4, 1); stops at the first non-numeric part ('2.5.0a0' -> (2, 5))."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = re.match(r"\d*", piece).group()
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def package_version(name: str) -> str | None:
    """Installed version without importing the package (DeepSpeed imports take seconds)."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


# ------------------------------------------------------------------ the checks
def project_venv() -> Path:
    return REPO / ".venv"


def in_project_env() -> bool:
    """Is this Python the project's .venv (activated, or called as .venv/bin/python)?"""
    try:
        return Path(sys.prefix).resolve() == project_venv().resolve()
    except OSError:
        return False


def check_project_env() -> Check:
    venv = project_venv()
    if in_project_env():
        return Check("environment", "ok", f"the project's environment ({venv})")
    if (venv / "bin" / "python").exists():
        return Check("environment", "warn",
                     f"you are not in the project's environment: this is {sys.executable}, "
                     f"the workshop is installed in {venv}",
                     "`source .venv/bin/activate` (then `python ...`), or run scripts with "
                     "`.venv/bin/python ...`")
    return Check("environment", "info", f"no {venv} yet: `make workshop` (or `bash setup/install.sh`) "
                                        f"creates it; this check uses {sys.executable}")


def check_python() -> Check:
    v = sys.version_info
    text = f"Python {platform.python_version()} ({sys.executable})"
    if (v.major, v.minor) < MIN_PYTHON:
        return Check("python", "fail", text, f"use Python >= {'.'.join(map(str, MIN_PYTHON))} "
                                             f"(3.10-3.12 are the safest with ROCm wheels)")
    return Check("python", "ok", text)


def check_torch(min_torch: str) -> Check:
    fix = (f"install torch >= {min_torch}: `bash setup/install.sh` (CPU), or from the PyTorch "
           f"index for your GPU, e.g. `pip install torch --index-url "
           f"https://download.pytorch.org/whl/rocm6.4` - see {INSTALL_DOC}")
    if not in_project_env() and (project_venv() / "bin" / "python").exists():
        fix = ("the workshop's torch is in .venv, and this is not .venv's Python: "
               "`source .venv/bin/activate` and run the check again")
    try:
        import torch
    except Exception as e:  # missing, or a broken wheel (wrong Python, missing libs)
        return Check("torch", "fail", f"torch cannot be imported ({type(e).__name__}: {e})", fix)
    build = ("ROCm/HIP " + torch.version.hip if getattr(torch.version, "hip", None)
             else "CUDA " + torch.version.cuda if torch.version.cuda else "CPU-only")
    text = f"torch {torch.__version__} ({build} build)"
    if version_tuple(torch.__version__) < version_tuple(min_torch):
        return Check("torch", "fail", text + f", older than {min_torch}", fix)
    return Check("torch", "ok", text)


def check_device() -> list[Check]:
    import torch

    from harness import device as dev

    backend = dev.backend()
    if backend == "cpu":
        hint = ("a ROCm/CUDA build is installed but sees no GPU: check `rocm-smi`/`nvidia-smi`, "
                "HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES and your user's video/render groups"
                if torch.version.hip or torch.version.cuda else
                f"this is a CPU-only torch; for a GPU install the ROCm or CUDA wheel ({INSTALL_DOC})")
        return [Check("gpu", "warn", "no GPU visible: every version runs on the CPU with "
                                     "--preset tiny (fine for tests and exercises)", hint,
                      missing=True)]

    device = torch.device("cuda", 0)
    d = dev.describe(device)
    count = torch.cuda.device_count()
    memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    checks = [Check("gpu", "ok", f"{d['name']} ({d['arch']}, {memory_gib:.0f} GiB), {count} visible, "
                                 f"backend {backend}")]
    checks.append(check_arch_in_build(d["arch"], torch.cuda.get_arch_list()))
    try:  # the cheapest proof that kernels really launch on this GPU
        x = torch.randn(64, 64, device=device)
        (x @ x).sum().item()
        checks.append(Check("gpu smoke test", "ok", "a 64x64 matmul ran on the GPU"))
    except Exception as e:
        checks.append(Check("gpu smoke test", "fail", f"a 64x64 matmul failed: {str(e)[:160]}",
                            "see setup/TROUBLESHOOTING.md (memory access faults / arch mismatch)"))
    if dev.supports_bf16(device):
        checks.append(Check("bf16", "ok", "bf16 supported: the default precision on this GPU"))
    else:
        checks.append(Check("bf16", "warn", f"no bf16 on {d['arch']}: runs default to fp16 "
                                            "with loss scaling", "use --precision fp16 or fp32"))
    amd = check_amd_target()
    if amd is not None:
        checks.append(amd)
    return checks


def check_amd_target() -> Check | None:
    """On ROCm: the GPU's gfx target and whether V3's Triton kernels are tuned for it."""
    import torch

    if not getattr(torch.version, "hip", None):
        return None
    try:
        arch = str(torch.cuda.get_device_properties(0).gcnArchName).split(":")[0]
    except Exception as e:
        return Check("v3 amd target", "info", f"gfx target unknown: {str(e)[:120]}")
    try:
        from version3_triton.kernels import attention_tables, common
        warning = attention_tables.attention_warning(common.amd_target(arch))
        tuned = attention_tables.TUNED_AMD
    except Exception as e:
        return Check("v3 amd target", "info", f"{arch}: V3's kernels could not be imported "
                                              f"({type(e).__name__}: {str(e)[:120]})")
    if warning is None and arch.startswith(tuned):
        return Check("v3 amd target", "ok", f"{arch}: V3's Triton kernels are tuned for this GPU")
    return Check("v3 amd target", "warn", warning or f"{arch}: V3's Triton kernels are not "
                 f"tuned for this GPU (tuned: {', '.join(tuned)})",
                 "python -m benchmarks.codegen --targets " + arch + " shows the compiled code")


def check_arch_in_build(arch: str | None, built_for: list[str]) -> Check:
    """A wheel only contains kernels for the architectures it was compiled for."""
    if not arch or not built_for:
        return Check("arch in build", "info", f"torch built for: {', '.join(built_for) or 'unknown'}")
    base = arch.split(":")[0]  # ROCm reports e.g. 'gfx90a:sramecc+:xnack-'
    if any(a.split(":")[0] == base for a in built_for):
        return Check("arch in build", "ok", f"this torch has kernels for {base}")
    return Check("arch in build", "warn",
                 f"this torch was built for {', '.join(built_for)}, not {base}: kernels may be "
                 f"missing or fault", "install a wheel built for your GPU (MI50/gfx906: torch "
                                      "2.4.1+rocm6.0, see setup/INSTALL.md)")


def check_sdpa() -> Check:
    """Which scaled_dot_product_attention backends really run here (V4 picks among them)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness import device as dev
    from harness.config import PRECISIONS
    from harness.precision import choose_precision

    device = torch.device("cuda" if dev.backend() != "cpu" else "cpu")
    dtype = PRECISIONS[choose_precision(None, device)].dtype  # what a run here defaults to
    q = torch.randn(1, 2, 16, 64, device=device, dtype=dtype)
    works = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            works.append(name.lower())
        except Exception:  # "No available kernel" - this backend cannot serve these inputs
            pass
    status = "ok" if works else "warn"
    return Check("sdpa backends", status, f"runs with {', '.join(works) or 'none'} "
                                          f"({device.type}, {str(dtype).replace('torch.', '')})")


def check_triton() -> Check:
    from harness import device as dev

    version = dev.triton_version()
    if version is None:
        return Check("triton", "warn", "not importable: V3 (Triton kernels) and its exercises skip",
                     "ROCm/CUDA wheels bring their own triton (pytorch-triton-rocm / triton); on a "
                     "CPU machine `pip install triton` runs kernels in the interpreter", missing=True)
    gpu = dev.backend() != "cpu"
    where = "compiles for the GPU" if gpu else "CPU: kernels run in the interpreter (TRITON_INTERPRET=1)"
    return Check("triton", "ok", f"triton {version}, {where}")


def check_optional_package(name: str, import_name: str, purpose: str, fix: str) -> Check:
    version = package_version(import_name)
    if version is None:
        return Check(name, "warn", f"not installed (used by {purpose})", fix, missing=True)
    return Check(name, "ok", f"{name} {version}")


def check_notebooks() -> Check:
    """JupyterLab for the instructor notebooks, installed into the project's .venv by make."""
    return check_optional_package("jupyterlab", "jupyterlab", "the instructor notebooks",
                                  "`make notebooks` (installs it into .venv/ and opens the notebooks)")


def check_profilers(backend: str) -> list[Check]:
    checks = []
    for vendor, tools in PROFILERS.items():
        relevant = vendor == backend
        for command, purpose in tools:
            path = shutil.which(command)
            if path:
                checks.append(Check(command, "ok", f"{path} ({purpose})"))
            elif relevant:
                checks.append(Check(command, "warn", f"not on PATH (used for {purpose})",
                                    "ROCm: `module load rocm` or add /opt/rocm/bin to PATH"
                                    if vendor == "rocm" else
                                    "install the CUDA toolkit / Nsight tools and add them to PATH",
                                    missing=True))
            else:
                checks.append(Check(command, "info", f"not on PATH (only for {VENDOR_NAMES[vendor]} GPUs)",
                                    missing=True))
    return checks


def override_arch(version: str) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION '9.0.6' -> 'gfx906', '9.0.10' -> 'gfx90a', '11.5.1' -> 'gfx1151'."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    major, minor, step = (int(p) for p in parts)
    return f"gfx{major}{minor}{step:x}"


def environment_notes() -> list[Check]:
    notes = []
    for var in ENV_VARS:
        if var not in os.environ:
            continue
        value = os.environ[var]
        detail = f"{var}={value}"
        if var == "HSA_OVERRIDE_GFX_VERSION":
            arch = override_arch(value)
            detail += (f": the ROCm runtime treats the GPU as {arch or 'an unparsable version'}; "
                       f"needed only where the wheel lacks your GPU's architecture (a wrong value "
                       f"causes memory access faults; an MI50 is 9.0.6)")
        notes.append(Check(var, "info", detail))
    return notes


# ------------------------------------------------------------------ assembling
def run_checks(min_torch: str = MIN_TORCH, require: tuple[str, ...] = ()) -> list[Check]:
    checks = [check_project_env(), check_python(), check_torch(min_torch)]
    if checks[-1].status == "fail":
        return _apply_require(checks, require)  # nothing below works without torch
    from harness import device as dev

    checks += check_device()
    checks.append(check_sdpa())
    checks.append(check_triton())
    checks.append(check_optional_package(
        "deepspeed", "deepspeed", "the DeepSpeed FLOPs profiler, --profile deepspeed",
        "`bash setup/install.sh` (it installs the pinned DeepSpeed with your torch held fixed)"))
    checks += check_profilers(dev.backend())
    for name, purpose in (("numpy", "the harness"), ("pandas", "the analysis tools' tables"),
                          ("matplotlib", "roofline and sweep plots")):
        checks.append(check_optional_package(name, name, purpose,
                                             "`bash setup/install.sh` installs it"))
    checks.append(check_notebooks())
    checks += environment_notes()
    return _apply_require(checks, require)


def _apply_require(checks: list[Check], require: tuple[str, ...]) -> list[Check]:
    """--require NAME turns an optional item into a needed one (e.g. triton for a Triton session)."""
    by_name = {c.name: c for c in checks}
    for name in require:
        check = by_name.get(name)
        if check is None:
            checks.append(Check(name, "fail", "required with --require but not checked "
                                              "(torch missing, or an unknown name)",
                                f"known names: {', '.join(sorted(by_name))}"))
        elif check.missing:
            check.status = "fail"
            check.detail += " (required with --require)"
    return checks


def format_checklist(checks: list[Check]) -> str:
    marks = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]", "info": "[info]"}
    width = max(len(c.name) for c in checks)
    lines = ["Workshop environment check", ""]
    for c in checks:
        lines.append(f"  {marks[c.status]} {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"  {'':6} {'':<{width}}  fix: {c.fix}")
    failed = [c.name for c in checks if c.status == "fail"]
    warned = [c.name for c in checks if c.status == "warn"]
    lines.append("")
    if failed:
        lines.append(f"NOT READY: {len(failed)} needed item(s) missing: {', '.join(failed)} "
                     f"(see {INSTALL_DOC})")
    else:
        lines.append(f"READY: everything the workshop needs is here"
                     + (f"; {len(warned)} optional item(s) missing: {', '.join(warned)}" if warned else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        return _main(argv)
    except UsageError as e:  # bad flags: one line on stderr, exit 2 (harness/errors.py)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def _main(argv) -> int:
    p = OneLineParser(prog="check_environment.py", description=__doc__.splitlines()[0])
    p.add_argument("--require", action="append", default=[], metavar="NAME",
                   help="treat an optional item as needed, e.g. triton, deepspeed, rocprofv3, "
                        "ncu, jupyterlab, gpu (repeatable)")
    p.add_argument("--min-torch", default=MIN_TORCH, help="oldest torch accepted")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = p.parse_args(argv)
    if not version_tuple(args.min_torch):
        raise UsageError(f"--min-torch must look like 2.4 (got {args.min_torch!r})")
    checks = run_checks(args.min_torch, tuple(args.require))
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(format_checklist(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
