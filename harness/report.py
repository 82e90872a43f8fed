"""A plain-text results table (no dependencies beyond the standard library)."""
from __future__ import annotations


def _fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def table_rows(results: list[dict]) -> list[dict]:
    """One row per run; speed-up is relative to the first v1 run (if any)."""
    base = next((r for r in results if r["version"] == "v1"), None)
    base_tps = base["throughput"]["tokens_per_s"] if base else None
    rows = []
    for r in results:
        t, mem = r["timing_ms"], r["memory"]
        tps = r["throughput"]["tokens_per_s"]
        rows.append({
            "version": r["version"] + (" (compiled)" if r["run"].get("compile") else ""),
            "precision": r["run"]["precision"],
            "tokens/s": tps,
            "speedup": tps / base_tps if base_tps and tps else None,
            "step ms": t["step"]["median"], "fwd ms": t["forward"]["median"],
            "bwd ms": t["backward"]["median"], "opt ms": t["optimizer"]["median"],
            "MFU %": r["mfu"]["value"] * 100 if r["mfu"]["value"] is not None else None,
            "peak MB": mem.get("peak_allocated_mb", mem.get("peak_rss_mb")),
            "final loss": r["losses"][-1] if r["losses"] else None,
        })
    return rows


FORMATS = {"tokens/s": ",.0f", "speedup": ".2f", "step ms": ".2f", "fwd ms": ".2f",
           "bwd ms": ".2f", "opt ms": ".2f", "MFU %": ".1f", "peak MB": ",.0f", "final loss": ".4f"}


def format_table(results: list[dict]) -> str:
    rows = table_rows(results)
    headers = list(rows[0])
    cells = [[_fmt(row[h], FORMATS[h]) if h in FORMATS else str(row[h]) for h in headers]
             for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))  # noqa: E731
    device = results[0]["device"]
    out = [f"device: {device['name']} ({device['backend']}), torch {device['torch']}",
           line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    for r in results:
        out += [f"WARNING {r['version']}: {w}" for w in r.get("warnings", [])]
    return "\n".join(out)
