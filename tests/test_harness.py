"""The shared harness: config, FLOP model, timing statistics, results, guards,
and the import structure (no version imported by the harness, no circle)."""
import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import REPO, load_version
from harness import flops, measure, results
from harness.config import (PRECISIONS, PRESETS, REFERENCE_VERSION, VERSIONS, ModelConfig,
                            llama_ffn_dim, reference_weights)
from harness.data import Batches
from harness.errors import GradientFlowError, UsageError


# ------------------------------------------------------------------ config
def test_presets_are_valid_and_documented_sizes():
    assert PRESETS["small"].model.hidden_dim == 512 and PRESETS["small"].model.num_layers == 8
    assert PRESETS["small"].seq_len == 128 and PRESETS["small"].batch_size == 8
    medium = PRESETS["medium"]
    assert (medium.model.hidden_dim, medium.model.num_layers, medium.model.num_heads) == (1024, 12, 16)
    assert (medium.seq_len, medium.batch_size) == (512, 16)
    for preset in PRESETS.values():
        assert preset.seq_len <= preset.model.max_seq_len


def test_modelconfig_has_exactly_the_agreed_fields():
    names = [f.name for f in ModelConfig.__dataclass_fields__.values()]
    assert names == ["vocab_size", "hidden_dim", "num_layers", "num_heads", "num_kv_heads",
                     "ffn_dim", "max_seq_len", "norm_eps", "rope_theta", "tie_embeddings"]


def test_llama_ffn_default():
    # LLaMA-7B rounds 8/3*4096 up to a multiple of 256 (11008); we round to 64
    # so that small models stay close to 8/3*hidden.
    assert llama_ffn_dim(4096, multiple_of=256) == 11008
    assert llama_ffn_dim(4096) == 10944
    assert ModelConfig(hidden_dim=1024, num_heads=16, num_kv_heads=16).ffn_dim == 2752
    assert ModelConfig(hidden_dim=64, ffn_dim=100).ffn_dim == 100


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_dim=100, num_heads=3), "divisible by num_heads"),
    (dict(num_heads=4, num_kv_heads=3), "divisible by num_kv_heads"),
    (dict(hidden_dim=12, num_heads=4, num_kv_heads=4), "head_dim 3 must be even"),
    (dict(vocab_size=0), "vocab_size must be > 0"),
    (dict(num_layers=-1), "num_layers must be > 0"),
    (dict(max_seq_len=0), "max_seq_len must be > 0"),
])
def test_config_validation(changes, message):
    with pytest.raises(UsageError, match=message):
        ModelConfig(**changes)


# ------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flop_model_matches_flop_counter_on_v1(tie, kv_heads):
    v1 = load_version("v1")
    cfg = ModelConfig(vocab_size=96, hidden_dim=64, num_layers=2, num_heads=4,
                      num_kv_heads=kv_heads, max_seq_len=32, tie_embeddings=tie)
    model = v1.build_model(cfg)
    batch, seq = 2, 24
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab_size), ids.view(-1)).backward()
    assert counter.get_total_flops() == flops.step_flops(cfg, batch, seq)
    assert sum(p.numel() for p in model.parameters()) == flops.total_params(cfg)


def test_attention_kernel_convention():
    cfg = ModelConfig(hidden_dim=64, num_heads=4, num_kv_heads=4, num_layers=1)
    full = flops.attention_kernel_flops(cfg, 2, 8, causal=False)
    causal = flops.attention_kernel_flops(cfg, 2, 8, causal=True)
    assert full["forward"] == 4 * 2 * 4 * 8 * 8 * 16
    assert causal["forward"] * 2 == full["forward"]
    assert causal["backward"] == int(2.5 * causal["forward"])
    # one call (the kernel table's rows) and a step's layers count alike
    assert flops.attention_flops(2, 4, 8, 16) == causal
    three = flops.attention_kernel_flops(cfg.replace(num_layers=3), 2, 8)
    assert (three["forward"], three["backward"]) == (3 * causal["forward"], 3 * causal["backward"])


def test_peak_lookup():
    assert flops.peak_for("NVIDIA H100 80GB HBM3", "sm_90", "bf16")["tflops"] == 989.4
    assert flops.peak_for("NVIDIA H100 PCIe", "sm_90", "bf16")["tflops"] == 756.0
    assert flops.peak_for("NVIDIA H200", "sm_90", "fp32")["tflops"] == 66.9
    assert flops.peak_for("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", "bf16")["tflops"] == 1307.4
    assert flops.peak_for("AMD Radeon Graphics", "gfx90a:sramecc+:xnack-", "fp16")["device_key"] == "MI250X"
    assert flops.peak_for("AMD Instinct MI50", "gfx906", "bf16")["tflops"] is None
    unknown = flops.peak_for("x86_64", None, "fp32")
    assert unknown["tflops"] is None and "no MFU" in unknown["source"]
    assert flops.peak_for("anything", None, "bf16", measured_tflops=700.0)["source"] == "measured"


# ------------------------------------------------------------------ timing stats
def test_summarize_percentiles():
    stats = measure.summarize([float(x) for x in range(1, 12)])  # 1..11
    assert stats["median"] == 6 and stats["n"] == 11
    assert math.isclose(stats["p10"], 2.0) and math.isclose(stats["p90"], 10.0)
    assert measure.summarize([])["median"] is None


def test_summarize_ignores_one_slow_outlier():
    stats = measure.summarize([10.0] * 9 + [1000.0])
    assert stats["median"] == 10.0 and stats["mean"] > 100


# ------------------------------------------------------------------ data
def test_targets_are_inputs_shifted_by_one():
    batches = Batches("text", 256, batch_size=3, seq_len=16, seed=0)
    inputs, targets = batches.next()
    assert inputs.shape == targets.shape == (3, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < 256


def test_data_streams_are_seeded():
    a, b = Batches("synthetic", 100, 2, 8, seed=3), Batches("synthetic", 100, 2, 8, seed=3)
    assert torch.equal(a.next()[0], b.next()[0])
    assert not torch.equal(a.next()[0], Batches("synthetic", 100, 2, 8, seed=4).next()[0])


def test_text_needs_byte_vocab():
    with pytest.raises(UsageError, match="vocab-size >= 256"):
        Batches("text", 100, 2, 8, seed=0)


# ------------------------------------------------------------------ results
def _minimal_result():
    stats = {"median": 1.0, "p10": 0.9, "p90": 1.1, "mean": 1.0, "n": 3}
    return {"schema_version": results.SCHEMA_VERSION, "version": "v1", "created": "now",
            "command": "python x", "git_commit": None, "config": {}, "run": {}, "options": {},
            "device": {}, "losses": [1.0], "throughput": {"tokens_per_s": 1000.0}, "flops": {}, "mfu": {}, "memory": {},
            "gradient_guard": {"passed": True}, "warnings": [],
            "timing_ms": {k: dict(stats) for k in results.TIMED_PHASES}}


def test_atomic_write_roundtrip_leaves_no_temp_files(tmp_path):
    path = results.write_atomic(tmp_path / "sub" / "r.json", _minimal_result())
    assert results.load(path)["version"] == "v1"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_invalid_result_is_never_written(tmp_path):
    bad = _minimal_result()
    del bad["timing_ms"]
    with pytest.raises(results.SchemaError, match="timing_ms"):
        results.write_atomic(tmp_path / "r.json", bad)
    assert list(tmp_path.iterdir()) == []


def test_load_reports_bad_files_in_one_line(tmp_path):
    (tmp_path / "corrupt.json").write_text("{not json")
    wrong = _minimal_result()
    wrong["schema_version"] = 99
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    for name, fragment in [("missing.json", "no such file"), ("corrupt.json", "not valid JSON"),
                           ("wrong.json", "schema_version 99")]:
        with pytest.raises(results.SchemaError, match=fragment) as info:
            results.load(tmp_path / name)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("field, value, message", [
    ("timing_ms.step.median", "fast", "timing_ms.step.median must be a number > 0 (got 'fast')"),
    ("throughput.tokens_per_s", -5, "throughput.tokens_per_s must be a number > 0 (got -5)"),
    ("timing_ms.forward.p90", -1.0, "timing_ms.forward.p90 must be a number >= 0"),
    ("memory.peak_rss_mb", "big", "memory.peak_rss_mb must be a number >= 0"),
    ("run.batch_size", 0, "run.batch_size must be a number > 0"),
    ("losses", [1.0, "x"], "losses[1] must be a number"),
    ("config", [], "config must be an object"),
])
def test_a_results_field_of_the_wrong_type_or_sign_is_refused_in_one_line(tmp_path, field, value,
                                                                           message):
    """Every reader (compare, regress, report) loads through results.load: a damaged field
    stops it there, naming the file and the field, instead of a traceback or '+593313%'."""
    from analysis_tools.common import AnalysisError, load_results

    bad = _minimal_result()
    *parents, last = field.split(".")
    target = bad
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(AnalysisError) as info:
        load_results([path])
    assert str(info.value).startswith(f"{path}: {message}") and "\n" not in str(info.value)


# ------------------------------------------------------------------ gradient guard
def test_gradient_guard_catches_a_detached_layer():
    v1 = load_version("v1")
    model = v1.build_model(ModelConfig())
    # Plant the bug of AMD's TinyTransformer workshop: the first block's output is detached, so
    # the embedding and block 0 get no gradient.
    first = model.layers[0]
    original = first.forward
    first.forward = lambda *a, **k: original(*a, **k).detach()
    ids = torch.randint(0, 256, (2, 8))
    model(ids).sum().backward()
    with pytest.raises(GradientFlowError, match="got no gradient") as info:
        measure.check_gradient_flow(model)
    assert "embed.weight" in str(info.value)


def test_gradient_guard_passes_on_healthy_model():
    v1 = load_version("v1")
    model = v1.build_model(ModelConfig())
    logits = model(torch.randint(0, 256, (2, 8)))
    torch.nn.functional.cross_entropy(logits.view(-1, 256), torch.randint(0, 256, (16,))).backward()
    assert measure.check_gradient_flow(model) == len(list(model.parameters()))


def test_nvtx_block_ranges_leave_outputs_unchanged(monkeypatch):
    # range_push returns the nesting depth (an int); a forward pre-hook that
    # returned it would replace the block's inputs. Simulate it on the CPU.
    from training.trainer import add_nvtx_ranges
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(name) or 1)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop") or 0)
    v1 = load_version("v1")
    model = v1.build_model(ModelConfig())
    ids = torch.randint(0, 256, (2, 8))
    expected = model(ids)
    add_nvtx_ranges(model)
    torch.testing.assert_close(model(ids), expected)
    assert calls[:2] == ["block0", "pop"] and len(calls) == 2 * len(model.layers)


def test_git_commit_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_GIT_COMMIT", "abc123")
    assert results.git_commit(tmp_path) == "abc123"  # tmp_path is no git checkout
    assert results.git_commit() == "abc123"  # also over a (possibly stale) .git
    monkeypatch.delenv("WORKSHOP_GIT_COMMIT")
    assert results.git_commit(tmp_path) is None


# ------------------------------------------------------------------ import structure
HARNESS = Path(__file__).resolve().parents[1] / "harness"
PROFILING = HARNESS.parent / "profiling"


def module_name(path: Path) -> str:
    """training/cli.py -> training.cli; profiling/parsers/__init__.py -> profiling.parsers."""
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path) -> list[str]:
    """Absolute names of the modules a harness or profiling file imports when it
    is imported (imports inside functions run only when called, so they are left out)."""
    found = []
    name = module_name(path)
    package = name if path.stem == "__init__" else name.rpartition(".")[0]

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # `from .. import x` climbs one package per extra dot
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(filter(None, [*anchor, node.module]))
                else:
                    base = node.module
                folder = HARNESS.parent.joinpath(*base.split("."))
                for alias in node.names:  # `from . import data` imports harness.data
                    submodule = ((folder / f"{alias.name}.py").exists()
                                 or (folder / alias.name / "__init__.py").exists())
                    found.append(f"{base}.{alias.name}" if submodule else base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []))  # module-level if/try/with blocks

    visit(ast.parse(path.read_text()).body)
    return found


def test_no_harness_module_imports_a_version_at_module_level():
    """The harness reaches a version only through the registry, at call time."""
    packages = {v.folder for v in VERSIONS.values()}
    for path in sorted(HARNESS.glob("*.py")):
        bad = [name for name in module_level_imports(path) if name.split(".")[0] in packages]
        assert not bad, f"{path.name} imports {bad} at module level"


def test_harness_and_profiling_modules_import_without_a_circle():
    """No harness or profiling module needs, at import time, one that needs it back;
    the harness imports profiling only inside the function that starts a session."""
    files = [*HARNESS.glob("*.py"), *PROFILING.rglob("*.py")]
    graph = {module_name(path): {m for m in module_level_imports(path)
                                 if m.startswith(("harness.", "profiling"))} for path in files}
    for name, imports in graph.items():
        assert not (name.startswith("harness") and any(m.startswith("profiling") for m in imports)), \
            f"{name} imports {sorted(imports)} at module level"

    def cycle_from(node, trail):
        if node in trail:
            return trail[trail.index(node):] + [node]
        for nxt in sorted(graph.get(node, ())):
            found = cycle_from(nxt, trail + [node])
            if found:
                return found
        return None

    for start in sorted(graph):
        circle = cycle_from(start, [])
        assert circle is None, " -> ".join(circle)


def test_every_harness_module_imports_in_a_fresh_interpreter():
    """Each module imports (in one new process) and loads no version package."""
    names = sorted(module_name(p) for p in [*HARNESS.glob("*.py"), *PROFILING.rglob("*.py")]
                   if p.stem not in ("__init__", "__main__"))
    packages = sorted(v.folder for v in VERSIONS.values())
    code = (f"import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=HARNESS.parent,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


# ------------------------------------------------------------------ shared facts
def test_precision_table_and_version_registry():
    assert list(PRECISIONS) == ["fp32", "tf32", "bf16", "fp16"]
    assert [PRECISIONS[p].dtype for p in PRECISIONS] == [torch.float32, torch.float32,
                                                         torch.bfloat16, torch.float16]
    assert [PRECISIONS[p].bytes for p in PRECISIONS] == [4, 4, 2, 2]
    assert [PRECISIONS[p].autocast_dtype for p in PRECISIONS] == [None, None, torch.bfloat16,
                                                                  torch.float16]
    repo = HARNESS.parent
    for name, version in VERSIONS.items():
        assert (repo / version.script).is_file(), name
        assert version.module.replace(".", "/") + ".py" == version.script
    assert REFERENCE_VERSION in VERSIONS


def test_reference_weights_are_v1s_initial_weights():
    cfg = ModelConfig()
    weights = reference_weights(cfg, seed=7)
    torch.manual_seed(7)
    expected = load_version("v1").build_model(cfg).state_dict()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


def test_git_commit_says_when_tracked_files_changed(tmp_path, monkeypatch):
    """A result measured on uncommitted code carries "-dirty" after the commit."""
    import subprocess

    monkeypatch.delenv("WORKSHOP_GIT_COMMIT", raising=False)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("add", "model.py")
    git("commit", "-qm", "one")
    clean = results.git_commit(tmp_path)
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert results.git_commit(tmp_path) == clean
    (tmp_path / "model.py").write_text("x = 2\n")
    assert results.git_commit(tmp_path) == clean + "-dirty"


def test_precision_lists_from_the_command_line():
    from harness.config import parse_precisions
    from harness.errors import UsageError

    assert parse_precisions(" bf16,fp32 ,") == ["bf16", "fp32"]
    for bad in ("bf8", "", ","):
        with pytest.raises(UsageError, match="precisions must be among"):
            parse_precisions(bad)


def test_one_reader_gives_a_records_peak_memory():
    """harness.results.peak_memory_mb: the allocator's peak on a GPU, RSS on a CPU; every
    table, plot and publisher reads it there."""
    from harness import results
    gpu = {"memory": {"peak_allocated_mb": 512.0, "peak_reserved_mb": 600.0}}
    cpu = {"memory": {"peak_rss_mb": 300.0}}
    assert results.peak_memory_mb(gpu) == 512.0 and results.measured_on_gpu_allocator(gpu)
    assert results.peak_memory_mb(cpu) == 300.0 and not results.measured_on_gpu_allocator(cpu)
    assert results.peak_memory_mb({"memory": {}}) is None


def test_one_reader_gives_a_records_numbers():
    """harness.results.numbers: tokens/s, step and phase ms, MFU, peak memory and final loss
    of one record, read there by every table, plot and publisher (no other file reaches into
    the record for them)."""
    from harness import results
    record = {"timing_ms": {p: {"median": float(i + 1), "p10": 1.0, "p90": 2.0}
                            for i, p in enumerate(results.TIMED_PHASES)},
              "throughput": {"tokens_per_s": 1000.0}, "mfu": {"value": 0.25},
              "flops": {"achieved_tflops": 12.5}, "memory": {"peak_rss_mb": 300.0}, "losses": [5.0, 4.0]}
    assert results.numbers(record) == {
        "tokens_per_s": 1000.0, "forward_ms": 1.0, "backward_ms": 2.0, "optimizer_ms": 3.0,
        "step_ms": 4.0, "mfu": 0.25, "achieved_tflops": 12.5, "peak_memory_mb": 300.0,
        "final_loss": 4.0, "p90_over_p10": 2.0}
    rebuilt = {"timing_ms": {"step": {"median": 4.0}}, "throughput": {"tokens_per_s": 9.0},
               "losses": [], "final_loss": 3.5}  # a comparison's row: only some numbers kept
    assert results.numbers(rebuilt)["final_loss"] == 3.5 and results.numbers(rebuilt)["mfu"] is None
    reads = re.compile(r'\["throughput"\]\["tokens_per_s"\]|\["timing_ms"\]\[|\["mfu"\]\["value"\]'
                       r'|\["losses"\]\[-1\]')
    readers = [f"{path.relative_to(REPO)}:{n}" for folder in ("analysis_tools", "benchmarks", "tools",
                                                             "training", "exercises", "harness")
               for path in sorted((REPO / folder).rglob("*.py")) if path.name != "results.py"
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if reads.search(line.split(" = ", 1)[-1])]  # what a line reads, not what it writes
    assert not readers, f"read the record through harness.results.numbers: {readers}"
