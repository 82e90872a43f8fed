"""sweep: run one version over a grid of batch size, sequence length, precision,
gradient checkpointing and torch.compile, and plot throughput and memory.

This is seed 000's micro-benchmark plan ("test batch sizes 1..8, measure
tokens/s and memory, then precision, then checkpointing") done on this model,
one subprocess per point through the version's own command line, so a crash or
an out-of-memory (exit 3) costs one point, not the sweep. Each point's progress
lines stream as it trains.

A sweep is written whole or not at all: its points, table and plots go to a
staging folder beside the output folder, which replaces the previous sweep only
when the last plot is written. An interrupted or failed sweep leaves the
previous one as it was.
"""
from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path

import pandas as pd

from harness.config import PRESETS, VERSIONS
from harness.errors import EXIT_CODES
from harness.results import SchemaError, load, numbers
from training.workshop import run_version

from .common import REPO, AnalysisError, plt, save_figure

GRID_AXES = ("batch_size", "seq_len", "precision", "grad_checkpoint", "compile")


def version_script(version: str) -> Path:
    scripts = {name: v.script for name, v in VERSIONS.items()}
    if version in scripts:
        path = REPO / scripts[version]
        if not path.exists():
            raise AnalysisError(f"{version} is not in this checkout ({scripts[version]} is missing)")
        return path
    path = Path(version)
    if path.suffix == ".py" and path.exists():
        return path
    raise AnalysisError(f"unknown version {version!r}: use one of {', '.join(scripts)} or a script path")


def check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise AnalysisError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")


def grid(preset: str, batch_sizes=None, seq_lens=None, precisions=None, grad_checkpoint=(False,),
         compiled=(False,)) -> list[dict]:
    """Every combination of the axes (None: the preset's value / the device default)."""
    check_preset(preset)
    p = PRESETS[preset]
    batch_sizes = batch_sizes or sorted({max(1, p.batch_size // 2), p.batch_size, p.batch_size * 2})
    axes = [batch_sizes, seq_lens or [p.seq_len], precisions or [None], grad_checkpoint, compiled]
    return [dict(zip(GRID_AXES, values)) for values in itertools.product(*axes)]


def point_name(version: str, point: dict) -> str:
    parts = [Path(version).stem if version.endswith(".py") else version,
             f"b{point['batch_size']}", f"s{point['seq_len']}", point["precision"] or "default"]
    parts += [flag for flag in ("grad_checkpoint", "compile") if point[flag]]
    return "_".join(parts)


def point_command(script: Path, preset: str, point: dict, output: Path, num_steps: int,
                  warmup_steps: int, extra=()) -> list[str]:
    cmd = [sys.executable, str(script), "--preset", preset, "--batch-size", str(point["batch_size"]),
           "--seq-len", str(point["seq_len"]), "--num-steps", str(num_steps),
           "--warmup-steps", str(warmup_steps), "--output", str(output)]
    if point["seq_len"] > PRESETS[preset].model.max_seq_len:
        cmd += ["--max-seq-len", str(point["seq_len"])]  # same weights: RoPE has no table size
    if point["precision"]:
        cmd += ["--precision", point["precision"]]
    cmd += ["--grad-checkpoint"] * bool(point["grad_checkpoint"]) + ["--compile"] * bool(point["compile"])
    return cmd + list(extra)


def cpu_warning(version: str, preset: str, points: list[dict], num_steps: int,
                warmup_steps: int) -> str | None:
    """On a CPU, what training says before a GPU-sized run, for the sweep's largest point
    (None on a GPU, or where that point is quick): said once, before the first point."""
    import torch
    if torch.cuda.is_available():
        return None
    from training import cli, trainer

    big = max(points, key=lambda p: p["batch_size"] * p["seq_len"])
    argv = point_command(version_script(version), preset, big, Path("unused.json"), num_steps,
                         warmup_steps)[2:]
    at = argv.index("--output")
    argv = argv[:at] + argv[at + 2:]
    name = version if version in VERSIONS else "v1"
    settings = cli.settings_from_args(name, cli.build_parser(name, "").parse_args(argv), argv)
    settings.command = " ".join(["python", _shown(version_script(version)), *argv])
    note = trainer.gpu_sized_note(settings, torch.device("cpu"))
    count = f"{len(points)} point{'s' * (len(points) > 1)}"
    return note and (f"sweep: {count} on a CPU; the largest, batch {big['batch_size']} "
                     f"x seq {big['seq_len']}: {note}")


def _shown(path: Path) -> str:
    """A script's path as typed from the repository root, where it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def replace_folder(staging: Path, out_dir: Path) -> None:
    """Put a finished staging folder in out_dir's place: the previous folder steps aside
    (one rename), the new one takes its name (another), and only then is the old deleted."""
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def run_sweep(version: str, preset: str, points: list[dict], out_dir, num_steps: int = 20,
              warmup_steps: int = 5, extra=(), say=print, plots: bool = True) -> pd.DataFrame:
    """Run every point, streaming its progress; a failed point is a row with its status,
    never an exception. Points, sweep.csv and (plots=True) the plots are written to a staging
    folder that replaces out_dir when all of them are done; Ctrl-C or an error leaves the
    previous out_dir whole."""
    check_preset(preset)
    script = version_script(version).resolve()
    out_dir = Path(out_dir).resolve()  # the points run in the repository's folder
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A hidden folder beside out_dir (the same file system: renaming it is atomic), made
    # like any other folder of the user's (umask applies).
    staging = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        df = _run_points(version, preset, script, points, staging, out_dir, num_steps,
                         warmup_steps, extra, say)
        df.to_csv(staging / "sweep.csv", index=False)
        if plots:
            plot_sweep(df, staging, Path(version).stem if version.endswith(".py") else version)
        replace_folder(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return df


def _run_points(version, preset, script, points, staging: Path, out_dir: Path, num_steps,
                warmup_steps, extra, say) -> pd.DataFrame:
    rows = []
    for i, point in enumerate(points, 1):
        name = point_name(version, point)
        output = staging / "points" / f"{name}.json"
        cmd = point_command(script, preset, point, output, num_steps, warmup_steps, extra)
        row = {**point, "precision": point["precision"] or "default", "status": "ok", "exit": 0,
               "tokens_per_s": None, "peak_mb": None, "step_ms": None, "mfu_pct": None,
               "message": "", "results": str(out_dir / "points" / output.name)}
        say(f"  [{i}/{len(points)}] {name} ...")
        sys.stdout.flush()  # before the point's own lines
        code, message = run_version(name, cmd)
        row["exit"] = code
        if code != 0:
            row.update(status="oom" if code == 3 else
                       f"failed ({EXIT_CODES.get(code, f'exit {code}')})", message=message[:200])
        else:
            try:
                r = load(output)
                m = numbers(r)
                row.update(tokens_per_s=m["tokens_per_s"], peak_mb=m["peak_memory_mb"],
                           step_ms=m["step_ms"],
                           mfu_pct=m["mfu"] * 100 if m["mfu"] is not None else None)
            except SchemaError as e:
                row.update(status="failed (bad results)", message=str(e))
        say(f"  [{i}/{len(points)}] {name}: {row['status']}"
            + (f", {row['tokens_per_s']:,.0f} tok/s, {row['peak_mb']:,.0f} MB" if row["tokens_per_s"] else
               f" - {row['message']}" if row["message"] else ""))
        rows.append(row)
    return pd.DataFrame(rows)


def _x_axis(df: pd.DataFrame) -> str:
    varying = [a for a in ("batch_size", "seq_len") if df[a].nunique() > 1]
    return varying[0] if varying else "batch_size"


PLOTS = (("tokens_per_s", "throughput (tokens/s)", "sweep_throughput.png"),
         ("peak_mb", "peak memory (MiB)", "sweep_memory.png"))


def plot_sweep(df: pd.DataFrame, out_dir, version: str) -> list[Path]:
    x = _x_axis(df)
    others = [a for a in GRID_AXES if a != x and df[a].nunique() > 1]
    paths = []
    for metric, ylabel, name in PLOTS:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for key, group in (df.groupby(others) if others else [((), df)]):
            key = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{a}={v}" for a, v in zip(others, key)) or version
            ok = group[group["status"] == "ok"].sort_values(x)
            line = ax.plot(ok[x], ok[metric], marker="o", label=label)[0]
            failed = group[group["status"] != "ok"]
            for _, row in failed.iterrows():  # failed points: a cross on the axis, with the reason
                ax.scatter(row[x], 0.02, marker="x", color=line.get_color(), s=60,
                           transform=ax.get_xaxis_transform())
                ax.annotate(row["status"].split(" ")[0], (row[x], 0.05), fontsize=7,
                            xycoords=("data", "axes fraction"), ha="center")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(ylabel)
        ax.set_title(f"{version}: {ylabel.split(' (')[0]} vs {x.replace('_', ' ')} (x = failed point)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out_dir, name))
    return paths
