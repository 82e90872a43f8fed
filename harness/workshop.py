"""`make workshop`: train every version that exists on this machine's device and
print one results table.

The preset follows the device: tiny on a CPU, medium on a GPU with 40+ GiB,
small on smaller GPUs. Each version runs in its own process (a crash or OOM in
one does not hide the others) and writes results/workshop/<version>.json.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .report import format_table
from .results import SchemaError, load

REPO = Path(__file__).resolve().parents[1]
VERSIONS = [("v1", "version1_baseline/tiny_llama_v1.py"), ("v2", "version2_fused/tiny_llama_v2.py"),
            ("v3", "version3_triton/tiny_llama_v3.py"), ("v4", "version4_sdpa/tiny_llama_v4.py")]


def device_preset() -> str:
    import torch
    if not torch.cuda.is_available():
        return "tiny"
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return "medium" if gib >= 40 else "small"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="default: chosen for this device")
    p.add_argument("--num-steps", type=int, default=None)
    p.add_argument("--out-dir", default=str(REPO / "results" / "workshop"))
    p.add_argument("extra", nargs="*", help="more flags passed to every version (after --)")
    args = p.parse_args(argv)
    preset = args.preset or device_preset()
    steps = args.num_steps or (30 if preset == "tiny" else 50)
    print(f"workshop: preset {preset}, {steps} steps per version")
    rows, failed = [], []
    for version, script in VERSIONS:
        if not (REPO / script).exists():
            continue
        out = Path(args.out_dir) / f"{version}.json"
        cmd = [sys.executable, str(REPO / script), "--preset", preset, "--num-steps", str(steps),
               "--warmup-steps", str(min(5, steps // 2)), "--output", str(out), "--quiet", *args.extra]
        print(f"  running {version} ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            message = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            failed.append(f"{version}: exit {proc.returncode}: {message}")
            continue
        try:
            rows.append(load(out))
        except SchemaError as e:
            failed.append(f"{version}: {e}")
    if rows:
        print()
        print(format_table(rows))
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
