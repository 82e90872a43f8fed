"""`make workshop`: train every version that exists on this machine's device and
print one results table.

The preset follows the device: tiny on a CPU, medium on a GPU with 40+ GiB,
small on smaller GPUs. Each version runs in its own process (a crash or OOM in
one does not hide the others) and shows its progress lines as it trains.

Results go to results/workshop/<version>.json (--quick: results/workshop-quick/,
so a 3-step check never replaces a full run's results), but only when the whole
command finishes: the runs write into a temporary folder first, so an interrupted
workshop (Ctrl-C) leaves the previous results as they were. A version that
fails keeps its previous result, and the end of the run says which results are
new and which are kept from an earlier run. A results folder that cannot be
written is refused before the first version trains.

The flags every version shares (--preset, --num-steps and those after --) are
checked once, before any version starts: a typo is one line, not four failures.

On a CPU each version runs with a thread count chosen for the preset (one
thread at the tiny preset, where waking threads costs more than they save),
unless OMP_NUM_THREADS is set; the first line says which.

    python -m training.workshop                      # what `make workshop` runs
    python -m training.workshop --quick              # tiny preset, 3 steps: a check that all run
    python -m training.workshop --preset small -- --precision fp32
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.args import OneLineParser
from harness.config import PRESETS, VERSIONS
from harness.errors import UsageError
from harness.results import (SchemaError, check_writable, duration_text, format_table, load,
                             write_atomic)

from .cli import default_warmup

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


def run_version(version: str, cmd: list[str], env: dict | None = None) -> tuple[int, str]:
    """Run one version, echoing its progress lines; (exit code, its last error line)."""
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}  # progress lines arrive as printed
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
    """Move this run's results into out_dir, one version at a time. Only the versions
    that finished are replaced: a version that failed keeps its previous result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.replace(staging / name, out_dir / name)


def kept_results(out_dir: Path, new_names: list[str]) -> list[str]:
    """'v3 (from 2026-11-20T10:02:11+00:00)' for each result in out_dir this run did not replace."""
    kept = []
    for path in sorted(out_dir.glob("v[0-9].json")):
        if path.name in new_names:
            continue
        try:
            created = load(path)["created"]
        except SchemaError:
            created = "unreadable"
        kept.append(f"{path.stem} (from {created})")
    return kept


def check_shared_flags(preset: str, steps: int, extra: list[str]) -> None:
    """The flags every version gets, checked once by the harness's own parser and
    rules (UsageError, one line). A flag only some versions know is refused here,
    since every version would be handed it."""
    from .cli import build_parser, settings_from_args

    argv = ["--preset", preset, "--num-steps", str(steps), *extra]
    parser = build_parser("workshop", "")
    parser.prog = "workshop (flags for every version)"
    settings_from_args("workshop", parser.parse_args(argv), argv)


def cpu_threads(preset: str) -> tuple[dict, str]:
    """(environment for the versions, the line that says so) on a CPU.

    Each step of the tiny model is a few hundred small matrix products: handing each
    to several threads costs more in waking them than it saves, and on a busy machine
    a thread that waits for a core can stretch a step tenfold. One thread makes the
    tiny preset fast and steady; larger presets keep PyTorch's own choice."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}, f"CPU threads per version: {os.environ['OMP_NUM_THREADS']} (OMP_NUM_THREADS)"
    if preset == "tiny":
        return ({"OMP_NUM_THREADS": "1"},
                "CPU threads per version: 1 (tiny matrices: more threads cost more than they "
                "save; set OMP_NUM_THREADS to choose)")
    import torch
    return {}, (f"CPU threads per version: {torch.get_num_threads()} (PyTorch's default; set "
                f"OMP_NUM_THREADS to choose)")


DESCRIPTION = ("Train every version on this machine's device and print one table; each "
               "version's results go to <out-dir>/<version>.json.")


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m training.workshop", description=DESCRIPTION)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="default: chosen for this device (tiny on a CPU)")
    p.add_argument("--num-steps", type=int, default=None,
                   help=f"steps per version (default: {QUICK_STEPS} with --quick, 30 at the tiny "
                        f"preset, 50 otherwise)")
    p.add_argument("--quick", action="store_true",
                   help=f"tiny preset, {QUICK_STEPS} steps: checks that every version runs (CI)")
    p.add_argument("--out-dir", default=None,
                   help="where each version's <version>.json goes (default: results/workshop/, "
                        "results/workshop-quick/ with --quick: a quick check never replaces a "
                        "full run's results)")
    p.add_argument("extra", nargs="*", help="more flags passed to every version (after --)")
    try:
        args = p.parse_args(argv)
        preset = args.preset or ("tiny" if args.quick else device_preset())
        steps = args.num_steps if args.num_steps is not None else (
            QUICK_STEPS if args.quick else 30 if preset == "tiny" else 50)
        check_shared_flags(preset, steps, args.extra)
        # Absolute: the versions run in the repository's folder, not necessarily this one.
        out_dir = Path(args.out_dir or REPO / "results" / ("workshop-quick" if args.quick
                                                           else "workshop")).absolute()
        check_writable(out_dir, "--out-dir", folder=True)  # before a version trains, not after
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gpu = has_gpu() and "cpu" not in args.extra
    print(f"workshop: preset {preset}, {steps} steps per version, "
          f"{'GPU' if gpu else 'CPU'}; each version prints its progress below", flush=True)
    env = {}
    if not gpu:
        env, threads = cpu_threads(preset)
        print(f"  {threads}", flush=True)
        print(f"  on a CPU, V3's Triton kernels run in Triton's interpreter: seconds a step at the "
              f"tiny preset, far longer at larger ones; its first progress line estimates its "
              f"time (Ctrl-C stops the workshop and keeps the previous results)", flush=True)

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
            code, message = run_version(version, cmd, env)
            if code != 0:
                failed.append(f"{version}: exit {code}: {message}")
                continue
            try:
                row = load(out)
                # The version wrote into the staging folder: its command names where the
                # result stays, so that it can be run again as it reads.
                row["command"] = row["command"].replace(str(staging), str(out_dir))
                write_atomic(out, row)
                rows.append(row)
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
    print(f"  new: {', '.join(Path(n).stem for n in names) or 'none'}")
    kept = kept_results(out_dir, names)
    if kept:
        print(f"  kept from an earlier run: {'; '.join(kept)}")
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the first version started
        print("\nworkshop: interrupted", file=sys.stderr)
        sys.exit(130)
