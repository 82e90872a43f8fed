"""--optimizer master: bf16 weights in the model, fp32 masters in the optimizer.

The claim (harness/master_weights.py) is "the same arithmetic as bf16 autocast,
without the casts". Checked piece by piece on the CPU: the update is
torch.optim.AdamW's, the gradients are autocast's, and a short training run
follows the autocast run's losses.
"""
import json

import pytest
import torch

from harness.master_weights import MasterWeightAdamW, adamw_step, split_master_weights
from tests.conftest import load_version, run_cli

from harness.config import PRESETS

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def tiny_v1(**overrides):
    v1 = load_version("v1")
    torch.manual_seed(0)
    return v1.build_model(PRESETS["tiny"].model.replace(**overrides))


def test_update_is_torch_adamw():
    torch.manual_seed(0)
    ours = [torch.randn(5, 7), torch.randn(11)]
    theirs = [torch.nn.Parameter(p.clone()) for p in ours]
    reference = torch.optim.AdamW(theirs, foreach=False, **HYPER)
    moments = [[torch.zeros_like(p) for p in ours] for _ in range(2)]
    step = torch.zeros(1)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in ours]
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        reference.step()
        adamw_step(ours, grads, *moments, [], step, lr=HYPER["lr"], beta1=0.9, beta2=0.95,
                   eps=1e-8, weight_decay=HYPER["weight_decay"])
    for mine, ref in zip(ours, theirs):
        torch.testing.assert_close(mine, ref.detach(), rtol=1e-6, atol=1e-7)


def test_split_keeps_embeddings_norms_and_tied_weights_fp32():
    model = tiny_v1()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    masters = split_master_weights(model)
    named = dict(model.named_parameters())
    for name, p in named.items():
        is_linear = isinstance(model.get_submodule(name.rsplit(".", 1)[0]), torch.nn.Linear)
        assert p.dtype == (torch.bfloat16 if is_linear else torch.float32), name
        if is_linear:
            assert torch.equal(masters[p], before[name])  # the master is the exact fp32 value
            assert torch.equal(p, before[name].to(torch.bfloat16))
    tied = tiny_v1(tie_embeddings=True)
    split_master_weights(tied)
    assert tied.lm_head.weight.dtype == torch.float32  # shared with the embedding: stays fp32


def test_gradients_are_autocasts():
    """Same bf16 weights, same GEMMs: each weight gradient equals autocast's, bit for bit."""
    reference, ours = tiny_v1(), tiny_v1()
    split_master_weights(ours)
    ids = torch.randint(0, PRESETS["tiny"].model.vocab_size, (2, 16))
    for model in (reference, ours):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten()).backward()
    for (name, ref), mine in zip(reference.named_parameters(), ours.parameters()):
        assert mine.grad.dtype == mine.dtype
        torch.testing.assert_close(mine.grad.float(), ref.grad, rtol=0, atol=0, msg=name)


def test_optimizer_refreshes_bf16_copies():
    model = tiny_v1()
    masters = split_master_weights(model)
    optimizer = MasterWeightAdamW(model.parameters(), masters, **HYPER)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    for p, master in masters.items():
        assert not torch.equal(master.to(torch.bfloat16), p.new_zeros(p.shape))
        assert torch.equal(p, master.to(torch.bfloat16))
    assert all(state["step"].item() == 1 for state in optimizer.state.values())


def run(tmp_path, name, *flags):
    out = tmp_path / f"{name}.json"
    device = [] if "--device" in flags else ["--device", "cpu"]
    proc = run_cli(["version4_sdpa/tiny_llama_v4.py", "--preset", "tiny", *device,
                    "--precision", "bf16", "--num-steps", "4", "--warmup-steps", "1",
                    "--quiet", "--output", out, *flags])
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_training_follows_autocast(tmp_path):
    plain = run(tmp_path, "fused", "--optimizer", "fused")
    master = run(tmp_path, "master", "--optimizer", "master")
    assert master["run"]["optimizer"] == "master"
    assert master["losses"][0] == plain["losses"][0]  # step 1: identical forward
    assert master["losses"] == pytest.approx(plain["losses"], rel=1e-4)


@pytest.mark.parametrize("flags, message", [
    (["--precision", "fp32"], "needs --precision bf16"),
    (["--precision", "bf16", "--grad-accum", "2"], "--grad-accum"),
])
def test_refuses_what_it_cannot_match(tmp_path, capsys, flags, message):
    out = tmp_path / "r.json"
    code = load_version("v4").main(["--preset", "tiny", "--device", "cpu", "--num-steps", "2",
                                    "--warmup-steps", "0", "--optimizer", "master",
                                    "--output", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.gpu
def test_compiled_update_matches_eager_on_gpu():
    """On a GPU the update is torch.compile'd: same numbers as the eager code above."""
    torch.manual_seed(0)
    shapes = [(1024, 3072), (1024,), (1000, 1024)]
    eager = [torch.randn(s, device="cuda") for s in shapes]
    params = [torch.nn.Parameter(p.to(torch.bfloat16)) for p in eager[:2]] + \
        [torch.nn.Parameter(eager[2].clone())]
    masters = {params[0]: eager[0].clone(), params[1]: eager[1].clone()}
    optimizer = MasterWeightAdamW(params, masters, **HYPER)
    moments = [[torch.zeros_like(p) for p in eager] for _ in range(2)]
    step = torch.zeros(1, device="cuda")
    for _ in range(3):
        grads = [torch.randn(s, device="cuda").to(torch.bfloat16) for s in shapes[:2]] + \
            [torch.randn(shapes[2], device="cuda")]
        for p, g in zip(params, grads):
            p.grad = g
        optimizer.step()
        adamw_step(eager, grads, *moments, [], step, lr=HYPER["lr"], beta1=0.9, beta2=0.95,
                   eps=1e-8, weight_decay=HYPER["weight_decay"])
    mine = [masters[params[0]], masters[params[1]], params[2].detach()]
    for m, e in zip(mine, eager):
        torch.testing.assert_close(m, e, rtol=1e-6, atol=1e-6)
    assert torch.equal(params[0].detach(), mine[0].to(torch.bfloat16))


@pytest.mark.gpu
def test_training_follows_autocast_on_gpu(tmp_path):
    flags = ["--device", "cuda"]  # the update is compiled on a GPU; the model need not be
    plain = run(tmp_path, "fused", "--optimizer", "fused", *flags)
    master = run(tmp_path, "master", "--optimizer", "master", *flags)
    assert master["losses"] == pytest.approx(plain["losses"], rel=1e-3)
