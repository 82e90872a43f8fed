"""`make workshop`: train every version that exists on this machine's device and
print one results table.

The preset follows the device: tiny on a CPU, medium on a GPU with 40+ GiB,
small on smaller GPUs. Each version runs in its own process (a crash or OOM in
one does not hide the others) and shows its progress lines as it trains.

Results go to results/workshop/<version>.json, but only when the whole command
finishes: the runs write into a temporary folder first, so an interrupted
workshop (Ctrl-C) leaves the previous results/workshop/ as it was, never a mix
of new and old files.

    python -m harness.workshop                      # what `make workshop` runs
    python -m harness.workshop --quick              # tiny preset, 3 steps: a minute on a CPU
    python -m harness.workshop --preset small -- --precision fp32
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cli import default_warmup
from .config import VERSIONS
from .results import SchemaError, duration_text, format_table, load

REPO = Path(__file__).resolve().parents[1]
QUICK_STEPS = 3
RESULTS_PAGE = "docs/RESULTS.md"

CPU_NOTE = f"""\
NOTE: these are CPU timings. They do not show the GPU lessons of this workshop:
  a CPU has no kernel launches to save and no fast on-chip memory for fused or
  flash kernels to exploit, V3's Triton kernels run in Triton's interpreter
  (a correctness demo), and at the tiny preset Python overhead dominates.
  Speed-ups here vary from run to run and can fall below 1. The GPU results
  these versions are about are in {RESULTS_PAGE}."""


def device_preset() -> str:
    import torch
    if not torch.cuda.is_available():
        return "tiny"
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return "medium" if gib >= 40 else "small"


def has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def run_version(version: str, cmd: list[str]) -> tuple[int, str]:
    """Run one version, echoing its progress lines; (exit code, its last error line)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # progress lines arrive as they are printed
    last, error = "", ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, cwd=REPO) as proc:
        try:
            for line in proc.stdout:
                line = line.rstrip()
                if not line or line.startswith("results: "):
                    continue  # the temporary path means nothing to the reader
                print(f"    {version} | {line}", flush=True)
                last = line
                if line.startswith("error: "):
                    error = line[len("error: "):]
            proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reaches the child too; let it stop, then go on
            proc.terminate()
            proc.wait()
            raise
    return proc.returncode, error or last or "(no message)"


def publish(staging: Path, out_dir: Path, names: list[str]) -> None:
    """Replace the previous workshop results with this run's, version by version."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("v[0-9].json"):  # every version's, also one not run this time
        old.unlink()
    for name in names:
        os.replace(staging / name, out_dir / name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="default: chosen for this device")
    p.add_argument("--num-steps", type=int, default=None,
                   help=f"steps per version (default: {QUICK_STEPS} with --quick, 30 at the tiny "
                        f"preset, 50 otherwise)")
    p.add_argument("--quick", action="store_true",
                   help=f"tiny preset, {QUICK_STEPS} steps: checks that every version runs (CI)")
    p.add_argument("--out-dir", default=str(REPO / "results" / "workshop"))
    p.add_argument("extra", nargs="*", help="more flags passed to every version (after --)")
    args = p.parse_args(argv)
    preset = args.preset or ("tiny" if args.quick else device_preset())
    steps = args.num_steps if args.num_steps is not None else (
        QUICK_STEPS if args.quick else 30 if preset == "tiny" else 50)
    if steps < 1:
        print("error: --num-steps must be > 0", file=sys.stderr)
        return 2
    gpu = has_gpu() and "cpu" not in args.extra
    print(f"workshop: preset {preset}, {steps} steps per version, "
          f"{'GPU' if gpu else 'CPU'}; each version prints its progress below", flush=True)
    if not gpu:
        print(f"  on a CPU, V3's Triton kernels run in Triton's interpreter: seconds a step at the "
              f"tiny preset, far longer at larger ones; its first progress line estimates its "
              f"time (Ctrl-C stops the workshop and keeps the previous results)", flush=True)

    out_dir = Path(args.out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    rows, names, failed = [], [], []
    started = time.monotonic()
    try:
        for version, entry in VERSIONS.items():
            script = entry.script
            if not (REPO / script).exists():
                continue
            out = staging / f"{version}.json"
            cmd = [sys.executable, str(REPO / script), "--preset", preset, "--num-steps", str(steps),
                   "--warmup-steps", str(default_warmup(steps)), "--output", str(out),
                   *args.extra]
            print(f"  running {version} ...", flush=True)
            t0 = time.monotonic()
            code, message = run_version(version, cmd)
            if code != 0:
                failed.append(f"{version}: exit {code}: {message}")
                continue
            try:
                rows.append(load(out))
                names.append(out.name)
            except SchemaError as e:
                failed.append(f"{version}: {e}")
                continue
            print(f"  {version} done in {duration_text(time.monotonic() - t0)}", flush=True)
        publish(staging, out_dir, names)
    except KeyboardInterrupt:
        print(f"\nworkshop: interrupted; {out_dir} keeps its previous results", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    if rows:
        print()
        print(format_table(rows))
        if rows[0]["device"]["type"] == "cpu":
            print()
            print(CPU_NOTE)
        print(f"\nresults: {out_dir}/ ({duration_text(time.monotonic() - started)} in all)")
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the first version started
        print("\nworkshop: interrupted", file=sys.stderr)
        sys.exit(130)
