"""Analysis tools of the tiny-LLaMA workshop: compare runs, read ceilings,
draw rooflines, model memory, sweep settings, write reports, catch regressions,
measure data-parallel scaling.

Command line: `python -m analysis_tools <command> --help`. In a notebook:

    from analysis_tools import compare_runs, draw_roofline, predict_memory
    out = compare_runs(["results/workshop"], out_dir="plots")
    out["table"]          # a pandas DataFrame

Names are imported on first use, so comparing or checking regressions does
not pay for importing torch.
"""
import importlib

_EXPORTS = {
    "AnalysisError": "common", "load_results": "common",
    "compare_runs": "compare", "suspicious": "compare",
    "load_ceilings": "ceilings",
    "draw_roofline": "roofline", "training_ops": "ops", "measure_ops": "opbench",
    "headroom": "headroom",
    "predict_memory": ("memory", "predict"), "predict_for_result": "memory",
    "memory_for_results": "memory", "trace_step": "memory",
    "sweep_grid": ("sweep", "grid"), "run_sweep": "sweep", "plot_sweep": "sweep",
    "build_report": "report", "check_regressions": "regress",
    "format_scaling": "scaling", "communication_overlap": "scaling",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'analysis_tools' has no attribute {name!r}")
    module, attr = _EXPORTS[name] if isinstance(_EXPORTS[name], tuple) else (_EXPORTS[name], name)
    return getattr(importlib.import_module(f".{module}", __name__), attr)
