"""How the published numbers are written: number and percent formats, Markdown tables,
the names of versions and modes, and the look-ups of a comparison's rows. Shared by
tools/publish.py (the blocks it fills) and tools/results_text.py (the results page)."""
from __future__ import annotations

from harness.results import SLOW_HOST, SLOW_SPELL, spell_between_probes

PLACEHOLDER = ("*Not yet measured on this GPU model: run `bash benchmarks/reproduce.sh` on it, "
               "then `python tools/publish.py results/reproduce/<gpu>`.*")
MODE_NAMES = {"eager": "eager", "compile": "compiled", "reduce-overhead": "compiled + graphs",
              "reduce-overhead-master": "compiled + graphs + master weights",
              "compile-master": "compiled + master weights", "max-autotune": "compiled, max-autotune"}
VERSION_NAMES = {"v1": "V1 baseline", "v2": "V2 fused", "v3": "V3 Triton", "v4": "V4 SDPA",
                 "hf": "HF LlamaForCausalLM (peer)"}


def num(value, spec: str = ",.0f", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def pct(value) -> str:
    return num(value, ".1f", 100) + ("%" if value is not None else "")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def compare_caption(s: dict, preset: str) -> str:
    c = s["compare"].get(preset)
    if not c:
        return ""
    cfg = c["config"]
    return (f"{c['preset'].capitalize()} preset (hidden {cfg['hidden_dim']}, {cfg['num_layers']} layers, "
            f"{cfg['num_heads']} heads, batch {c['batch_size']} x seq {c['seq_len']}), {c['precision']}: "
            + (f"median of {c['repeats']} interleaved repeats of {c['num_steps'] - c['warmup_steps']} timed "
               f"steps each;" if c["repeats"] > 1 else
               f"one interleaved run, median of {c['num_steps'] - c['warmup_steps']} timed steps;")
            + f" measured matmul ceiling {num(c['ceiling_tflops'], '.0f')} TFLOP/s, datasheet "
            f"peak {num(c['datasheet_tflops'], '.0f')} TFLOP/s. Command: `{c['command']}`."
            + _slow_hosts(c.get("slow_hosts") or []))


def _slow_hosts(slow: list[dict]) -> str:
    """The caption's sentence on processes whose host ran slow (compare_versions.slow_hosts)."""
    if not slow:
        return ""
    def how(s: dict) -> str:
        return (f"median step {s['steps_x']:.2f}x its fastest tenth" if spell_between_probes(s)
                else f"{s['pace_x']:.2f}x")
    named = [f"{VERSION_NAMES.get(s['version'], s['version'])} {MODE_NAMES.get(s['mode'], s['mode'])} "
             f"(repeat {s['repeat'] + 1}, {how(s)})" for s in slow]
    spells = (f", or whose median step took more than {SLOW_SPELL:g}x their fastest tenth (a slow spell "
              "between the probes)" if any(map(spell_between_probes, slow)) else "")
    return (" Processes whose host ran its Python (harness.measure.host_pace_us) more than "
            f"{SLOW_HOST:g}x slower than the comparison's fastest{spells} (harness.results.host_slowdowns) "
            f"ran slow, out of their row's median where it has a process at pace: {', '.join(named)}.")


def speed(s: dict, preset: str, version: str, mode: str):
    for r in s["compare"].get(preset, {}).get("rows", []):
        if (r["version"], r["mode"]) == (version, mode):
            return r
    return {}


def best(s: dict, preset: str, version: str) -> dict:
    rows = [r for r in s["compare"].get(preset, {}).get("rows", []) if r["version"] == version and r["tokens_per_s"]]
    return max(rows, key=lambda r: r["tokens_per_s"], default={})


def ratio(a: dict, b: dict) -> str:
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if a.get("tokens_per_s") and b.get("tokens_per_s") else "-"
