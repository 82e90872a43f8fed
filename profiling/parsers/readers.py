"""Small reading helpers shared by the parsers.

Profiler CSVs are not always clean CSV: Nsight tools print log lines before
the header, ncu writes numbers with thousands separators ("1,942,288,704.58"),
and rocprofv3 changed its columns four times. So we find the header by
content, read rows as dictionaries, and look columns up by name.
"""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

from .kernel_table import ProfileParseError


def read_text(path) -> str:
    path = Path(path)
    if not path.is_file():
        raise ProfileParseError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def number(text) -> float | None:
    """'1,942,288.5' -> 1942288.5; '', 'n/a', '-' -> None."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    cleaned = text.strip().replace(",", "")
    if cleaned in ("", "n/a", "N/A", "-", "--", "nan"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


def csv_records(path, header_test=None) -> tuple[list[str], list[list[str]]]:
    """Header and data rows of a CSV, skipping any lines before the header.

    header_test(line) -> bool picks the header line; by default the first line.
    """
    lines = read_text(path).splitlines()
    start = 0
    if header_test is not None:
        for start, line in enumerate(lines):
            if header_test(line):
                break
        else:
            raise ProfileParseError(f"{path}: no header line found")
    rows = list(csv.reader(lines[start:]))
    if not rows:
        raise ProfileParseError(f"{path}: empty file")
    return rows[0], [r for r in rows[1:] if r]


def dict_records(path, required=(), header_test=None, what="file") -> list[dict]:
    header, rows = csv_records(path, header_test)
    missing = [c for c in required if c not in header]
    if missing:
        raise ProfileParseError(f"{path}: not a {what} (missing columns {', '.join(missing)})")
    return [dict(zip(header, r)) for r in rows]
