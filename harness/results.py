"""The results JSON: one file per run, written atomically.

Schema (version 1) - every run writes all top-level keys:
  schema_version   int
  version          "v1" | "v2" | "v3" | "v4" | ...
  created          ISO-8601 UTC time of the run
  command          the command line that produced it
  git_commit       commit of the repository (or null)
  config           ModelConfig fields
  run              batch_size, seq_len, num_steps, warmup_steps, precision, seed,
                   data, compile, grad_checkpoint, grad_accum, world_size, ...
  options          version-specific switches (fusions on/off, SDPA backend, ...)
  device           name, backend rocm|cuda|cpu, arch, torch/triton/HIP/CUDA versions
  losses           loss of every step, warm-up included
  timing_ms        {forward, backward, optimizer, step}: {median, p10, p90, mean, n}
  throughput       tokens_per_s, samples_per_s (from the median step time)
  flops            convention, per_step, per_token, attention_kernel, achieved_tflops
  mfu              {value, peak_tflops, peak_source}; value null when no peak is known
  memory           peak_allocated_mb, peak_reserved_mb (GPU) or peak_rss_mb (CPU)
  gradient_guard   {passed, checked_params}
  warnings         list of strings
  noisy            {value, p90_over_p10, threshold}: value true where the step times spread
                   over NOISY_SPREAD (optional)
  host_probe       {steps, hold_ms, host_ms, gpu_ms, host_waited}: --host-probe's reading
                   (harness/measure.py HostProbe; optional, GPU runs only)
  host_pace        {before_us, after_us, items}: microseconds of a fixed piece of Python
                   just before and after the timed steps (harness/measure.py host_pace_us;
                   host_slowdowns reads it across runs, with the step's median over its
                   p10; optional)

This module builds the record (build), writes it (write_atomic, write_json), reads it
(load, validate) and reads its numbers (numbers: tokens/s, step and phase ms, MFU, peak
memory, final loss) for every table, plot and publisher. format_table (table_rows) prints
a list of results as the plain-text table the workshop shows at its end;
analysis_tools/compare.py extends the same rows.
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

from . import flops
from .errors import UsageError

SCHEMA_VERSION = 1
REQUIRED_KEYS = ("schema_version", "version", "created", "command", "git_commit", "config",
                 "run", "options", "device", "losses", "timing_ms", "throughput", "flops",
                 "mfu", "memory", "gradient_guard", "warnings")
TIMED_PHASES = ("forward", "backward", "optimizer", "step")


class SchemaError(ValueError):
    pass


def git_commit(repo_dir: Path | None = None) -> str | None:
    """The checkout's commit, with "-dirty" appended when tracked files differ from it:
    a number measured on uncommitted code says so. WORKSHOP_GIT_COMMIT, when set, names
    it instead: for a tree synced to a remote GPU machine, whose .git (if any) may be stale."""
    if os.environ.get("WORKSHOP_GIT_COMMIT"):
        return os.environ["WORKSHOP_GIT_COMMIT"]
    repo_dir = repo_dir or Path(__file__).resolve().parents[1]

    def git(*args) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True, timeout=5)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return None
        changed = git("status", "--porcelain", "--untracked-files=no")
        dirty = changed.returncode == 0 and changed.stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


FLOP_CONVENTION = "6*N_matmul + 12*L*d*T per token (fwd+bwd), no causal discount"


def build(settings, precision: str, device: dict, losses: list, timing: dict, memory: dict, *,
          checked_params: int, tokens_per_step: int, measured_peak=None, world_size: int = 1,
          parallel: str = "single", distributed: dict | None = None, warnings=()) -> dict:
    """The record of one training run (the schema above). settings: the run's RunSettings;
    device: harness.device.describe's dict; timing: {phase: {median, p10, p90, ...}} in ms;
    measured_peak: a measured ceiling to take MFU against (the datasheet's beside it);
    warnings: what the model itself wants the reader to know."""
    cfg = settings.model
    step_ms = timing["step"]["median"]
    per_token = flops.model_flops_per_token(cfg, settings.seq_len)
    per_step = per_token * tokens_per_step
    achieved = per_step / (step_ms / 1000) / 1e12 if step_ms else None

    def mfu(peak: dict):  # achieved over the peak of every GPU of the run; None if unknown
        return achieved / (peak["tflops"] * world_size) if achieved and peak["tflops"] else None

    peak = flops.peak_for(device["name"], device["arch"], precision, measured_peak)
    warnings = list(warnings)
    fwd, bwd = timing["forward"]["median"], timing["backward"]["median"]
    if fwd and bwd is not None and bwd < fwd and not (checked_params and device["backend"] == "cpu"):
        # Backward does ~2x the forward's FLOPs. Where the gradient guard passed (a cut
        # graph stops the run), a GPU run is launch-bound: Python launches the forward,
        # autograd's C++ engine the backward, and the host, not the device, sets the pace.
        # A CPU computes what it launches, so there the order says nothing of launches.
        warnings.append(f"backward ({bwd:.2f} ms) is faster than forward ({fwd:.2f} ms) " + (
            "with the gradient guard passed: a launch-bound run (the host sets the pace)"
            if checked_params else "and no gradient guard checked this run: is the autograd "
            "graph cut?"))
    record = {
        "schema_version": SCHEMA_VERSION,
        "version": settings.version,
        "created": now(),
        "command": settings.command,
        "git_commit": git_commit(),
        "config": cfg.to_dict(),
        "run": {"preset": settings.preset, "batch_size": settings.batch_size,
                "seq_len": settings.seq_len, "num_steps": settings.num_steps,
                "warmup_steps": settings.warmup_steps, "learning_rate": settings.learning_rate,
                "precision": precision, "seed": settings.seed, "data": settings.data,
                "compile": settings.compile,
                "compile_mode": settings.compile_mode if settings.compile else None,
                "optimizer": settings.optimizer,
                "shard_optimizer": settings.shard_optimizer,
                "reduce_after_backward": settings.reduce_after_backward,
                "grad_checkpoint": settings.grad_checkpoint,
                "grad_accum": settings.grad_accum, "deterministic": settings.deterministic,
                "world_size": world_size, "parallel": parallel,
                "global_batch_size": settings.global_batch_size(world_size),
                "tokens_per_step": tokens_per_step},
        "options": settings.options,
        "device": device,
        "losses": losses,
        "timing_ms": timing,
        "throughput": {"tokens_per_s": tokens_per_step / step_ms * 1000 if step_ms else None,
                       "samples_per_s": (tokens_per_step / settings.seq_len) / step_ms * 1000
                       if step_ms else None},
        "flops": {"convention": FLOP_CONVENTION, "per_step": per_step, "per_token": per_token,
                  "attention_kernel": flops.attention_kernel_flops(cfg, settings.batch_size,
                                                                   settings.seq_len),
                  "achieved_tflops": achieved},
        "mfu": {"value": mfu(peak), "peak_tflops": peak["tflops"], "peak_source": peak["source"]},
        "memory": memory,
        # A failing guard stops the run (exit 5); one that never looked (0 gradients
        # checked) has not passed: passed is null then, never true.
        "gradient_guard": {"passed": True if checked_params else None,
                           "checked_params": checked_params},
        "warnings": warnings,
    }
    if measured_peak:  # against a measured ceiling, the datasheet MFU stays beside it
        sheet = flops.peak_for(device["name"], device["arch"], precision)
        record["mfu"].update(datasheet_value=mfu(sheet), datasheet_peak_tflops=sheet["tflops"])
    # Step times spread over NOISY_SPREAD: the machine was busy with other work.
    record["noisy"] = {"value": is_noisy(record), "p90_over_p10": step_spread(record),
                       "threshold": NOISY_SPREAD}
    if distributed:
        record["distributed"] = distributed
    return record


OBJECTS = ("config", "run", "options", "device", "timing_ms", "throughput", "flops", "mfu",
           "memory", "gradient_guard")


def validate(result: dict) -> None:
    """Keys, types and ranges: a hand-edited or damaged file is refused here with one line
    naming the field, not later as a traceback or a nonsense ratio in a table."""
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise SchemaError(f"results are missing keys: {', '.join(missing)}")
    if result["schema_version"] != SCHEMA_VERSION:
        raise SchemaError(f"schema_version {result['schema_version']} is not {SCHEMA_VERSION}")
    for key in OBJECTS:
        if not isinstance(result[key], dict):
            raise SchemaError(f"{key} must be an object (got {result[key]!r:.40})")
    if not isinstance(result["version"], str):
        raise SchemaError(f"version must be a string (got {result['version']!r:.40})")
    for key in ("losses", "warnings"):
        if not isinstance(result[key], list):
            raise SchemaError(f"{key} must be a list (got {result[key]!r:.40})")
    for i, loss in enumerate(result["losses"]):
        _check_number(f"losses[{i}]", loss)
    for phase in TIMED_PHASES:
        stats = result["timing_ms"].get(phase)
        if not isinstance(stats, dict) or not {"median", "p10", "p90"} <= set(stats):
            raise SchemaError(f"timing_ms.{phase} needs median, p10 and p90")
        for q in ("median", "p10", "p90"):  # a step takes time; a phase may take ~0 ms
            _check_number(f"timing_ms.{phase}.{q}", stats[q],
                          **({"above": 0} if phase == "step" else {"at_least": 0}))
    _check_number("throughput.tokens_per_s", result["throughput"].get("tokens_per_s"), above=0)
    for key in ("batch_size", "seq_len"):
        if key in result["run"]:
            _check_number(f"run.{key}", result["run"][key], above=0)
    for key, value in [*result["memory"].items(), ("mfu.value", result["mfu"].get("value"))]:
        if value is not None:
            _check_number(key if "." in key else f"memory.{key}", value, at_least=0)


def _check_number(field: str, value, above: float | None = None, at_least: float | None = None) -> None:
    """value is a finite number (bool is not one), > above / >= at_least when given."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or (above is not None and value <= above) or (at_least is not None and value < at_least):
        bound = f" > {above}" if above is not None else f" >= {at_least}" if at_least is not None else ""
        raise SchemaError(f"{field} must be a number{bound} (got {value!r:.40})")


def now() -> str:
    """When a result was made: UTC, to the second (every JSON's "created")."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: str | os.PathLike, result: dict) -> Path:
    """Write a validated results file with write_json."""
    validate(result)
    return write_json(path, result)


def check_writable(path: str | os.PathLike, flag: str, folder: bool = False) -> None:
    """Refuse, before a run starts, a place its results cannot go (UsageError, one line):
    a folder where the file goes (a file where the folder goes, with folder=True), a file
    where a parent folder must be, or a place where no file can be made (/proc, a
    read-only folder). A run that finds out only when it writes has lost its work.

    Nothing is created: a probe file is made and removed in the nearest folder that
    exists (and in the folder itself, where it exists), where the missing ones would go."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise UsageError(f"{flag} {path}: {'a file' if folder else 'a folder'} of that name is "
                         f"in the way; name a {'folder' if folder else 'file'}")
    nearest = path.parent
    while not nearest.exists():
        nearest = nearest.parent
    if not nearest.is_dir():
        raise UsageError(f"{flag} {path}: {nearest} is a file, not a folder")
    for place in {nearest, path} if path.is_dir() else {nearest}:
        try:
            tempfile.TemporaryFile(dir=place).close()
        except OSError as e:  # /proc answers "no such file" of its own folder: no reason then
            reason = f" ({e.strerror})" if e.strerror and e.errno != errno.ENOENT else ""
            raise UsageError(f"{flag} {path}: no file can be made in {place}{reason}") from None


def write_json(path: str | os.PathLike, data: dict, indent: int = 2) -> Path:
    """Write JSON to a temporary file in the same folder, then rename it.

    A rename within one file system is atomic, so a reader (or a crashed run)
    never sees a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file readable by its owner only; a results file is
        # an ordinary file, readable like any other the user writes (umask applies).
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read the umask is to set it
    os.umask(mask)
    return mask


def load(path: str | os.PathLike) -> dict:
    """Read and validate a results file; raises SchemaError with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: no such file")
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(result, dict):
        raise SchemaError(f"{path}: not a results object")
    try:
        validate(result)
    except SchemaError as e:
        raise SchemaError(f"{path}: {e}") from None
    return result


def records_in(source: str | os.PathLike) -> dict[str, dict]:
    """Rows of `bash benchmarks/reproduce.sh` by 'step/name': from its work folder (one JSON
    per row: a record, or a failed run's {exit_code, error}) or from a published set's
    rows.json (the same, in one file). Files that are neither are left out."""
    source = Path(source)
    if source.is_file():
        rows = json.loads(source.read_text())
        return {key: data for key, data in rows.items() if isinstance(data, dict)}
    rows = {}
    for path in sorted(source.glob("*/*.json")):
        if path.name.startswith("."):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and ("schema_version" in data or "exit_code" in data):
            rows[f"{path.parent.name}/{path.stem}"] = data
    return rows


# ---------------------------------------------------------------- a plain-text table of runs
def _fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def duration_text(seconds: float) -> str:
    """A wall time as people say it: '0.4 s', '40 s', '2.5 min', '1.2 h'."""
    if seconds < 9.5:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


# A run whose 90th-percentile step takes this much longer than its 10th was shared
# with other work (a busy CPU, a throttled GPU): its median means little, and a
# speed-up computed from it less.
NOISY_SPREAD = 1.5


def step_spread(result: dict) -> float | None:
    """p90 / p10 of the step time: 1.0 for a steady run; None where not recorded."""
    step = result["timing_ms"]["step"]
    p10, p90 = step.get("p10"), step.get("p90")
    return p90 / p10 if p10 and p90 else None


def is_noisy(result: dict) -> bool:
    spread = step_spread(result)
    return spread is not None and spread > NOISY_SPREAD


SLOW_HOST = 1.25  # a process whose Python ran this much slower than the machine's fastest
SLOW_SPELL = 1.2  # a process whose median step took this much longer than its fastest tenth


def run_pace(result: dict) -> dict | None:
    """What host_slowdowns reads of one run: its host_pace probes and steps_x, its median
    step over its fastest tenth (p10); None for a run that records no host_pace. steps_x
    only for one process: steps that wait on other processes' communication spread with it."""
    pace = result.get("host_pace")
    if not pace:
        return None
    step = (result.get("timing_ms") or {}).get("step") or {}
    median, p10 = step.get("median"), step.get("p10")
    alone = (result.get("run") or {}).get("world_size", 1) == 1
    return {**pace, "steps_x": median / p10 if alone and median and p10 else None}


def host_slowdowns(paces: dict) -> dict:
    """{key: {pace_x, steps_x}} of each process that ran on a slow host, from every process's
    run_pace (runs of one machine, at least 3; else {}).

    pace_x is the slower of a process's two probes over the fastest probe of them all (the
    machine's pace). The fastest, not the median: the same Python never runs faster than the
    machine lets it, and on a shared host a slow spell can cover half the runs, median
    included. The slower probe, not the faster: a spell comes and goes within seconds, and a
    run probed fast before its steps and slow after them can have run slow in between. Above
    SLOW_HOST it ran on a slow host. A spell can also come and go between the two probes:
    then the run's own steps disagree, and a median step over SLOW_SPELL times its fastest
    tenth (steps_x) says so. The rule reads the probes and each run's steps against each
    other, never one run's speed against another's, so leaving such runs out cannot pick the
    fast ones."""
    probes = {key: max(p["before_us"], p["after_us"]) for key, p in paces.items() if p}
    if len(probes) < 3:
        return {}
    fastest = min(min(p["before_us"], p["after_us"]) for p in paces.values() if p)
    readings = {key: {"pace_x": us / fastest, "steps_x": paces[key].get("steps_x")}
                for key, us in probes.items()}
    return {key: r for key, r in readings.items()
            if r["pace_x"] > SLOW_HOST or (r["steps_x"] or 0) > SLOW_SPELL}


def spell_between_probes(reading: dict) -> bool:
    """Did host_slowdowns name this process by its steps alone (its probes read at pace)?"""
    return reading["pace_x"] <= SLOW_HOST


def slowdown_words(reading: dict, fastest: str = "the comparison's fastest") -> str:
    """How a process of host_slowdowns ran slow, after its name: "ran its Python 1.88x slower
    than the comparison's fastest", or for a spell its probes missed, its median step."""
    if not spell_between_probes(reading):
        return f"ran its Python {reading['pace_x']:.2f}x slower than {fastest}"
    return (f"had its median step {reading['steps_x']:.2f}x its fastest tenth's "
            "(a slow spell between its host's probes)")


def run_key(run: dict) -> tuple:
    """(version, mode, repeat): one process of a compare_versions JSON, as its slow_hosts name it."""
    return run.get("version"), run.get("mode"), run.get("repeat")


def slow_keys(slow_hosts: list[dict]) -> set:
    """The run_key of each process a compare_versions JSON's slow_hosts names."""
    return {run_key(s) for s in slow_hosts}


def comparison_paces(runs: list[dict]) -> dict:
    """{run_key: run_pace} of a compare_versions JSON's runs that record one."""
    return {run_key(run): pace for run in runs
            if isinstance(run, dict) and (pace := run_pace(run.get("result") or {}))}


def at_pace_else_all(runs: list, ran_slow) -> list:
    """The runs a row's number is taken from: those whose host ran at pace where any did, else
    all of them (a row whose every process ran slow still has a number, and says so).
    `ran_slow(run)`: whether host_slowdowns named that run. Every table that counts a row's
    processes (compare_versions, analysis_tools compare, reproduce's rows copied from a
    comparison) counts them here."""
    return [run for run in runs if not ran_slow(run)] or list(runs)


def peak_memory_mb(result: dict) -> float | None:
    """The run's peak memory in MB: the allocator's peak on a GPU, the process's peak resident
    memory (RSS) on a CPU. Every table, plot and publisher reads it here."""
    mem = result["memory"]
    return mem.get("peak_allocated_mb", mem.get("peak_rss_mb"))


def measured_on_gpu_allocator(result: dict) -> bool:
    """Is peak_memory_mb the GPU allocator's peak (True) or a CPU process's RSS (False)?"""
    return "peak_allocated_mb" in result["memory"]


def numbers(result: dict) -> dict:
    """The numbers of one run that every table, plot and publisher quotes: tokens_per_s,
    step_ms and each phase's ms (forward_ms, ...: medians), mfu (a fraction, None with no
    known peak), achieved_tflops, peak_memory_mb, final_loss and the step times'
    p90_over_p10. Missing parts (a record rebuilt from a comparison's row) read as None."""
    timing, losses = result["timing_ms"], result.get("losses")
    return {"tokens_per_s": result["throughput"]["tokens_per_s"],
            **{f"{phase}_ms": timing.get(phase, {}).get("median") for phase in TIMED_PHASES},
            "mfu": result.get("mfu", {}).get("value"),
            "achieved_tflops": result.get("flops", {}).get("achieved_tflops"),
            "peak_memory_mb": peak_memory_mb(result) if "memory" in result else None,
            "final_loss": losses[-1] if losses else result.get("final_loss"),
            "p90_over_p10": step_spread(result)}


# --host-probe's rule: a GPU that waits more than this fraction of the timed step (the step less
# the GPU's time for a step queued ahead of it) is paced by the host.
HOST_PACES = 0.05


def gpu_waiting_ms(probe: dict, step_ms: float) -> float | None:
    """How long the GPU waited a step for the host: the timed steps' median less the GPU's
    time for a step queued ahead of it (nothing else was queued). None where the probe has
    no reading (the host waited for the GPU while queueing)."""
    return None if probe["host_waited"] else step_ms - probe["gpu_ms"]


def host_probe_verdict(probe: dict, step_ms: float) -> str:
    """Who paces the step, from a host_probe reading and the timed steps' median
    (gpu_waiting_ms). The probe's own host time is queued behind a held GPU, hundreds of
    launches deep, and can read more than a step takes (docs/PROFILING.md): it compares
    runs, it does not judge one."""
    waiting = gpu_waiting_ms(probe, step_ms)
    if waiting is None:
        return "no reading: the host waited for the GPU while queueing a step"
    if waiting > HOST_PACES * step_ms:
        return f"the GPU waited {waiting:.2f} ms a step for the host: the host paces the step"
    return "the GPU hardly waited: it paces the step"


def table_rows(results: list[dict]) -> list[dict]:
    """One row per run; speed-up is relative to the first v1 run (if any).
    'p90/p10' is the spread of its step times (see NOISY_SPREAD)."""
    base = next((r for r in results if r["version"] == "v1"), None)
    base_tps = numbers(base)["tokens_per_s"] if base else None
    rows = []
    for r in results:
        m = numbers(r)
        tps = m["tokens_per_s"]
        rows.append({
            "version": r["version"] + (" (compiled)" if r["run"].get("compile") else ""),
            "precision": r["run"]["precision"],
            "tokens/s": tps,
            "speedup": tps / base_tps if base_tps and tps else None,
            "step ms": m["step_ms"], "fwd ms": m["forward_ms"],
            "bwd ms": m["backward_ms"], "opt ms": m["optimizer_ms"],
            "MFU %": m["mfu"] * 100 if m["mfu"] is not None else None,
            "peak MB": m["peak_memory_mb"],
            "final loss": m["final_loss"],
            "p90/p10": m["p90_over_p10"],
        })
    return rows


FORMATS = {"tokens/s": ",.0f", "speedup": ".2f", "step ms": ".2f", "fwd ms": ".2f",
           "bwd ms": ".2f", "opt ms": ".2f", "MFU %": ".1f", "peak MB": ",.0f", "final loss": ".4f", "p90/p10": ".2f"}


def format_table(results: list[dict]) -> str:
    """The table, with 'noisy' for a speed-up that either of its two runs makes
    meaningless (step times spread over NOISY_SPREAD), and a line saying why."""
    rows = table_rows(results)
    base = next((r for r in results if r["version"] == "v1"), None)
    base_noisy = base is not None and is_noisy(base)
    noisy = [r["version"] for r in results if is_noisy(r)]
    for row, r in zip(rows, results):
        if row["speedup"] is not None and (base_noisy or is_noisy(r)):
            row["speedup"] = "noisy"
    headers = list(rows[0])
    cells = [[_fmt(row[h], FORMATS[h]) if h in FORMATS and not isinstance(row[h], str)
              else str(row[h]) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))  # noqa: E731
    device = results[0]["device"]
    out = [f"device: {device['name']} ({device['backend']}), torch {device['torch']}",
           line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    if noisy:
        out.append(f"NOISY {', '.join(noisy)}: step times spread over {NOISY_SPREAD}x (p90/p10), "
                   f"so the machine was busy with other work; their speed-ups mean nothing. "
                   f"Close other programs, or on a CPU set OMP_NUM_THREADS=1, and run again.")
    for r in results:
        out += [f"WARNING {r['version']}: {w}" for w in r.get("warnings", [])]
    return "\n".join(out)
