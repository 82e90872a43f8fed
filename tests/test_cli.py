"""The command line as an attendee meets it: flags, errors, exit codes, results."""

import pytest
import torch

import harness
import training
from conftest import REPO, load_version, run_cli
from harness.results import load

V1 = REPO / "version1_baseline" / "tiny_llama_v1.py"
FAST = ["--preset", "tiny", "--num-steps", "6", "--warmup-steps", "2", "--quiet"]


def test_help_documents_every_flag():
    proc = run_cli([V1, "--help"])
    assert proc.returncode == 0
    for flag in ["--batch-size", "--seq-len", "--hidden-dim", "--num-layers", "--num-heads",
                 "--num-steps", "--learning-rate", "--num-kv-heads", "--ffn-dim", "--vocab-size",
                 "--preset", "--warmup-steps", "--precision", "--grad-checkpoint", "--grad-accum",
                 "--compile", "--device", "--seed", "--deterministic", "--data", "--data-path",
                 "--output", "--quiet", "--host-probe"]:
        assert flag in proc.stdout, flag


@pytest.mark.parametrize("args, fragment", [
    (["--hidden-dim", "100", "--num-heads", "3"], "not divisible by num_heads"),
    (["--batch-size", "0"], "--batch-size must be > 0"),
    (["--seq-len", "100000"], "above the model's max_seq_len"),
    (["--device", "cuda"], "no GPU"),
    (["--precision", "fp16", "--device", "cpu"], "fp16 needs a GPU"),
    (["--num-heads", "4", "--num-kv-heads", "3"], "divisible by num_kv_heads"),
    (["--warmup-steps", "10", "--num-steps", "5"], "--warmup-steps"),
    (["--precision", "fp64"], "invalid choice"),
    (["--batch-size", "two"], "invalid int value"),
    (["--data", "text", "--vocab-size", "100"], "vocab-size >= 256"),
    (["--data", "text", "--data-path", "/no/such/file"], "does not exist"),
    (["--host-probe", "-1"], "--host-probe must be >= 0"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, fragment):
    """In this process (the version's own main), so each case costs no interpreter start;
    the next test runs one case as a command line."""
    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "r.json"
    try:
        code = load_version("v1").main([*FAST, "--output", str(out), *args])
    except SystemExit as e:  # argparse's own errors leave through its parser's exit
        code = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_input_on_the_command_line_is_one_line_without_a_traceback(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli([V1, *FAST, "--output", out, "--batch-size", "0"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: --batch-size must be > 0 (got 0)"]
    assert not out.exists()


def _run_in_process(build_model, tmp_path, capsys, extra=()):
    out = tmp_path / "r.json"
    code = training.main("vtest", build_model, init_from_v1=False,
                         argv=[*FAST, "--output", str(out), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err, out


class _Exploding(torch.nn.Module):
    """A model whose forward fails the way a real run can."""

    def __init__(self, cfg, error):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(cfg.hidden_dim, cfg.hidden_dim)])
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_dim)
        self.head = torch.nn.Linear(cfg.hidden_dim, cfg.vocab_size)
        self.error, self.calls = error, 0

    def forward(self, ids):
        self.calls += 1
        logits = self.head(self.layers[0](self.embed(ids)))
        if self.error == "oom" and self.calls == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.error == "nan" and self.calls == 4:
            return logits * float("nan")
        if self.error == "detached":
            return logits.detach().requires_grad_()
        return logits


def test_out_of_memory_is_exit_3_with_advice(tmp_path, capsys):
    code, err, out = _run_in_process(lambda cfg: _Exploding(cfg, "oom"), tmp_path, capsys)
    assert code == 3 and len(err) == 1
    assert "out of memory" in err[0] and "--batch-size" in err[0] and "--grad-checkpoint" in err[0]
    assert not out.exists()


def test_nan_loss_is_exit_4_naming_the_step(tmp_path, capsys):
    code, err, out = _run_in_process(lambda cfg: _Exploding(cfg, "nan"), tmp_path, capsys,
                                     extra=["--log-every", "1"])
    # the fourth forward fails: step 4 of 6, as the progress lines count (from 1)
    assert code == 4 and len(err) == 1 and "at step 4/6" in err[0], err
    assert not out.exists()


def test_cut_graph_is_exit_5(tmp_path, capsys):
    code, err, out = _run_in_process(lambda cfg: _Exploding(cfg, "detached"), tmp_path, capsys)
    assert code == 5 and len(err) == 1 and "got no gradient" in err[0]
    assert not out.exists()


def test_results_json_is_complete(tmp_path):
    out = tmp_path / "v1.json"
    proc = run_cli([V1, *FAST, "--output", out])
    assert proc.returncode == 0, proc.stderr
    r = load(out)
    assert r["version"] == "v1" and r["run"]["precision"] == "fp32"
    assert r["device"]["backend"] in ("cpu", "cuda", "rocm") and r["device"]["torch"]
    assert len(r["losses"]) == 6 and r["timing_ms"]["step"]["n"] == 4
    assert r["gradient_guard"]["passed"] and r["gradient_guard"]["checked_params"] > 0
    assert r["throughput"]["tokens_per_s"] > 0 and r["flops"]["per_step"] > 0
    assert "6*N_matmul" in r["flops"]["convention"]
    assert r["config"]["hidden_dim"] == 64 and r["run"]["batch_size"] == 4
    # the host's pace before and after the steps: microseconds of the same fixed Python
    pace = r["host_pace"]
    assert pace["before_us"] > 0 and pace["after_us"] > 0 and pace["items"] > 0


@pytest.mark.slow
def test_same_seed_same_losses(tmp_path):
    losses = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        assert run_cli([V1, *FAST, "--deterministic", "--output", out]).returncode == 0
        losses.append(load(out)["losses"])
    assert losses[0] == losses[1]


@pytest.mark.slow
def test_text_loss_falls(tmp_path):
    out = tmp_path / "text.json"
    proc = run_cli([V1, "--preset", "tiny", "--data", "text", "--num-steps", "50",
                    "--learning-rate", "3e-3", "--quiet", "--output", out])
    assert proc.returncode == 0, proc.stderr
    losses = load(out)["losses"]
    assert losses[0] > 5.0  # about ln(256) = 5.5 at the start
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5


@pytest.mark.slow
def test_grad_accum_and_checkpointing_train(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli([V1, *FAST, "--grad-accum", "2", "--grad-checkpoint", "--output", out])
    assert proc.returncode == 0, proc.stderr
    r = load(out)
    assert r["run"]["tokens_per_step"] == 2 * 4 * 32 and r["run"]["grad_checkpoint"]


def test_grad_checkpointing_keeps_the_gradients():
    from training.trainer import enable_grad_checkpointing
    v1 = load_version("v1")
    cfg = harness.ModelConfig()
    ids = torch.randint(0, 256, (2, 16))
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = v1.build_model(cfg)
        if checkpointed:
            enable_grad_checkpointing(model)
        model(ids).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_progress_lines_and_quiet(tmp_path):
    loud = run_cli([V1, "--preset", "tiny", "--num-steps", "4", "--warmup-steps", "1",
                    "--log-every", "2", "--output", tmp_path / "a.json"])
    assert loud.returncode == 0 and loud.stdout.count("step ") >= 2
    quiet = run_cli([V1, *FAST, "--output", tmp_path / "b.json"])
    # no progress, but where the result went: the one line a quiet run owes its reader
    assert quiet.returncode == 0 and quiet.stdout == f"results: {tmp_path / 'b.json'}\n"


def test_out_of_memory_while_building_is_exit_3(tmp_path, capsys):
    def too_big(cfg):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    code, err, out = _run_in_process(too_big, tmp_path, capsys)
    assert code == 3 and len(err) == 1 and "before training started" in err[0]
    assert not out.exists()


def test_host_probe_on_a_cpu_says_so_and_runs_the_plain_steps(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GPU test below probes")
    code, _, out = _run_in_process(load_version("v1").build_model, tmp_path, capsys,
                                   ["--host-probe", "2"])
    r = load(out)
    assert code == 0 and "host_probe" not in r and len(r["losses"]) == 6
    assert any(w.startswith("--host-probe: a CPU") for w in r["warnings"]), r["warnings"]


def test_host_probe_reading_and_its_line():
    probe = harness.measure.HostProbe(3)
    assert probe.result() is None
    probe.hold_ms = 60.0
    probe.samples = [(18.0, 18.5), (19.0, 18.4), (17.0, 18.6)]
    reading = probe.result()
    assert reading == {"steps": 3, "hold_ms": 60.0, "host_ms": 18.0, "gpu_ms": 18.5,
                       "host_waited": False}
    # the timed steps against the GPU's time for a step queued ahead: what the GPU waited
    assert "the GPU waited 1.50 ms a step" in training.trainer.host_probe_line(reading, 20.0)
    assert "the GPU hardly waited" in training.trainer.host_probe_line(reading, 18.9)
    probe.samples = [(55.0, 18.5)]  # queueing took most of the hold: the host waited
    assert probe.result()["host_waited"]
    assert "no reading" in training.trainer.host_probe_line(probe.result(), 18.9)


@pytest.mark.gpu
def test_gpu_host_probe_reads_the_host_and_the_gpu_after_the_timed_steps(tmp_path, capsys):
    code, _, out = _run_in_process(load_version("v1").build_model, tmp_path, capsys,
                                   ["--device", "cuda", "--host-probe", "3"])
    r = load(out)
    assert code == 0 and len(r["losses"]) == 9 and r["timing_ms"]["step"]["n"] == 4
    p = r["host_probe"]
    assert p["steps"] == 3 and p["hold_ms"] >= 50 and not p["host_waited"]
    assert 0 < p["host_ms"] < p["hold_ms"] and p["gpu_ms"] > 0


def test_model_warnings_reach_the_results(tmp_path, capsys):
    def noted(cfg):
        model = load_version("v1").build_model(cfg)
        model.run_warnings = ["kernels ran in an interpreter"]
        return model
    code, _, out = _run_in_process(noted, tmp_path, capsys)
    # The model's warning comes first; timing warnings (a loaded machine can make the backward
    # look faster than the forward) may follow it.
    assert code == 0 and load(out)["warnings"][:1] == ["kernels ran in an interpreter"]
