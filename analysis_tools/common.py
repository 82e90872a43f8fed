"""Shared bits of the analysis commands: loading results, labels, plotting setup."""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on headless servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.config import ModelConfig  # noqa: E402
from harness.results import (SchemaError, load, measured_on_gpu_allocator,  # noqa: E402, F401
                             numbers, peak_memory_mb)  # (re-exported: the analysis tools' readers)


REPO = Path(__file__).resolve().parents[1]


class AnalysisError(ValueError):
    """Bad input for an analysis command: reported as one line, exit code 2."""


def result_paths(paths) -> list[Path]:
    """Expand folders into the results JSONs they contain (sorted, non-recursive)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.glob("*.json") if not q.name.startswith("."))
            if not found:
                raise AnalysisError(f"{p}: no results JSON files in this folder")
            out += found
        else:
            out.append(p)
    if not out:
        raise AnalysisError("no results given")
    return out


def load_results(paths) -> list[dict]:
    """Load and validate results; a bad file raises AnalysisError with one line."""
    loaded = []
    for path in result_paths(paths):
        try:
            result = load(path)
        except SchemaError as e:
            raise AnalysisError(str(e)) from None
        result["_path"] = str(path)
        loaded.append(result)
    return loaded


def model_config(result: dict) -> ModelConfig:
    return ModelConfig(**result["config"])


def run_label(result: dict) -> str:
    """Short name of a run for tables and legends: 'v1 medium bf16 +compile'
    ('+reduce-overhead' or '+max-autotune' for those torch.compile modes; '+master' or
    '+fused' for an optimizer other than torch's default AdamW)."""
    run = result["run"]
    compiled = run.get("compile_mode") if run.get("compile_mode") not in (None, "default") else "compile"
    optimizer = run.get("optimizer") or "default"
    extras = [flag for flag, on in ((compiled, run.get("compile")),
                                    ("ckpt", run.get("grad_checkpoint")),
                                    (optimizer, optimizer != "default")) if on]
    size = run.get("preset") or f"b{run['batch_size']}xT{run['seq_len']}"
    n = run.get("world_size", 1)
    parallel = [f"{(result.get('distributed') or {}).get('kind', 'ddp')}x{n}"] if n > 1 else []
    return " ".join([result["version"], size, run["precision"], *(f"+{e}" for e in extras), *parallel])


def unique_labels(results: list[dict]) -> list[str]:
    """run_label, made unique with the file name (or a number) where runs share one."""
    labels = [run_label(r) for r in results]
    counts = {label: labels.count(label) for label in labels}
    out = []
    for i, (label, r) in enumerate(zip(labels, results)):
        if counts[label] > 1:
            label += f" ({Path(r['_path']).stem})" if "_path" in r else f" #{i + 1}"
        out.append(label)
    return out


def memory_kind(result: dict) -> str:
    return "allocated (GPU)" if measured_on_gpu_allocator(result) else "process RSS (CPU)"


def memory_column(results: list[dict]) -> str:
    """The table's peak-memory column: 'peak RSS MB' where every run measured the whole
    process (a CPU run), 'peak MB' (the allocator's peak) otherwise."""
    return "peak RSS MB" if not any(map(measured_on_gpu_allocator, results)) else "peak MB"


# V3 writes this into the warnings of a run whose Triton kernels ran in Triton's CPU
# interpreter: a correctness demo, seconds a step, whose speed measures nothing.
INTERPRETER_MARK = "TRITON_INTERPRET=1"


def interpreted(result: dict) -> bool:
    return any(INTERPRETER_MARK in w for w in result.get("warnings", []))


def save_figure(fig, out_dir, name: str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # legends placed beside the axes stay whole
    plt.close(fig)
    return path


def formatted(df: pd.DataFrame, floatfmt: dict | None = None) -> pd.DataFrame:
    """The table as strings: floats with per-column formats ('.4g' by default), n/a for missing."""
    floatfmt = floatfmt or {}

    def cell(col, value):
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return "n/a"
        return format(value, floatfmt.get(col, ".4g")) if isinstance(value, float) else str(value)

    return pd.DataFrame({col: [cell(col, v) for v in df[col]] for col in df.columns}, index=df.index)


def markdown_table(df: pd.DataFrame, floatfmt: dict | None = None) -> str:
    """A GitHub Markdown table (pandas' to_markdown needs the optional tabulate)."""
    cells = formatted(df, floatfmt)
    lines = ["| " + " | ".join(map(str, df.columns)) + " |",
             "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(v.replace("|", "\\|") for v in row) + " |"
              for row in cells.itertuples(index=False)]
    return "\n".join(lines)


def text_table(df: pd.DataFrame, floatfmt: dict | None = None) -> str:
    """Plain text for the terminal, with the same number formats as the Markdown."""
    return formatted(df, floatfmt).to_string(index=False)


def parse_kv_list(text: str, what: str) -> dict[str, float]:
    """'throughput=0.05,memory=0.1' -> {'throughput': 0.05, 'memory': 0.1}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise AnalysisError(f"{what}: expected NAME=NUMBER, got {part!r}") from None
        if not sep:
            raise AnalysisError(f"{what}: expected NAME=NUMBER, got {part!r}")
    return out


def out_dir_default() -> Path:
    """results/analysis of this repository (ANALYSIS_OUT to change): the same folder
    whichever folder a command or a notebook runs in, so the ceilings measured once
    are found from everywhere."""
    return Path(os.environ.get("ANALYSIS_OUT", REPO / "results" / "analysis"))
