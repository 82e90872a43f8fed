"""Measurements that must measure what they say: one timer for every benchmark, the SDPA
sweep's device time, the SDPA label of the kernel benchmark, the matmul ceiling,
and comparisons of runs with different optimizers. CPU tests; their GPU
counterparts are in test_gpu_parity.py."""
import copy
import importlib

import pytest
import torch

from conftest import REPO, load_version, run_cli
from harness import ModelConfig, probes


def compare_versions():
    return importlib.import_module("benchmarks.compare_versions")


# ---- peak memory: each run's own: test_parity_v2_v4.py::test_compare_versions_runs_on_cpu
# ---- one timer ---------------------------------------------------------------------------
def test_every_benchmark_times_with_the_one_timer():
    """Device events, graph replays and host clocks are read in harness/measure.py (and the
    step clock of harness/device.py) only: every benchmark times the same way."""
    import re
    from conftest import REPO
    timing = re.compile(r"cuda\.Event\(|do_bench\(|capture_graph\(|elapsed_time\(|perf_counter\(\)")
    allowed = {"harness/measure.py", "harness/device.py",
               "benchmarks/compare_versions.py"}  # its perf_counter: a run's wall time, not a benchmark
    offenders = []
    for folder in ("benchmarks", "training", "analysis_tools", "harness", "version3_triton", "profiling"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel not in allowed and timing.search(path.read_text()):
                offenders.append(rel)
    assert not offenders


# ---- the SDPA sweep times the device, not the host ---------------------------------------
def test_sdpa_sweep_times_many_calls_between_two_events(monkeypatch):
    from harness import device as devices

    v4 = load_version("v4")
    calls, syncs = [0], [0]
    sdpa, synchronize = v4.causal_sdpa, devices.synchronize

    def counted_sdpa(*args, **kwargs):
        calls[0] += 1
        return sdpa(*args, **kwargs)

    def counted_sync(device):
        syncs[0] += 1
        synchronize(device)

    monkeypatch.setattr(v4, "causal_sdpa", counted_sdpa)
    monkeypatch.setattr(devices, "synchronize", counted_sync)
    cfg = ModelConfig(vocab_size=64, hidden_dim=64, num_layers=1, num_heads=4, num_kv_heads=2,
                      max_seq_len=32)
    rows = compare_versions().sdpa_sweep(cfg, 2, 16, torch.device("cpu"), torch.float32, calls=10)
    timed = [r for r in rows if "error" not in r]
    assert {r["backend"] for r in timed} >= {"auto", "math"}
    assert all(r["fwd_bwd_ms"] > 0 and r["timing"] == "back-to-back" for r in timed)
    assert calls[0] >= 10 * syncs[0], (calls, syncs)  # not one synchronise per call


# ---- the kernel benchmark's SDPA label ---------------------------------------------------
def test_paired_graph_ratio_cancels_a_drifting_clock(monkeypatch):
    """Each round replays fn, other, other, fn: a GPU that slows by 2% a replay (its clock
    falling with its heat) still gives the true ratio, 1.25, where timing one graph and then
    the other would read the drift into it. A failed capture says why."""
    from harness import measure

    made, clock = [], {"scale": 1.0}

    def capture(fn, calls, warmup_calls=1):
        made.append(fn)
        return fn

    def median(device, work, warmup=3, repeats=10, **_):
        clock["scale"] += 0.02
        return work() * clock["scale"]

    monkeypatch.setattr(measure, "capture_graph", capture)
    monkeypatch.setattr(measure, "median_ms", median)
    ratio, middle, why = measure.paired_graph_ratio(lambda: 4.0, lambda: 5.0, calls=3)
    assert why is None and len(made) == 2
    assert ratio == pytest.approx(1.25) and middle == pytest.approx([1.25, 1.25])

    def broken(fn, calls, warmup_calls=1):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(measure, "capture_graph", broken)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    assert measure.paired_graph_ratio(lambda: 1, lambda: 1, calls=3) == (
        None, None, "RuntimeError: operation not permitted when stream is capturing")


def test_bench_kernels_probes_sdpa_in_the_benchmarks_precision(monkeypatch):
    load_version("v4")
    probe = importlib.import_module("version4_sdpa.sdpa_probe")
    bench = importlib.import_module("benchmarks.bench_kernels")
    seen = []
    monkeypatch.setattr(probe, "probe_sdpa_kernel",
                        lambda build, cfg, b, n, device, precision, *a, **k:
                        seen.append(precision) or "flash")
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        assert bench.sdpa_kernel_name((2, 4, 4, 16, 16), dtype, torch.device("cpu")) == "flash"
        assert seen[-1] == name
    monkeypatch.undo()  # the real probe, whose failure the benchmark would show only as "?"
    assert bench.sdpa_kernel_name((2, 4, 2, 16, 16), torch.float32, torch.device("cpu")) != "?"


# ---- the matmul ceiling ------------------------------------------------------------------
def test_matmul_probe_reports_the_best_median_of_several_shapes(monkeypatch):
    shapes = ((64, 64, 64), (128, 64, 32), (32, 64, 128))
    monkeypatch.setitem(probes.MATMUL_SHAPES, "cpu", shapes)
    medians = iter([2.0, 1.0, 4.0])  # ms, one per shape
    monkeypatch.setattr(probes, "median_ms", lambda *a, **k: next(medians))
    probe = probes.matmul_probe("cpu", "fp32")
    flop = 2 * 64 * 64 * 64
    assert probe["shapes"] == pytest.approx({"64x64x64": flop / 2e9, "128x64x32": flop / 1e9,
                                             "32x64x128": flop / 4e9})
    assert probe["tflops"] == pytest.approx(flop / 1e9)


def _rows_for_ceiling_target(achieved_v4: float) -> list[dict]:
    def row(version, mode, tps, achieved):
        return {"version": version, "mode": mode, "exit_code": 0, "tokens_per_s": tps,
                "achieved_tflops": achieved, "mfu_datasheet": achieved / 989}

    return [row("v1", "eager", 100.0, 100.0), row("v4", "compile", 400.0, achieved_v4)]


@pytest.mark.parametrize("spread, judged", [(1.0, True), (3.5, False), (None, False)])
def test_ceiling_target_is_judged_only_on_a_stable_probe(spread, judged):
    summary = compare_versions().Summary(_rows_for_ceiling_target(500.0), 800.0, spread)
    (target,) = [t for t in summary.targets("medium") if "ceiling" in t["target"]]
    assert target["value"] == pytest.approx(500 / 800)
    assert target["mfu_datasheet"] == pytest.approx(500 / 989)  # shown beside it
    assert (target["met"] is True) if judged else (target["met"] is None and "not judged" in target["note"])


# ---- comparisons label different optimizers -------------------------------------------------
@pytest.mark.slow
def test_compare_labels_runs_with_different_optimizers(tmp_path):
    """An optimizer is part of a row's mode (master weights in the best mode): a labelled
    column and a note, never a reason not to quote the table."""
    from analysis_tools.compare import compare_runs
    from harness.results import load

    out = tmp_path / "v1.json"
    proc = run_cli([REPO / "version1_baseline/tiny_llama_v1.py", "--preset", "tiny", "--device", "cpu",
                    "--num-steps", "2", "--warmup-steps", "1", "--quiet", "--output", out])
    assert proc.returncode == 0, proc.stderr
    a = load(out)
    b = copy.deepcopy(a)
    b["run"]["optimizer"] = "fused"
    same = compare_runs([a, copy.deepcopy(a)], plots=False)
    assert "optimizer" not in same["table"] and not any("optimizer" in n for n in same["notes"])
    mixed = compare_runs([a, b], plots=False)
    assert not any("optimizer" in f for f in mixed["flags"])
    assert list(mixed["table"]["optimizer"]) == ["default", "fused"]
    assert list(mixed["table"]["run"]) == ["v1 tiny fp32", "v1 tiny fp32 +fused"]
    assert any("optimizers differ (default, fused)" in n for n in mixed["notes"])


# ---- the host's side of an eager GPU step (harness/training_step.py) ----------------------
@pytest.mark.parametrize("device, world_size, compiled", [
    ("cpu", 1, False), ("cuda", 2, False), ("cuda", 1, True)])
def test_host_settings_leave_other_runs_as_they_are(device, world_size, compiled):
    """CPU, DDP/FSDP and compiled runs keep the autograd worker threads and the collector."""
    from harness.training_step import host_settings
    with host_settings(torch.device(device), world_size, compiled):
        assert torch._C._is_multithreading_enabled()
        assert __import__("gc").isenabled()


def test_eager_gpu_steps_run_backward_here_and_collect_at_fixed_steps(monkeypatch):
    """One GPU, eager: the backward on the calling thread, the collector only at every
    GC_EVERY_STEPS-th step; both come back as they were, also after an error."""
    import gc
    from harness import training_step
    collected = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation))
    with pytest.raises(KeyError):
        with training_step.host_settings(torch.device("cuda"), 1, False):
            assert not torch._C._is_multithreading_enabled() and not gc.isenabled()
            for step in range(2 * training_step.GC_EVERY_STEPS):
                training_step.step_collect(step)
            raise KeyError("a failing step")
    assert collected == [2, 1, 1]  # once before the loop, then every GC_EVERY_STEPS steps
    assert torch._C._is_multithreading_enabled() and gc.isenabled()
    training_step.step_collect(training_step.GC_EVERY_STEPS - 1)  # collector on: nothing
    assert collected == [2, 1, 1]


def test_losses_are_read_behind_the_gpu_queue_and_checked_when_they_arrive(monkeypatch):
    """One GPU: a request copies the losses so far behind the queued work and returns; they
    are checked and reported when their copy has arrived (or when the run waits for them),
    so the loop never empties the GPU's queue to read a loss. A NaN stops the run when it
    arrives, naming its step. Several ranks (or a CPU) read at once."""
    from harness.errors import NonFiniteLoss
    from training.trainer import LossReader

    class Event:  # the copy's event: done when the test says so
        done = False

        def record(self):
            pass

        def query(self):
            return Event.done

        def synchronize(self):
            Event.done = True

    monkeypatch.setattr(torch.cuda, "Event", Event)
    reported = []
    reader = LossReader(torch.device("cuda"), lambda v: v, 4, reported.append)
    for step, loss in enumerate([2.0, 1.5, float("nan")]):
        reader.add(torch.tensor(loss))
    reader.request(1)
    reader.collect()
    assert reported == [] and reader.losses == []  # still on its way: the loop goes on
    Event.done = True
    reader.collect()
    assert reported == [1] and reader.losses == [2.0, 1.5]
    Event.done = False
    reader.request(2)
    with pytest.raises(NonFiniteLoss, match="at step 3/4"):
        reader.collect(wait=True)

    reported.clear()
    at_once = LossReader(torch.device("cuda"), lambda v: v, 4, reported.append, behind=False)
    at_once.add(torch.tensor(3.0))
    at_once.request(0)
    assert reported == [0] and at_once.losses == [3.0]
