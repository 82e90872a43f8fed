"""Data parallelism: the data stream partitions, DDP/FSDP2 equal one process, rank 0 alone writes.

The end-to-end tests launch torchrun with 2 CPU processes over gloo, exactly as
an attendee launches 2 GPUs over NCCL/RCCL, and check that they compute the
same losses as one process holding the whole global batch.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from analysis_tools import scaling
from training.parallel import measure_communication
from conftest import REPO, as_if_under_torchrun, load_version, run_cli
from harness import data
from training import parallel
from harness.errors import GradientFlowError, UsageError

V1 = "version1_baseline/tiny_llama_v1.py"
STEPS = ["--num-steps", "4", "--warmup-steps", "1", "--log-every", "2", "--grad-accum", "2"]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


# ---------------------------------------------------------------- the data stream
@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_ranks_slice_the_global_batch(kind, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(256)) * 8)
    common = dict(kind=kind, vocab_size=256, seq_len=8, seed=7, data_path=str(text))
    whole = data.Batches(batch_size=6, **common)
    ranks = [data.Batches(batch_size=2, rank=r, world_size=3, **common) for r in range(3)]
    for _ in range(3):
        inputs, targets = whole.next()
        parts = [b.next() for b in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), inputs)
        assert torch.equal(torch.cat([p[1] for p in parts]), targets)
    assert not torch.equal(parts[0][0], parts[1][0]), "ranks must see different data"


def test_single_process_stream_is_unchanged():
    """world_size 1 draws exactly what the harness always drew for a seed."""
    batches = data.Batches("synthetic", vocab_size=100, batch_size=3, seq_len=5, seed=11)
    expected = torch.randint(0, 100, (3, 6), generator=torch.Generator().manual_seed(11 * 1000003))
    inputs, targets = batches.next()
    assert torch.equal(inputs, expected[:, :-1]) and torch.equal(targets, expected[:, 1:])


def test_rank_outside_world_is_rejected():
    with pytest.raises(UsageError):
        data.Batches("synthetic", 100, 2, 4, seed=0, rank=2, world_size=2)


# ---------------------------------------------------------------- without torchrun
def settings(**changes):
    """The RunSettings fields the distributed code reads (data-parallel knobs at their defaults)."""
    base = dict(fsdp=False, device="cpu", grad_accum=2, batch_size=2, compile=False,
                compile_mode="default", precision=None,
                **{name: parallel.DEFAULTS[name]
                   for name in {**parallel.DDP_KNOBS, **parallel.FLAT_KNOBS, **parallel.FSDP_KNOBS,
                                **parallel.SHARED_KNOBS}})
    return SimpleNamespace(**{**base, **changes})


def test_plain_python_is_single_process(monkeypatch):
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    ctx = parallel.setup(settings())
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.extra) == (0, 1, True, None)
    with pytest.raises(UsageError, match="torchrun"):
        parallel.setup(settings(fsdp=True))


def test_missing_fsdp2_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)
    monkeypatch.setitem(sys.modules, "torch.distributed._composable.fsdp", None)
    with pytest.raises(UsageError, match="FSDP2"):
        parallel.find_fsdp("fully_shard")


def test_fsdp_without_torchrun_exits_2_with_one_line():
    proc = run_cli([V1, "--fsdp", "--num-steps", "2", "--warmup-steps", "0"], env=clean_env())
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "torchrun" in proc.stderr


# ---------------------------------------------------------------- one-process group, in this process
@pytest.fixture
def group_of_one(monkeypatch):
    """A real gloo process group of world size 1: the DataParallel code paths, in-process."""
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    contexts = []

    def make(**changes):
        ctx = parallel.setup(settings(**changes))
        contexts.append(ctx)
        return ctx
    yield make
    for ctx in contexts:
        ctx.close()


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_ddp_no_sync_skips_all_but_the_last_micro_step(group_of_one):
    ctx = group_of_one()
    model = ctx.wrap(TwoLayers(), None)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future
    model.register_comm_hook(None, counting_hook)
    for micro in range(ctx.grad_accum):
        with ctx.no_sync(model, micro):
            model(torch.randn(3, 4)).sum().backward()
        assert len(calls) == (0 if micro < ctx.grad_accum - 1 else 1)
    assert ctx.check_gradient_flow(model) == 4
    assert ctx.mean_over_ranks(torch.tensor([2.0, 4.0])).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("fsdp", [False, True])
def test_gradient_guard_sees_through_the_wrapper(group_of_one, fsdp):
    ctx = group_of_one(fsdp=fsdp)
    model = ctx.wrap(TwoLayers(), None)
    out = model(torch.randn(3, 4)).sum()
    out.backward()
    assert ctx.check_gradient_flow(model) == 4
    grad = next(model.parameters()).grad
    (grad.to_local() if fsdp else grad).zero_()
    with pytest.raises(GradientFlowError, match="zero or non-finite"):
        ctx.check_gradient_flow(model)


def test_timing_keeps_every_rank_and_measures_communication(group_of_one):
    ctx = group_of_one()
    ctx.wrap(TwoLayers(), None)
    stats = {"median": 2.0, "p10": 1.0, "p90": 3.0, "mean": 2.0, "n": 3}
    timing = ctx.aggregate_timing({"step": stats, "backward": stats})
    assert timing["step"] == stats
    assert ctx.extra["per_rank_median_ms"]["step"] == [2.0]
    comm = ctx.extra["communication"]
    assert comm["buckets"] == 1 and comm["per_step_ms"] > 0 and "all_reduce" in comm["ms_per_bucket"]


# ---------------------------------------------------------------- scaling efficiency
def fake_result(world_size, tokens_per_s, step_ms, batch_size=4):
    return {"version": "v1", "config": {"hidden_dim": 64},
            "device": {"name": "gpu", "backend": "cuda", "torch": "x"},
            "run": {"world_size": world_size, "batch_size": batch_size, "seq_len": 32,
                    "precision": "bf16", "grad_accum": 1, "parallel": "ddp", "compile": False,
                    "global_batch_size": batch_size * world_size},
            "throughput": {"tokens_per_s": tokens_per_s},
            "timing_ms": {"step": {"median": step_ms}}}


def test_scaling_efficiency():
    single, multi = fake_result(1, 1000.0, 10.0), fake_result(2, 1800.0, 11.1)
    row = scaling.scaling(single, multi)
    assert row["efficiency"] == pytest.approx(0.9)
    assert row["extra_ms_vs_1gpu"] == pytest.approx(1.1)
    assert "90.0%" in scaling.format_scaling(single, [row])
    with pytest.raises(UsageError, match="batch_size"):
        scaling.scaling(single, fake_result(2, 1800.0, 11.1, batch_size=8))


# ---------------------------------------------------------------- torchrun, 2 CPU processes
def failure(stderr: str) -> str:
    """What a failed torchrun printed: the ranks' own messages come first, the agent's
    summary (which names the rank and signal) last; keep both ends."""
    return stderr if len(stderr) <= 4000 else f"{stderr[:2500]}\n[...]\n{stderr[-1500:]}"


def torchrun(out_dir, *args, script=V1):
    out_dir.mkdir()
    # --standalone: the rendezvous binds a port the OS picks as it binds (no port chosen
    # ahead that a test running beside this one could take); the agent logs stay in tmp_path
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--log-dir", str(out_dir.parent / "torchrun_logs"), script,
           *STEPS, "--batch-size", "4", "--output", str(out_dir / "run.json"), *args]
    proc = run_cli(cmd, env=clean_env(), timeout=120)
    assert proc.returncode == 0, failure(proc.stderr)
    return proc


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """One process holding the global batch: 2 ranks x 4 rows = 8 rows."""
    out = tmp_path_factory.mktemp("single") / "run.json"
    proc = run_cli([V1, *STEPS, "--batch-size", "8", "--output", out], env=clean_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.slow  # two gloo ranks against one process, ~20 s: make test-slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "shard_optimizer"])
def test_two_processes_match_one_process_with_the_global_batch(kind, single_run, tmp_path):
    """fp32 weights, two micro-steps a step: DDP, FSDP2 and the sharded optimizer alike."""
    flags = {"ddp": [], "fsdp2": ["--fsdp"], "shard_optimizer": ["--shard-optimizer"]}[kind]
    proc = torchrun(tmp_path / "out", *flags)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run.json"], "only rank 0 writes"
    assert proc.stdout.count("results:") == 1 and proc.stdout.count("step     4/4") == 1
    result = json.loads((tmp_path / "out" / "run.json").read_text())
    assert result["losses"] == pytest.approx(single_run["losses"], rel=1e-5)
    run = result["run"]
    assert (run["world_size"], run["parallel"], run["global_batch_size"]) == (
        2, "fsdp2" if kind == "fsdp2" else "ddp", 16)
    assert result["throughput"]["tokens_per_s"] > 0
    dist_info = result["distributed"]
    assert dist_info["backend"] == "gloo" and dist_info["global_batch_size"] == 16
    assert len(dist_info["per_rank_median_ms"]["step"]) == 2
    assert dist_info["communication"]["per_step_ms"] > 0


@pytest.mark.slow  # ~15 s, two agents: make test-slow
def test_two_nodes_meet_through_c10d_and_train_as_one_job(single_run, tmp_path):
    """torchrun --nnodes 2: two agents - here on one host, as two machines would run them -
    meet through the c10d rendezvous and train as one job of 2 ranks: one result (global
    rank 0's), the global batch's losses, two nodes recorded (docs/MULTI_GPU.md)."""
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "--rdzv-id", "tiny-llama-test", "--log-dir", str(tmp_path / "torchrun_logs"),
           V1, *STEPS, "--batch-size", "4", "--output", str(out)]
    agents = [subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        ends = [agent.communicate(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert all(agent.returncode == 0 for agent in agents), [failure(err) for _, err in ends]
    assert sum(stdout.count("results:") for stdout, _ in ends) == 1
    result = json.loads(out.read_text())
    assert result["losses"] == pytest.approx(single_run["losses"], rel=1e-5)
    info = result["distributed"]
    assert (info["world_size"], info["nodes"], info["processes_per_node"]) == (2, 2, 1)


# make test-slow: V1's runs above cover the data-parallel path every version shares; this
# checks V2's and V4's models under it (v3 is left out: Triton's CPU interpreter is slow)
@pytest.mark.slow
@pytest.mark.parametrize("version", ["v2", "v4"])
def test_every_version_trains_under_ddp(version, single_run, tmp_path):
    """Same V1 weights, same global batch: every version's DDP losses match V1's single process."""
    module = load_version(version)
    script = Path(module.__file__).relative_to(REPO)
    torchrun(tmp_path / "out", script=script)
    result = json.loads((tmp_path / "out" / "run.json").read_text())
    assert result["version"] == version and result["run"]["world_size"] == 2
    assert result["losses"] == pytest.approx(single_run["losses"], rel=1e-4)


# ---------------------------------------------------------------- tuning knobs (docs/MULTI_GPU.md)
def test_knob_flags_parse_and_bad_values_are_usage_errors():
    from training.cli import build_parser, settings_from_args

    def parse(*argv):
        return settings_from_args("v1", build_parser("v1", "").parse_args(list(argv)), list(argv))
    s = parse("--ddp-bucket-mb", "100", "--ddp-comm-hook", "bf16", "--compile-ddp", "whole",
              "--ddp-static-graph", "--fsdp-reshard-after-forward", "false", "--comm-priority", "normal",
              "--shard-optimizer")
    assert (s.ddp_bucket_mb, s.ddp_comm_hook, s.compile_ddp, s.ddp_static_graph, s.shard_optimizer,
            s.fsdp_reshard_after_forward, s.comm_priority) == (100.0, "bf16", "whole", True, True, False,
                                                               "normal")
    d = parse()
    assert (d.ddp_bucket_mb, d.ddp_comm_hook, d.compile_ddp, d.ddp_static_graph, d.shard_optimizer,
            d.fsdp_reshard_after_forward, d.comm_priority) == (None, "none", "split", False, False, True,
                                                               "high")
    for argv in (["--ddp-bucket-mb", "0"], ["--ddp-bucket-mb", "inf"], ["--ddp-comm-hook", "int8"],
                 ["--compile-ddp", "half"], ["--fsdp-reshard-after-forward", "yes"],
                 ["--fsdp-param-dtype", "fp16"],
                 ["--comm-priority", "urgent"]):
        with pytest.raises(UsageError, match=argv[0]):
            parse(*argv)


def test_master_weights_under_torchrun_shard_the_optimizer_unless_ddp_is_asked_for(monkeypatch):
    """The sharded optimizer scales better than DDP with master weights (docs/MULTI_GPU.md):
    it is their default over several processes, and only theirs."""
    from training.cli import build_parser, settings_from_args

    def sharded(*argv):
        args = build_parser("v1", "").parse_args(list(argv))
        return settings_from_args("v1", args, list(argv)).shard_optimizer
    master = ("--optimizer", "master")
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    assert not sharded(*master)  # one process: nothing to shard over
    assert sharded(*master, "--shard-optimizer")  # asked for: the 1-GPU baseline of a sharded row
    as_if_under_torchrun(monkeypatch)
    assert sharded(*master) and not sharded() and not sharded("--optimizer", "fused")
    assert not sharded(*master, "--no-shard-optimizer")
    assert not sharded(*master, "--reduce-after-backward")  # the other flat optimizer, asked for
    # what it does not do: DDP's knobs and FSDP2 get the wrapper they configure, fp16 DDP
    for asked in (("--ddp-bucket-mb", "50"), ("--ddp-static-graph",), ("--fsdp",),
                  ("--precision", "fp16")):
        assert not sharded(*master, *asked), asked
    as_if_under_torchrun(monkeypatch, world_size=1)
    assert not sharded(*master)


def test_compiled_fp32_weights_under_torchrun_reduce_after_backward_unless_ddp_is_asked_for(monkeypatch):
    """Compiled without graphs, with fp32 weights and bf16 autocast, DDP cuts the model into
    graph pieces the host launches, and reducing after the backward scales better
    (docs/MULTI_GPU.md): that is the default there over several processes, and only there."""
    from training.cli import build_parser, settings_from_args

    def reduced(*argv):
        args = build_parser("v1", "").parse_args(list(argv))
        return settings_from_args("v1", args, list(argv)).reduce_after_backward
    compiled = ("--compile", "--precision", "bf16")
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    assert not reduced(*compiled)  # one process: nothing to reduce
    assert reduced(*compiled, "--reduce-after-backward")  # asked for: a row's 1-GPU baseline
    as_if_under_torchrun(monkeypatch)
    assert reduced(*compiled) and not reduced("--precision", "bf16")
    assert not reduced(*compiled, "--no-reduce-after-backward")
    # the sharded optimizer (master weights' default, or asked for), DDP's knobs, FSDP2, torch's
    # own AdamW, fp16 or fp32 gradients (the CPU's default precision): not on its own
    for asked in (("--optimizer", "master"), ("--shard-optimizer",), ("--ddp-bucket-mb", "50"),
                  ("--compile-mode", "reduce-overhead"),
                  ("--fsdp",), ("--optimizer", "fused"), ("--precision", "fp16"),
                  ("--precision", "fp32")):
        assert not reduced(*compiled, *asked), asked
    assert not reduced("--compile", "--device", "cpu")
    as_if_under_torchrun(monkeypatch, world_size=1)
    assert not reduced(*compiled)


def test_knobs_without_torchrun_are_ignored_with_a_note(monkeypatch, capsys):
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    ctx = parallel.setup(settings(ddp_comm_hook="bf16", ddp_bucket_mb=100.0, comm_priority="normal"))
    assert ctx.world_size == 1
    note = capsys.readouterr().err
    assert note.count("\n") == 1 and "ignored" in note
    assert "--ddp-bucket-mb, --ddp-comm-hook, --comm-priority" in note
    # --shard-optimizer acts in one process too (the same update, one shard): no note
    ctx = parallel.setup(settings(shard_optimizer=True, optimizer="default"))
    assert ctx.shard_optimizer and capsys.readouterr().err == ""


@pytest.mark.parametrize("changes, fragment", [
    (dict(fsdp=True, ddp_comm_hook="fp16"), "--ddp-comm-hook configures DDP"),
    (dict(fsdp=True, ddp_bucket_mb=50.0), "--ddp-bucket-mb configures DDP"),
    (dict(fsdp_reshard_after_forward=False), "configures FSDP2"),
])
def test_a_knob_of_the_other_wrapper_is_a_usage_error(group_of_one, changes, fragment):
    with pytest.raises(UsageError, match=fragment):
        group_of_one(**changes)


def all_reduces_per_backward(model, steps=2) -> list[int]:
    """Buckets all-reduced in each backward (DDP re-buckets after the first one)."""
    calls = []
    model.register_comm_hook(None, lambda state, bucket: (calls.append(1), _done(bucket))[1])
    counts = []
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        counts.append(len(calls))
        calls.clear()
    return counts


def _done(bucket):
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def also_in_group(**changes):
    """A second DataParallel in the process group a group_of_one() context opened."""
    return parallel.DataParallel(settings(**changes), torch.device("cpu"), "gloo")


def test_bucket_size_sets_the_number_of_all_reduces(group_of_one):
    ctx = group_of_one(ddp_bucket_mb=100 / 2**20)  # 100-byte buckets
    assert all_reduces_per_backward(ctx.wrap(TwoLayers(), None))[-1] > 1
    default = also_in_group().wrap(TwoLayers(), None)
    assert all_reduces_per_backward(default)[-1] == 1  # 232 bytes of gradients: one bucket
    assert ctx.extra["bucket_cap_mb"] == 100 / 2**20 and ctx.extra["comm_hook"] == "none"
    assert measure_communication(ctx, reps=1)["buckets"] > 1
    # no --ddp-bucket-mb: DDP's 25 MiB, and 200 MiB under --compile without CUDA graphs
    assert also_in_group().extra["bucket_cap_mb"] == parallel.BUCKET_MB == 25
    assert also_in_group(compile=True).extra["bucket_cap_mb"] == parallel.COMPILED_BUCKET_MB == 200
    assert also_in_group(compile=True, compile_mode="reduce-overhead").extra["bucket_cap_mb"] == 25


def test_comm_hook_averages_in_16_bits_into_fp32_gradients(group_of_one):
    """fp16: the hook gloo accepts (DDP takes the bf16 hook only with NCCL/RCCL)."""
    hook, dtype = "fp16", torch.float16
    ctx = group_of_one(ddp_comm_hook=hook)
    model, reference = ctx.wrap(TwoLayers(), None), TwoLayers()
    x = torch.randn(3, 4)
    model(x).sum().backward()
    reference(x).sum().backward()
    for p, ref in zip(model.parameters(), reference.parameters()):
        assert p.grad.dtype == torch.float32
        assert torch.equal(p.grad, ref.grad.to(dtype).float())  # world size 1: only the rounding
    assert ctx.extra["comm_hook"] == hook
    comm = measure_communication(ctx, reps=1)
    assert comm["bucket_mib"] == pytest.approx(comm["gradient_mib"] / 2)  # 2 bytes on the wire


@pytest.mark.parametrize("refusal", ["all-reduce", "register"])
def test_a_hook_the_backend_refuses_is_one_usage_error(group_of_one, monkeypatch, refusal):
    ctx = group_of_one(ddp_comm_hook="bf16")

    def refuse(*args, **kwargs):
        if refusal == "all-reduce":
            raise RuntimeError("Unsupported dtype BFloat16\nmore detail")
        raise TypeError("BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+")
    target = (torch.distributed if refusal == "all-reduce"
              else torch.nn.parallel.DistributedDataParallel)
    monkeypatch.setattr(target, "all_reduce" if refusal == "all-reduce" else "register_comm_hook",
                        refuse)
    with pytest.raises(UsageError, match=r"--ddp-comm-hook bf16 does not work with the gloo "
                                         r"backend here \(.*\); use --ddp-comm-hook fp16 or none$"):
        ctx.wrap(TwoLayers(), None)


def test_static_graph_reaches_ddp_and_still_trains(group_of_one):
    ctx = group_of_one(ddp_static_graph=True)
    model, reference = ctx.wrap(TwoLayers(), None), TwoLayers()
    assert model.static_graph and ctx.extra["static_graph"] is True
    for _ in range(2):  # the first backward records the order, the second uses it
        x = torch.randn(3, 4)
        model.zero_grad()
        reference.zero_grad()
        model(x).sum().backward()
        reference(x).sum().backward()
        for p, ref in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, ref.grad)


@pytest.mark.parametrize("mode, optimize_ddp", [("split", True), ("whole", False)])
def test_compile_ddp_chooses_dynamo_graph_splitting(group_of_one, mode, optimize_ddp):
    import torch._dynamo

    with torch._dynamo.config.patch(optimize_ddp="unset"):  # restored afterwards
        ctx = group_of_one(compile=True, compile_ddp=mode)
        ctx.wrap(TwoLayers(), None)
        assert torch._dynamo.config.optimize_ddp is optimize_ddp
    assert ctx.extra["compile_ddp"] == mode
    eager = also_in_group(compile_ddp=mode)  # without --compile there is nothing to split
    assert eager.extra["compile_ddp"] is None


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_reshard_after_forward_reaches_every_block(group_of_one, reshard):
    ctx = group_of_one(fsdp=True, fsdp_reshard_after_forward=reshard)
    real, seen = ctx.fully_shard, []
    ctx.fully_shard = lambda module, **kw: (seen.append(kw.get("reshard_after_forward")),
                                            real(module, **kw))[1]
    model = ctx.wrap(TwoLayers(), None)
    assert seen == [reshard, reshard, None]  # the two blocks, then the root (FSDP2's own choice)
    model(torch.randn(3, 4)).sum().backward()
    assert ctx.extra["reshard_after_forward"] is reshard and "comm_hook" not in ctx.extra


def test_fsdp_bf16_parameters_reach_every_unit_and_keep_fp32_shards(group_of_one):
    """--fsdp-param-dtype bf16: every fully_shard call gets a MixedPrecisionPolicy computing in
    bf16 and reducing in fp32; the sharded weights and their gradients stay fp32."""
    ctx = group_of_one(fsdp=True, fsdp_param_dtype="bf16")
    real, seen = ctx.fully_shard, []
    ctx.fully_shard = lambda module, **kw: (seen.append(kw.get("mp_policy")), real(module, **kw))[1]
    model = ctx.wrap(TwoLayers(), None)
    assert len(seen) == 3 and all(p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32
                                  for p in seen)
    model(torch.randn(3, 4)).float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert ctx.extra["param_dtype"] == "bf16"


def test_scaling_table_names_each_variant():
    single = fake_result(1, 1000.0, 10.0)
    runs = []
    for extra in ({}, {"bucket_cap_mb": 100.0, "comm_hook": "bf16", "compile_ddp": "whole"},
                  {"static_graph": True, "env": {"NCCL_MAX_NCHANNELS": "4"}, "comm_priority": "normal"},
                  {"shard_optimizer": True, "bucket_cap_mb": 25},
                  {"reduce_after_backward": True, "bucket_cap_mb": None}):
        run = fake_result(2, 1800.0, 11.1)
        run["distributed"] = {"kind": "ddp", "comm_priority": "high", **extra}  # as runs record it
        runs.append(run)
    for run in (single, *runs):
        run["run"]["compile"] = True
    fsdp = fake_result(2, 1500.0, 13.0)
    fsdp["run"]["parallel"] = "fsdp2"
    fsdp["distributed"] = {"kind": "fsdp2", "reshard_after_forward": False, "comm_priority": "high",
                           "param_dtype": "bf16"}
    rows = [scaling.scaling(single, r) for r in runs]
    assert [r["variant"] for r in rows] == [
        "bucket 25 MB, graph split per bucket", "bucket 100 MB, bf16 all-reduce, one graph",
        "bucket 25 MB, graph split per bucket, normal-priority comm stream, static graph, NCCL <= 4 channels",
        "sharded optimizer (reduce-scatter + all-gather)", "all-reduce after backward"]
    single["run"]["compile"] = False
    for r in runs:
        r["run"]["compile"] = False
    table = scaling.format_scaling(single, [scaling.scaling(single, r)
                                                for r in (*runs, fsdp)])
    assert "eager" in table.splitlines()[0]
    assert "bucket 100 MB, bf16 all-reduce  " in table and "keep weights fwd->bwd, bf16 parameters" in table
    runs[0]["run"]["compile"] = True
    with pytest.raises(UsageError, match="compile"):
        scaling.scaling(single, runs[0])
    runs[1]["run"]["optimizer"] = "master"  # the baseline of a master-weights run has them too
    with pytest.raises(UsageError, match="optimizer"):
        scaling.scaling(single, runs[1])


def write_trace(path, kernels, steps=2):
    """A PyTorch-profiler-shaped trace: (name, start us, end us) per kernel."""
    events = [{"ph": "X", "cat": "kernel", "name": name, "ts": a, "dur": b - a}
              for name, a, b in kernels]
    events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 0, "dur": 1}
               for i in range(steps)]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.slow
def test_overlap_of_communication_with_compute(tmp_path):
    trace = write_trace(tmp_path / "rank0.pt.trace.json", [
        ("sm90_gemm", 0, 10), ("elementwise", 5, 12), ("flash_bwd", 16, 20),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 8, 18),  # 8-12 and 16-18 beside compute
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 32)])  # alone
    row = scaling.communication_overlap(trace)
    assert (row["steps"], row["comm_kernels"]) == (2, 2)
    assert row["comm_ms_per_step"] == pytest.approx(12 / 2 / 1000)
    assert row["overlapped_ms_per_step"] == pytest.approx(6 / 2 / 1000)
    assert row["exposed_ms_per_step"] == pytest.approx(6 / 2 / 1000)
    assert row["overlap_fraction"] == pytest.approx(0.5)
    assert row["compute_ms_per_step"] == pytest.approx(16 / 2 / 1000)
    assert row["gpu_window_ms_per_step"] == pytest.approx(32 / 2 / 1000)
    assert row["gpu_idle_ms_per_step"] == pytest.approx(10 / 2 / 1000)  # 20-30: no kernel at all
    assert row["host_step_ms"] == pytest.approx(1 / 1000)  # the ProfilerStep ranges on the CPU
    proc = run_cli(["-m", "analysis_tools", "overlap", trace, "--json", tmp_path / "overlap.json"])
    assert proc.returncode == 0 and "(50%) beside compute" in proc.stdout
    written = json.loads((tmp_path / "overlap.json").read_text())  # reproduce's scaling step
    assert written["ranks"] == [row] and written["created"] and "git_commit" in written
    cpu_only = write_trace(tmp_path / "cpu.pt.trace.json", [])
    proc = run_cli(["-m", "analysis_tools", "overlap", cpu_only])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no GPU kernels" in proc.stderr


def test_overlap_counts_only_the_kernels_the_profiled_steps_launched(tmp_path):
    """The host runs ahead: kernels queued before the first profiled step can run inside the
    window. Each kernel is matched to its launch by correlation id (a graph's kernels share
    their graph launch's) and kept only where that launch lies in a ProfilerStep range."""
    def kernel(name, a, b, correlation):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": a, "dur": b - a,
                "args": {"correlation": correlation}}

    def launch(name, ts, correlation, cat="cuda_runtime"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1, "args": {"correlation": correlation}}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 100, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "ts": 150, "dur": 50},
        launch("cudaGraphLaunch", 90, 1),                     # the step before: not profiled
        kernel("sm90_gemm", 100, 130, 1), kernel("rms_norm", 130, 140, 1),
        kernel("swiglu", 140, 145, 2),                        # its launch is not in the trace
        launch("cudaGraphLaunch", 110, 3),                    # a profiled step's graph: both kernels
        kernel("sm90_gemm", 150, 170, 3), kernel("rms_norm", 170, 180, 3),
        launch("cuLaunchKernelEx", 160, 4, cat="cuda_driver"),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 175, 185, 4)]
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    row = scaling.communication_overlap(trace)
    assert (row["steps"], row["comm_kernels"]) == (2, 1)
    assert row["compute_ms_per_step"] == pytest.approx(30 / 2 / 1000)  # 150-180, not 100-145
    assert row["comm_ms_per_step"] == pytest.approx(10 / 2 / 1000)
    assert row["overlapped_ms_per_step"] == pytest.approx(5 / 2 / 1000)
    assert row["gpu_window_ms_per_step"] == pytest.approx(35 / 2 / 1000)


@pytest.mark.slow  # ~13 s, two ranks: make test-slow
def test_small_buckets_train_exactly_like_the_default(single_run, tmp_path):
    """Bucketing only groups the all-reduces: the averaged gradients are the same."""
    torchrun(tmp_path / "out", "--ddp-bucket-mb", "0.1")
    result = json.loads((tmp_path / "out" / "run.json").read_text())
    assert result["losses"] == pytest.approx(single_run["losses"], rel=1e-5)
    d = result["distributed"]
    assert (d["bucket_cap_mb"], d["comm_hook"], d["compile_ddp"]) == (0.1, "none", None)
    assert d["communication"]["buckets"] >= 5  # 0.5 MiB of gradients in 0.1 MiB buckets


@pytest.mark.slow  # ~12 s, two ranks: make test-slow
def test_16_bit_gradient_all_reduce_trains_close_to_fp32(single_run, tmp_path):
    """fp16 on gloo; the GPU benchmark uses bf16 (same hook, NCCL/RCCL only)."""
    torchrun(tmp_path / "out", "--ddp-comm-hook", "fp16")
    result = json.loads((tmp_path / "out" / "run.json").read_text())
    assert result["losses"] == pytest.approx(single_run["losses"], rel=1e-3)
    assert result["distributed"]["comm_hook"] == "fp16"
    assert "fp16 all-reduce" in scaling.variant(result)


# ---------------------------------------------------------------- --optimizer master under DDP


def test_bf16_gradients_fill_bf16_buckets(group_of_one):
    """--optimizer master: weights, gradients and so DDP's buckets are bf16; the probe times that."""
    from harness.master_weights import split_master_weights

    model = TwoLayers()
    split_master_weights(model)
    ctx = group_of_one()
    ctx.wrap(model, None)
    assert ctx.gradient_dtype == torch.bfloat16
    comm = measure_communication(ctx, reps=1)
    assert comm["gradient_mib"] == pytest.approx(ctx.gradient_numel * 2 / 2**20)


class ScaledTwoLayers(TwoLayers):
    """TwoLayers and an fp32 parameter outside nn.Linear (as norms and embeddings are)."""
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 2))

    def forward(self, x):
        return super().forward(x) * self.scale


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("optimizer", ["master", "default"])
@pytest.mark.parametrize("launch", ["torchrun", "python"])
@pytest.mark.parametrize("flag", ["shard_optimizer", "reduce_after_backward"])
def test_flat_optimizer_steps_as_the_optimizer_it_replaces(group_of_one, device, optimizer, launch, flag):
    """--shard-optimizer (or --reduce-after-backward) on one rank: the flat buffer the weights
    become views of, and the update of its shard (and, with master weights, of the fp32
    parameters beside it), give the weights of the unsharded optimizer step for step:
    MasterWeightAdamW exactly, torch.optim.AdamW to rounding (the same formula in another
    order). Two ranks and their padding: the slow tests below. On a GPU (NCCL, the compiled
    update) to rounding. Under plain python it is the same update with nothing to send: the
    rows' baseline. Reduced after the backward under bf16 autocast, the gradients travel in
    bf16: fp32 weights then match to bf16's rounding."""
    from harness.master_weights import MasterWeightAdamW, split_master_weights

    x = torch.randn(3, 4, device=device)
    master = optimizer == "master"
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)

    def train(model, optimizer):
        for _ in range(3):
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(x).float().square().sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return [p.detach().float().clone() for p in model.parameters()]

    reference = ScaledTwoLayers().to(device)
    expected = train(reference, MasterWeightAdamW(reference.parameters(), split_master_weights(reference),
                                                  **hyper) if master else
                     torch.optim.AdamW(reference.parameters(), foreach=False, **hyper))
    chosen = {flag: True, "optimizer": optimizer, "grad_accum": 1, "learning_rate": 1e-2,
              "device": device, "precision": "bf16"}
    rounded = master or (flag == "reduce_after_backward" and launch == "torchrun")
    ctx = group_of_one(**chosen) if launch == "torchrun" else parallel.SingleProcess(settings(**chosen))
    model = ScaledTwoLayers().to(device)
    masters = split_master_weights(model) if master else None
    model = ctx.wrap(model, settings(**chosen))
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
    optimizer = ctx.make_optimizer(model, settings(**chosen), torch.device(device), masters)
    flat_dtype = torch.bfloat16 if master else torch.float32
    assert ctx.flat.dtype == flat_dtype and len(ctx.flat_params) == (4 if master else 5)
    assert all(p.untyped_storage().data_ptr() == ctx.flat.untyped_storage().data_ptr()
               for p in ctx.flat_params)
    assert not masters, "the full fp32 masters are dropped: the rank keeps its slice"
    for got, want in zip(train(model, optimizer), expected):
        if device == "cpu" and master:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-2 if rounded else 1e-5,
                                       atol=1e-3 if rounded else 1e-6)
    wire = torch.bfloat16 if rounded else ctx.flat.dtype  # nothing sent: nothing rounded
    assert optimizer.grads.dtype == wire
    if launch == "torchrun":
        assert ctx.extra[flag] is True
        comm = measure_communication(ctx, reps=1)
        sent = {"shard_optimizer": {"all_gather", "reduce_scatter"},
                "reduce_after_backward": {"all_reduce"}}[flag]
        assert set(comm["ms_per_bucket"]) == sent and comm["buckets"] == 1


@pytest.mark.parametrize("sizes, pieces", [([5, 3, 9, 1], 4), ([20], 3), ([2, 2], 4), ([7, 1, 4], 1)])
def test_piece_parts_fill_each_piece_in_order_and_leave_only_padding(sizes, pieces):
    """--reduce-after-backward copies each piece's gradients just before its all-reduce: the
    ranges of each piece, laid end to end, are the flat buffer itself, every element once."""
    from training.sharded_optimizer import piece_parts

    piece = -(-sum(sizes) // pieces) + 1  # room for padding
    parts = piece_parts(sizes, pieces, piece)
    assert len(parts) == pieces
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    laid = [offsets[i] + j for part in parts for i, a, b in part for j in range(a, b)]
    assert laid == list(range(sum(sizes)))
    for k, part in enumerate(parts):  # each piece starts at its boundary and stays inside it
        if part:
            i, a, _ = part[0]
            assert offsets[i] + a == k * piece
            assert sum(b - a for _, a, b in part) <= piece


def test_flat_weights_are_padded_to_the_ranks_and_keep_each_weight():
    from harness.master_weights import split_master_weights
    from training.sharded_optimizer import CHUNKS, flatten_parameters

    model = ScaledTwoLayers()
    split_master_weights(model)
    before = [p.detach().clone() for p in model.parameters()]
    flat, low = flatten_parameters(model, torch.bfloat16, world_size=3)
    assert flat.numel() % (3 * CHUNKS) == 0 and flat.numel() - sum(p.numel() for p in low) < 3 * CHUNKS
    assert len(low) == 4 and all(p.dtype == torch.bfloat16 for p in low)  # two weights, two biases
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    flat.zero_()
    assert all(not p.any() for p in low) and model.scale.any()  # views; the fp32 one untouched


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_piece_of_the_flat_buffer_has_one_owner(world):
    """The update runs piece by piece (training/sharded_optimizer.py): every rank owns a slice
    of every piece, and every element of the buffer is updated by exactly one rank."""
    from training.sharded_optimizer import CHUNKS, owned_slices

    numel = 5 * world * CHUNKS
    owners = torch.zeros(numel, dtype=torch.int64)
    for rank in range(world):
        mine = owned_slices(numel, world, CHUNKS, rank)
        assert len(mine) == CHUNKS and sum(s.stop - s.start for s in mine) == numel // world
        for k, s in enumerate(mine):  # inside piece k
            assert k * numel // CHUNKS <= s.start < s.stop <= (k + 1) * numel // CHUNKS
            owners[s] += 1
    assert owners.eq(1).all()


@pytest.mark.parametrize("changes, fragment", [
    (dict(optimizer="fused"), "drop --optimizer fused"),
    (dict(optimizer="master", ddp_bucket_mb=50.0), "--ddp-bucket-mb configures DDP, which --shard-optimizer"),
    (dict(optimizer="master", fsdp=True), "--shard-optimizer configures DDP"),
])
def test_shard_optimizer_refuses_what_it_would_not_do(group_of_one, changes, fragment):
    with pytest.raises(UsageError, match=fragment):
        group_of_one(shard_optimizer=True, grad_accum=1, **changes)


@pytest.mark.parametrize("changes, fragment", [
    (dict(optimizer="foreach"), "--reduce-after-backward updates .* drop --optimizer foreach"),
    (dict(compile_ddp="whole"), "--compile-ddp configures DDP, which --reduce-after-backward"),
    (dict(fsdp=True), "--reduce-after-backward configures DDP"),
    (dict(shard_optimizer=True), "pick one"),
])
def test_reduce_after_backward_refuses_what_it_would_not_do(group_of_one, changes, fragment):
    with pytest.raises(UsageError, match=fragment):
        group_of_one(reduce_after_backward=True, grad_accum=1, **{"optimizer": "default", **changes})


@pytest.mark.parametrize("flag", ["shard_optimizer", "reduce_after_backward"])
def test_flat_optimizer_refuses_fp16_loss_scaling(group_of_one, flag):
    ctx = group_of_one(**{flag: True}, optimizer="default")
    ctx.check_precision("bf16")
    with pytest.raises(UsageError, match=f"--{flag.replace('_', '-')} does not run with fp16"):
        ctx.check_precision("fp16")


@pytest.mark.slow  # ~17 s each, two ranks: make test-slow
@pytest.mark.parametrize("shard", [False, True], ids=["ddp", "shard_optimizer"])
def test_master_weights_under_ddp_match_one_process(tmp_path, shard):
    """2 gloo ranks x 4 rows with bf16 weights and fp32 masters = 1 process x 8 rows, under
    DDP and with the optimizer sharded (each rank updating half of the flat bf16 weights)."""
    result, single = two_ranks_and_one("--optimizer", "master",
                                       "--shard-optimizer" if shard else "--no-shard-optimizer",
                                       tmp_path=tmp_path)
    assert result["run"]["optimizer"] == "master" and result["run"]["world_size"] == 2
    assert result["distributed"]["shard_optimizer"] is shard
    # The averaged gradient is rounded to bf16 (two ranks' halves, then their mean).
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-3)


def two_ranks_and_one(*flags, tmp_path):
    """V4 in bf16 with `flags`: (the results of 2 gloo ranks x 4 rows, of 1 process x 8 rows)."""
    flags = ["--precision", "bf16", "--grad-accum", "1", *flags]
    v4 = Path(load_version("v4").__file__).relative_to(REPO)
    single = tmp_path / "single.json"
    proc = run_cli([v4, *STEPS, *flags, "--batch-size", "8", "--output", single], env=clean_env())
    assert proc.returncode == 0, proc.stderr
    torchrun(tmp_path / "out", *flags, script=v4)
    return (json.loads((tmp_path / "out" / "run.json").read_text()), json.loads(single.read_text()))


@pytest.mark.slow  # ~17 s, two ranks: make test-slow
def test_reduce_after_backward_matches_one_process(tmp_path):
    """2 gloo ranks x 4 rows with fp32 weights, the gradients all-reduced in bf16 after the
    backward, piece by piece = 1 process x 8 rows, to bf16's rounding of the mean."""
    result, single = two_ranks_and_one("--reduce-after-backward", tmp_path=tmp_path)
    assert result["distributed"]["reduce_after_backward"] is True
    assert result["distributed"]["shard_optimizer"] is False
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-3)
