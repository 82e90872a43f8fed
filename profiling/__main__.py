"""python -m profiling: parse profiler outputs into the common kernel table.

    python -m profiling parse profiles/v1/rocprofv3 -o profiles/v1/rocprofv3/kernel_table.csv
    python -m profiling parse profiles/v1/ncu/v1_small.csv --top 20
    python -m profiling compare v1=profiles/v1/pytorch v3=profiles/v3/pytorch
    python -m profiling roofline workloads/v1/MI300X_A1/roofline.csv

Exit codes: 0 success, 2 unreadable input (one line on stderr).
"""
from __future__ import annotations

import argparse
import sys

from .parsers import PARSERS, parse, rocprof_compute
from pathlib import Path

from .parsers.kernel_table import ProfileParseError, format_comparison, format_table, write_csv


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    ps = sub.add_parser("parse", help="print (and save) the kernel table of a profiler output")
    ps.add_argument("path", help="a profiler output file or the folder a wrapper wrote")
    ps.add_argument("--tool", choices=sorted(PARSERS), help="default: detected from the files")
    ps.add_argument("-o", "--output", help="write the table as CSV here")
    ps.add_argument("--top", type=int, default=15, help="kernels to print")
    ps.add_argument("--quiet", action="store_true", help="print nothing, only write -o")
    pc = sub.add_parser("compare", help="kernel tables side by side: time per category")
    pc.add_argument("tables", nargs="+", metavar="[LABEL=]PATH",
                    help="profiler outputs or kernel_table.csv files (label: the file's folder)")
    pr = sub.add_parser("roofline", help="print the measured ceilings in a rocprof-compute roofline.csv")
    pr.add_argument("path")
    args = p.parse_args(argv)
    try:
        if args.command == "roofline":
            for device, metrics in rocprof_compute.read_roofline(args.path).items():
                print(f"device {device}: {rocprof_compute.describe_ceilings(metrics)}")
            return 0
        if args.command == "compare":
            tables = {}
            for item in args.tables:
                label, sep, path = item.partition("=")
                if not sep:
                    label, path = Path(item).parent.name if item.endswith(".csv") else Path(item).name, item
                tables[label] = parse(path)
            print(format_comparison(tables))
            return 0
        table = parse(args.path, args.tool)
        if args.output:
            write_csv(table, args.output)
        if not args.quiet:
            print(format_table(table, top=args.top))
            if args.output:
                print(f"kernel table: {args.output}")
        return 0
    except ProfileParseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
