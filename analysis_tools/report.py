"""report: one self-contained HTML page (plots embedded as base64 PNG, no
server, no internet) and a Markdown summary, from a folder of results.

It strings the other commands together: compare (table, flags, four plots),
memory model vs measured, roofline (with ceilings and kernel tables when
given), and a sweep's table and plots when the folder holds a sweep.csv.
"""
from __future__ import annotations

import base64
import datetime as dt
import html
import sys
from pathlib import Path

import pandas as pd

from .common import formatted, load_results, markdown_table
from .compare import FLOAT_FORMATS, compare_runs
from .memory import memory_for_results
from .roofline import category_summary, draw_roofline

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f0f0f0}td:first-child{text-align:left}img{max-width:100%;margin:.5em 0}
.flags{background:#fff0f0;border:2px solid #c00;padding:.5em 1em}.flags li{color:#900}
code{background:#f4f4f4;padding:1px 4px}"""


def _img(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(Path(path).stem)}" src="data:image/png;base64,{data}">'


def _html_table(df: pd.DataFrame, formats: dict | None = None) -> str:
    return formatted(df, formats).to_html(index=False, escape=True, border=0)


def build_report(paths, out_dir, ceilings_path=None, kernel_tables: dict | None = None,
                 title: str = "Tiny LLaMA workshop: results") -> dict:
    out_dir = Path(out_dir)
    paths = [Path(p) for p in paths]
    # A folder with a sweep.csv (given, or inside a given folder) is a sweep, not runs.
    sweeps = [p for p in paths if (p / "sweep.csv").exists()]
    sweeps += [q.parent for p in paths if p.is_dir() for q in sorted(p.glob("*/sweep.csv"))]
    results = load_results([p for p in paths if p not in sweeps])
    comp = compare_runs(results, out_dir)
    mem = memory_for_results(results, out_dir)
    roof = draw_roofline(results, ceilings_path=ceilings_path, kernel_tables=kernel_tables,
                                 out_dir=out_dir)
    device = results[0]["device"]
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m analysis_tools " + " ".join(sys.argv[1:]) if sys.argv[1:] else "build_report(...)"
    mem_formats = {"predicted MiB": ",.0f", "measured MiB": ",.0f", "error %": "+.1f"}

    # ---- Markdown
    md = [f"# {title}", "",
          f"Device: **{device['name']}** ({device['backend']}), torch {device['torch']}; "
          f"report made {created} with `{command}`.", "",
          "## Runs", "", markdown_table(comp["table"], FLOAT_FORMATS), ""]
    md += [f"Note: {n}" for n in comp["notes"]] + [""] * bool(comp["notes"])
    if comp["flags"]:
        md += ["**Suspicious results - check before quoting:**", ""]
        md += [f"- {f}" for f in comp["flags"]] + [""]
    md += [f"![{p.stem}]({p.name})" for p in comp["plots"]] + [""]
    md += ["## Memory: model vs measured", "", markdown_table(mem["table"], mem_formats), "",
           *(f"![{p.stem}]({p.name})" for p in mem["plots"]), "",
           "## Roofline", "", f"![roofline]({roof['plot'].name})", ""]
    md_path = out_dir / "summary.md"

    # ---- HTML
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Device: <b>{html.escape(device['name'])}</b> ({html.escape(device['backend'])}), "
             f"torch {html.escape(device['torch'])}. Made {created} with "
             f"<code>{html.escape(command)}</code>.</p>", "<h2>Runs</h2>",
             _html_table(comp["table"], FLOAT_FORMATS)]
    parts += [f"<p>Note: {html.escape(n)}</p>" for n in comp["notes"]]
    if comp["flags"]:
        parts.append("<div class='flags'><b>Suspicious results - check before quoting:</b><ul>"
                     + "".join(f"<li>{html.escape(f)}</li>" for f in comp["flags"]) + "</ul></div>")
    parts += [_img(p) for p in comp["plots"]]
    parts += ["<h2>Memory: model vs measured</h2>", _html_table(mem["table"], mem_formats),
              *(_img(p) for p in mem["plots"]), "<h2>Roofline</h2>", _img(roof["plot"])]
    if roof["kernels"] is not None:
        summary = category_summary(roof["kernels"])
        parts += ["<h3>Kernel time by category</h3>", _html_table(summary, {"time ms": ".3f", "share %": ".1f"})]
        md += ["", "## Kernel time by category", "", markdown_table(summary, {"time ms": ".3f", "share %": ".1f"})]
    for folder in sweeps:
        df = pd.read_csv(folder / "sweep.csv")
        parts += [f"<h2>Sweep: {html.escape(folder.name)}</h2>", _html_table(df.drop(columns=["results"]))]
        parts += [_img(p) for p in sorted(folder.glob("sweep_*.png"))]
        md += ["", f"## Sweep: {folder.name}", "", markdown_table(df.drop(columns=["results"]))]
    parts += ["<h2>Commands</h2><ul>"] + [f"<li><code>{html.escape(c)}</code></li>"
                                          for c in sorted({r["command"] for r in results})]
    parts.append("</ul></body></html>")
    md += ["", "## Commands", "", *(f"- `{c}`" for c in sorted({r["command"] for r in results}))]
    html_path = out_dir / "report.html"
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path.write_text("\n".join(parts))
    md_path.write_text("\n".join(md) + "\n")
    return {"html": html_path, "markdown": md_path, "flags": comp["flags"],
            "plots": [*comp["plots"], *mem["plots"], roof["plot"]]}
