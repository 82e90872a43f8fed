"""python -m analysis_tools <command> ...   (each command: --help)

  compare   table + plots of result JSONs, loud flags on suspicious numbers
  ceilings  print a ceilings JSON (measured by python -m benchmarks.ceilings) beside the datasheet
  roofline  roofline plot: analytic ops, measured ops, profiler kernels, runs
  headroom  each run's step time against the sum of its operations' rooflines
  memory    predicted peak memory vs measured (or traced) peak
  sweep     run a version over a grid of batch/seq/precision/checkpointing/compile
  report    self-contained HTML report + Markdown summary of a results folder
  regress   compare new results with a baseline; exit 1 on a regression
  scaling   scaling efficiency of torchrun runs (DDP, FSDP2) against a 1-GPU run
  overlap   communication/compute overlap in PyTorch profiler traces of a data-parallel run

Exit codes: 0 ok, 1 regression (regress) or suspicious results (compare --strict),
2 bad input (one line on stderr), 130 interrupted (Ctrl-C; a sweep keeps the previous one).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.args import OneLineParser
from harness.config import PRECISIONS, VERSIONS, parse_precisions
from harness.errors import WorkshopError

from .common import AnalysisError, out_dir_default, parse_kv_list, text_table


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AnalysisError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise AnalysisError(f"{flag}: expected positive integers, got {text!r}")
    return values


LIST_FLAGS = ("--batch-sizes", "--seq-lens")


def _attach_list_values(argv: list[str]) -> list[str]:
    """'--batch-sizes -4,8' -> '--batch-sizes=-4,8': argparse takes a value that starts with
    '-' for a flag of its own ('expected one argument'); attached, the value reaches the
    check that says what is wrong with it."""
    out = []
    for token in argv:
        if out and out[-1] in LIST_FLAGS and token.startswith("-") and token[1:2].isdigit():
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _int_at_least(lowest: int):
    """argparse type: an integer >= lowest (1 for a batch size, sequence length or step
    count; 0 for warm-up steps). argparse turns the error into one line, exit 2."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {value}")
        return value
    return parse


_positive, _non_negative = _int_at_least(1), _int_at_least(0)


def _switches(text: str) -> list[bool]:
    table = {"off": False, "on": True, "false": False, "true": True, "0": False, "1": True}
    try:
        return [table[v.strip().lower()] for v in text.split(",") if v.strip()]
    except KeyError:
        raise AnalysisError(f"expected on/off values, got {text!r}") from None


def _kernel_tables(items) -> dict:
    tables = {}
    for item in items or []:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).stem, item
        tables[label] = path
    return tables


# ---------------------------------------------------------------- commands
def cmd_compare(args) -> int:
    from .compare import compare_runs, format_report
    out = compare_runs(args.results, None if args.no_plots else args.out_dir)
    print(format_report(out))
    return 1 if args.strict and out["flags"] else 0


def cmd_ceilings(args) -> int:
    from .ceilings import format_ceilings, load_ceilings, plot_copy_sweep
    path = args.ceilings or Path(args.out_dir) / "ceilings.json"
    data = load_ceilings(path)
    print(format_ceilings(data))
    if data["measured"].get("copy_sweep"):
        print(f"plot: {plot_copy_sweep(data, args.out_dir)}")
    print(f"ceilings: {path}")
    return 0


def cmd_roofline(args) -> int:
    from .roofline import category_summary, draw_roofline
    out = draw_roofline(args.results or None, args.preset, args.batch_size, args.seq_len, args.precision,
                   args.attention, args.ceilings, _kernel_tables(args.kernels), args.measure_ops,
                   args.device, args.out_dir, args.name)
    columns = ["op", "category", "count", "flops", "bytes", "intensity"]
    print("analytic operations of one training step (FLOPs and minimum bytes, all layers):")
    print(text_table(out["analytic"][columns], {"flops": ".3g", "bytes": ".3g", "intensity": ".2f"}))
    if out["note"]:
        print(f"note: {out['note']}")
    for c in out["ceilings"]:
        print(f"ceiling {c['label']}: {c['tflops']:.1f} TFLOP/s, {c['tbs']:.2f} TB/s, "
              f"ridge at {c['tflops'] / c['tbs']:.0f} FLOP/B")
    if out["measured"] is not None:
        print("\nmeasured alone (forward + backward, median):")
        print(text_table(out["measured"][["op", "implementation", "ms_per_call", "intensity",
                                          "achieved_tflops", "achieved_gbs"]],
                         {"ms_per_call": ".4f", "intensity": ".2f", "achieved_tflops": ".3g",
                          "achieved_gbs": ".1f"}))
        out["measured"].to_csv(Path(args.out_dir) / f"{Path(args.name).stem}_measured_ops.csv", index=False)
    if out["kernels"] is not None:
        missing = int(out["kernels"]["intensity"].isna().sum())
        print("\nkernel time by category:")
        print(text_table(category_summary(out["kernels"]), {"time ms": ".3f", "share %": ".1f"}))
        if missing:
            print(f"({missing} kernels have no FLOPs or bytes in their table and are not plotted)")
    if out["steps"] is not None:
        print("\nwhole training steps:")
        print(text_table(out["steps"], {"intensity": ".2f", "achieved_tflops": ".3g"}))
    print(f"plot: {out['plot']}")
    return 0


def cmd_memory(args) -> int:
    from . import memory
    if args.results:
        out = memory.memory_for_results(args.results, args.out_dir, trace=args.trace)
        print(text_table(out["table"], {"predicted MiB": ",.0f", "measured MiB": ",.0f", "error %": "+.1f",
                                        "traced MiB": ",.0f", "traced max_allocated MiB": ",.0f"}))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            out["table"].to_json(args.json, orient="records", indent=1)
            print(f"table: {args.json}")
        for r, label in zip(out["results"], out["table"]["run"]):
            pred = memory.predict_for_result(r)
            print(f"\n{label}: peak at '{pred.moment}'")
            print(text_table(memory.breakdown_table(pred), {"MiB": ",.1f"}))
        print(f"plot: {out['plots'][0]}")
        return 0
    from harness.config import PRESETS
    device = "cpu" if args.device == "cpu" else "cuda"
    switches = {name.removeprefix("no-").replace("-", "_"): not name.startswith("no-")
                for name in args.switch}
    pred = memory.predict_preset(args.preset, args.version, args.batch_size, args.seq_len,
                                 args.precision, args.grad_checkpoint, device, switches,
                                 args.optimizer)
    extras = "".join(f" --{name}" for name in args.switch)
    print(f"{args.version} {args.preset} {args.precision}"
          f"{' +grad-checkpoint' if args.grad_checkpoint else ''}{extras}: predicted peak "
          f"{pred.peak_mib:,.0f} MiB at '{pred.moment}'")
    print(text_table(memory.breakdown_table(pred), {"MiB": ",.1f"}))
    if args.trace:
        p = PRESETS[args.preset]
        traced = memory.trace_step(args.version, p.model, args.batch_size or p.batch_size,
                                   args.seq_len or p.seq_len, args.precision, args.device,
                                   args.grad_checkpoint)
        print(f"traced peak of live tensors: {traced['peak_bytes'] / memory.MiB:,.0f} MiB "
              f"(at {traced['peak_op']}); model error "
              f"{(pred.peak_bytes / traced['peak_bytes'] - 1) * 100:+.1f}%")
    return 0


def cmd_sweep(args) -> int:
    from training.workshop import device_preset
    from .sweep import PLOTS, cpu_warning, grid, run_sweep, version_script
    if args.warmup_steps >= args.num_steps:
        raise AnalysisError(f"--warmup-steps ({args.warmup_steps}) must be below --num-steps "
                            f"({args.num_steps})")
    preset = args.preset or device_preset()
    points = grid(preset, _ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else None,
                  _ints(args.seq_lens, "--seq-lens") if args.seq_lens else None,
                  parse_precisions(args.precisions) if args.precisions else None,
                  _switches(args.grad_checkpoint), _switches(args.compile))
    version_script(args.version)  # an unknown version: one line before anything runs
    out_dir = Path(args.out_dir) / f"sweep_{Path(args.version).stem}_{preset}"
    print(f"sweep: {args.version}, preset {preset}, {len(points)} points -> {out_dir} "
          f"(replaced when the sweep is complete)", flush=True)
    warning = cpu_warning(args.version, preset, points, args.num_steps, args.warmup_steps)
    if warning:
        print(warning, flush=True)
    df = run_sweep(args.version, preset, points, out_dir, args.num_steps, args.warmup_steps, args.extra)
    shown = df.drop(columns=["results", "message"])
    print(text_table(shown, {"tokens_per_s": ",.0f", "peak_mb": ",.0f", "step_ms": ".2f", "mfu_pct": ".1f"}))
    for *_, name in PLOTS:
        print(f"plot: {out_dir / name}")
    print(f"table: {out_dir / 'sweep.csv'}")
    return 0


def cmd_report(args) -> int:
    from .report import build_report
    out = build_report(args.results, args.out_dir, args.ceilings, _kernel_tables(args.kernels), args.title)
    print(f"report: {out['html']}\nsummary: {out['markdown']}")
    if out["flags"]:
        print(f"{len(out['flags'])} suspicious result(s) flagged in the report")
    return 0


def cmd_headroom(args) -> int:
    from .compare import load_runs
    from .headroom import ceilings_for_runs, headroom
    results, notes = load_runs(args.results)
    if not results:
        raise AnalysisError("headroom: no results in " + ", ".join(args.results))
    ceilings, path = ceilings_for_runs(results, args.ceilings)
    out = headroom(results, ceilings)
    measured = ceilings["measured"]
    print(f"ceilings: {path} ({ceilings['device']['name']}; copy {measured['copy_gbs']:,.0f} GB/s)")
    for setup, ops in out["ops"].items():
        print(f"\n{setup}: each operation at its roofline (ms per step)")
        print(text_table(ops[["op", "count", "GFLOP", "MB", "compute ms", "memory ms", "roofline ms",
                              "bound"]], {"GFLOP": ",.1f", "MB": ",.0f", "compute ms": ".2f",
                                          "memory ms": ".2f", "roofline ms": ".2f"}))
    print("\neach run against the sum (a yardstick: see `analysis_tools/headroom.py`):")
    print(text_table(out["runs"].drop(columns="setup") if len(out["ops"]) == 1 else out["runs"],
                     {"step ms": ".2f", "at rooflines ms": ".2f", "of the step %": ".1f",
                      "above them ms": ".2f"}))
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_regress(args) -> int:
    from .regress import check_regressions, display_table
    tolerances = parse_kv_list(args.tolerance, "--tolerance") if args.tolerance else None
    out = check_regressions([args.baseline], args.results, tolerances)
    print(text_table(display_table(out["table"])))
    for note in out["notes"]:
        print(f"note: {note}")
    if out["regressions"]:
        print(f"REGRESSION ({len(out['regressions'])}):", file=sys.stderr)
        for line in out["regressions"]:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("no regression beyond tolerance")
    return 0


def cmd_scaling(args) -> int:
    import json

    from harness import results

    from .scaling import format_scaling, scaling
    try:
        single = results.load(args.single)
        rows = [scaling(single, results.load(path)) for path in args.multi]
    except results.SchemaError as e:
        raise AnalysisError(str(e)) from None
    print(format_scaling(single, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"single": args.single, "runs": dict(zip(args.multi, rows))}, f, indent=2)
    return 0


def cmd_overlap(args) -> int:
    from harness import results
    from .scaling import communication_overlap, format_overlap
    rows = [communication_overlap(path) for path in args.traces]
    print("\n".join(format_overlap(row) for row in rows))
    if args.json:  # reproduce's scaling step: one per profiled run, beside its traces
        results.write_json(args.json, {"created": results.now(), "git_commit": results.git_commit(),
                                       "ranks": rows})
    return 0


# ---------------------------------------------------------------- parser
def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m analysis_tools", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    out_help = f"folder for plots and files (default {out_dir_default()})"

    c = sub.add_parser("compare", help="table + plots of result JSONs")
    c.add_argument("results", nargs="+", help="results JSON files or folders, or benchmarks/compare_versions.py JSON files")
    c.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    c.add_argument("--no-plots", action="store_true")
    c.add_argument("--strict", action="store_true", help="exit 1 when a result looks suspicious")
    c.set_defaults(func=cmd_compare)

    e = sub.add_parser("ceilings", help="print a ceilings JSON beside the datasheet")
    e.add_argument("ceilings", nargs="?", help="JSON written by `python -m benchmarks.ceilings` "
                                               "(default <out-dir>/ceilings.json)")
    e.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    e.set_defaults(func=cmd_ceilings)

    r = sub.add_parser("roofline", help="roofline plot")
    r.add_argument("results", nargs="*", help="results JSONs (config and step points)")
    r.add_argument("--preset", help="config when no results are given (default small)")
    r.add_argument("--batch-size", type=_positive)
    r.add_argument("--seq-len", type=_positive)
    r.add_argument("--precision", choices=tuple(PRECISIONS))
    r.add_argument("--attention", choices=("explicit", "flash"), help="for the step points' bytes")
    r.add_argument("--ceilings", help="JSON from python -m benchmarks.ceilings")
    r.add_argument("--kernels", action="append", metavar="LABEL=CSV",
                   help="profiler kernel table (repeatable), e.g. v1=profiles/v1/kernels.csv")
    r.add_argument("--measure-ops", action="store_true", help="time every op alone on --device")
    r.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    r.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    r.add_argument("--name", default="roofline.png", help="plot file name")
    r.set_defaults(func=cmd_roofline)

    hr = sub.add_parser("headroom", help="step time against the sum of the ops' rooflines")
    hr.add_argument("results", nargs="+", help="results JSON files or folders, or benchmarks/compare_versions.py JSON files")
    hr.add_argument("--ceilings", help="JSON from python -m benchmarks.ceilings (default: the one "
                                       "measured on the runs' device under results/analysis)")
    hr.set_defaults(func=cmd_headroom)

    m = sub.add_parser("memory", help="memory model vs measured")
    m.add_argument("results", nargs="*", help="results JSONs to check the model against")
    m.add_argument("--preset", default="small", help="config to predict when no results are given")
    m.add_argument("--version", choices=tuple(VERSIONS), default="v1")
    m.add_argument("--batch-size", type=_positive)
    m.add_argument("--seq-len", type=_positive)
    m.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16")
    m.add_argument("--grad-checkpoint", action="store_true")
    m.add_argument("--switch", action="append", default=[], metavar="NAME",
                   help="a switch of --version as its flag without the dashes, e.g. "
                        "recompute-norm or no-triton-swiglu (repeat for more)")
    m.add_argument("--optimizer", choices=("default", "foreach", "fused"),
                   default="default", help="the run's --optimizer")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cuda",
                   help="device to predict for (and to --trace on)")
    m.add_argument("--trace", action="store_true",
                   help="also run two real steps and track live tensors (slow on CPU); "
                        "with results: on the device each ran on")
    m.add_argument("--json", help="with results: also write the comparison table as JSON here")
    m.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    m.set_defaults(func=cmd_memory)

    s = sub.add_parser("sweep", help="run a version over a grid")
    s.add_argument("--version", default="v1", help="v1..v4 or a script path")
    s.add_argument("--preset", help="default: tiny on CPU, small/medium on GPU")
    s.add_argument("--batch-sizes", help="e.g. 4,8,16 (default: half, preset, double)")
    s.add_argument("--seq-lens", help="e.g. 128,256 (default: the preset's)")
    s.add_argument("--precisions", help="e.g. fp32,bf16 (default: the device default)")
    s.add_argument("--grad-checkpoint", default="off", help="off, on or off,on")
    s.add_argument("--compile", default="off", help="off, on or off,on")
    s.add_argument("--num-steps", type=_positive, default=20)
    s.add_argument("--warmup-steps", type=_non_negative, default=5)
    s.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    s.add_argument("extra", nargs="*", help="more flags for every run, after --")
    s.set_defaults(func=cmd_sweep)

    h = sub.add_parser("report", help="HTML report + Markdown summary")
    h.add_argument("results", nargs="+", help="results folders or files")
    h.add_argument("--out-dir", default=str(out_dir_default()), help=out_help)
    h.add_argument("--ceilings", help="JSON from python -m benchmarks.ceilings")
    h.add_argument("--kernels", action="append", metavar="LABEL=CSV")
    h.add_argument("--title", default="Tiny LLaMA workshop: results")
    h.set_defaults(func=cmd_report)

    g = sub.add_parser("regress", help="compare with a baseline; exit 1 on regression")
    g.add_argument("results", nargs="+", help="new results JSONs or folders")
    g.add_argument("--baseline", required=True,
                   help="baseline results JSON or folder; make one from results you trust: "
                        "mkdir -p results/baseline && cp results/workshop/*.json results/baseline/")
    g.add_argument("--tolerance", help="e.g. throughput=0.05,memory=0.10,loss=0.02 (fractions)")
    g.set_defaults(func=cmd_regress)

    d = sub.add_parser("scaling", help="scaling efficiency of data-parallel runs vs 1 GPU")
    d.add_argument("single", help="results JSON of the 1-GPU run")
    d.add_argument("multi", nargs="+", help="results JSONs of torchrun runs (same per-GPU batch)")
    d.add_argument("--json", help="also write the comparison here")
    d.set_defaults(func=cmd_scaling)

    o = sub.add_parser("overlap", help="communication/compute overlap in profiler traces")
    o.add_argument("traces", nargs="+", help="*.pt.trace.json[.gz] written by --profile pytorch, "
                                             "one per rank")
    o.add_argument("--json", help="also write the rows here (with when and at which commit)")
    o.set_defaults(func=cmd_overlap)
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(_attach_list_values(list(sys.argv[1:] if argv is None else argv)))
        return args.func(args)
    except (AnalysisError, WorkshopError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
