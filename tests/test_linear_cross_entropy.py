"""linear_cross_entropy: the output layer and the loss a chunk of rows at a time, the loss
and its gradient from one Triton kernel (kernels/linear_cross_entropy.py).

Checked against float64 PyTorch (F.linear then F.cross_entropy) on a CPU in Triton's
interpreter, fp32: a vocabulary that is not a power of two and spans several column blocks,
chunks that do not divide the rows, one chunk for all. Outputs are filled with NaN before
the kernel writes them. On a GPU (make test's GPU marker): bf16 under autocast against the
direct way, and a peak memory that never holds the whole logits.
"""
import importlib

import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_GPU

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")
# the module (the package exports the function of the same name)
lce = importlib.import_module("version3_triton.kernels.linear_cross_entropy")

DEVICE = "cuda" if HAS_GPU else "cpu"
pytestmark = pytest.mark.usefixtures("poisoned_kernels")


def problem(rows, d, vocab, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, d, generator=g)
    weight = torch.randn(vocab, d, generator=g) / d ** 0.5
    targets = torch.randint(0, vocab, (rows,), generator=g)
    return h.to(device), weight.to(device), targets.to(device)


def loss_and_grads(fn, h, weight, targets, dtype, scale=1.0):
    h, weight = (t.detach().to(dtype).requires_grad_() for t in (h, weight))
    loss = fn(h, weight, targets)
    (loss * scale).backward()
    return loss.detach(), h.grad, weight.grad


@pytest.mark.parametrize("rows, vocab, chunk", [(37, 300, 16), (5, 40, None)],
                         ids=["3-chunks-ragged-vocab", "one-chunk"])
def test_loss_and_gradients_match_fp64(rows, vocab, chunk, monkeypatch):
    """The kernel's column block is forced small (BLOCK_V 16 on a 300-word vocabulary: 19
    blocks, the last one ragged), so both passes loop."""
    monkeypatch.setattr(lce, "_block", lambda n_vocab: 16)
    h, weight, targets = problem(rows, 24, vocab)
    got = loss_and_grads(lambda a, b, t: tk.linear_cross_entropy(a, b, t, chunk), h, weight,
                         targets, torch.float32, scale=0.5)
    want = loss_and_grads(lce.linear_cross_entropy_reference, h, weight, targets, torch.float64,
                          scale=0.5)
    for name, a, b in zip(["loss", "d h", "d weight"], got, want):
        assert torch.isfinite(a).all(), f"{name}: non-finite values (unwritten output?)"
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_batch_shaped_input_and_bad_targets():
    """(batch, seq, d) hidden states and (batch, seq) targets, as the model has them; targets
    that do not match the rows are one clear error."""
    h, weight, targets = problem(12, 8, 50)
    got = tk.linear_cross_entropy(h.view(3, 4, 8), weight, targets.view(3, 4))
    torch.testing.assert_close(got, F.cross_entropy(h @ weight.T, targets), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one index per row"):
        tk.linear_cross_entropy(h, weight, targets[:5])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm GPU")
def test_bf16_under_autocast_matches_the_direct_way_without_the_whole_logits():
    """The medium model's head (d 1024, vocab 32,000 at the large preset) on 8 x 512 rows:
    the same loss and gradients as autocast's F.linear + fp32 cross-entropy, and a peak
    that stays below what one fp32 copy of the whole logits would add."""
    h, weight, targets = problem(4096, 1024, 32000)
    h = h.to(torch.bfloat16)

    def run(fn):
        leaf_h, leaf_w = h.detach().requires_grad_(), weight.detach().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(leaf_h, leaf_w, targets)
        loss.backward()
        torch.cuda.synchronize()
        return loss.detach(), leaf_h.grad, leaf_w.grad, torch.cuda.max_memory_allocated() - start

    def direct(a, b, t):
        return F.cross_entropy(F.linear(a, b).float(), t)

    *got, got_peak = run(tk.linear_cross_entropy)
    *want, _ = run(direct)
    for name, a, b in zip(["loss", "d h", "d weight"], got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3, msg=name)
    assert got_peak < 4096 * 32000 * 4, f"peak {got_peak / 2**20:.0f} MiB holds whole logits"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_weight_gradient_sums_its_chunks_in_fp32(dtype, monkeypatch):
    """Each chunk's d weight is added into one fp32 matrix: by one GEMM that adds in place
    where BLAS writes fp32 from bf16 (asked once per device type, on a small case): the
    fp32 sum of the exact products; else the product, rounded to bf16, and a sum."""
    monkeypatch.setattr(lce, "_ADDS_IN_PLACE", {})
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(shape, generator=g).to(DEVICE, dtype) for shape in ((40, 24), (24, 32)))
    total = torch.randn(40, 32, generator=g).to(DEVICE)
    for _ in range(2):  # the first call asks, the second knows
        got = total.clone()
        lce._add_product(got, a, b)
        exact = dtype == torch.float32 or lce._ADDS_IN_PLACE[a.device.type]
        want = total.double() + (a.double() @ b.double() if exact else (a @ b).double())
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    if dtype != torch.float32:
        assert list(lce._ADDS_IN_PLACE) == [a.device.type]
        if DEVICE == "cpu":
            assert lce._ADDS_IN_PLACE["cpu"] is False  # (no fp32-output GEMM from bf16 on a CPU)
