"""Version 3's kernels compiled for AMD and NVIDIA GPUs on this (CPU) machine.

`python -m benchmarks.codegen` compiles every launch configuration the
chooser can pick and reads registers, spills, LDS and matrix instructions from
the compiler's output. On the GPUs the kernels are tuned for - MI200 (gfx90a),
MI300X (gfx942), MI350 (gfx950), A100 (sm_80), H100/H200 (sm_90) - nothing the
chooser can pick may spill registers (except where attention_tables.SPILLS_THAT_PAY says a
spilling tile was measured faster) or exceed shared memory, and attention must run on
the matrix units. `make test` runs the workshop's case (bf16, head size 64);
the full table (fp16, head size 128, the Hopper path's Gluon kernels on sm_90, every target) is
marked slow:

    python -m pytest tests/test_codegen.py -m slow
    python -m benchmarks.codegen            # the same table, printed
"""
import json
import os

import pytest

from conftest import run_cli

pytest.importorskip("triton", reason="needs triton")
# (not benchmarks.codegen: importing it switches this process out of the interpreter)
from version3_triton.kernels.attention_tables import SPILLS_THAT_PAY  # noqa: E402

TUNED = "gfx90a,gfx942,gfx950,sm_80,sm_90"


def codegen_table(tmp_path, *args) -> dict:
    out = tmp_path / "codegen.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # The full table compiles a few hundred kernels: from a cold Triton cache on 2 cores, beside
    # the other slow tests, that can take longer than 15 minutes (a minute or two once cached)
    proc = run_cli(["-m", "benchmarks.codegen", "--json", out, *args], env=env, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def check_tuned(table: dict) -> None:
    rows = table["rows"]
    assert rows, "nothing compiled"
    for r in rows:
        where = f"{r['target']} {r['kernel']} {r['dtype']} D{r['width']} {r['config']}"
        assert "error" not in r, f"{where}: {r['error']}"
        # NVIDIA architectures name their own configuration family ("sm_90")
        measured_faster = (r["target"], r["kernel"], r["width"]) in SPILLS_THAT_PAY
        if r.get("rope") or r.get("hopper") or not measured_faster:
            assert r["spills"] == 0, f"{where}: spills {r['spills']}"
        assert r["shared"] <= r["limit"], f"{where}: {r['shared']} bytes of shared memory"
        if r["kernel"].startswith("attn"):
            assert r["matrix"], f"{where}: no matrix instructions"


def test_flagship_targets_never_spill_bf16_head_dim_64(tmp_path):
    """MI300X, the primary target, at the workshop's head size; every tuned target (MI200,
    MI355X, A100, H100), dtype and head size: the full table below (make test-slow)."""
    check_tuned(codegen_table(tmp_path, "--targets", "gfx942", "--dtypes", "bf16",
                              "--head-dims", "64"))


@pytest.mark.slow
def test_tuned_targets_never_spill_full_table(tmp_path):
    check_tuned(codegen_table(tmp_path, "--targets", TUNED))


@pytest.mark.slow
def test_mi50_table_shows_no_matrix_cores(tmp_path):
    """gfx906 has no MFMA: the table says so (and V3 warns at run time)."""
    table = codegen_table(tmp_path, "--targets", "gfx906", "--kernels", "attn_fwd",
                          "--dtypes", "fp16", "--head-dims", "64")
    assert table["rows"] and not table["summary"]["gfx906"]["attention_matrix"]


SEQUENCE_OF_ONE = """
import sys, triton
from triton.compiler import ASTSource
from benchmarks import codegen
for kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
    job = next(j for j in codegen.jobs(["gfx942"], [kernel], ["bf16"], [64]) if j["rope"])
    fn = codegen.kernel_fn(kernel)
    constexprs = dict(codegen.constexprs_for(job), N_CTX=1)
    source = ASTSource(fn=fn, signature=codegen.signature(fn, "bf16", constexprs,
                                                          codegen.fp32_pointers(kernel)),
                       constexprs=constexprs)
    options = {k: v for k, v in job["config"].items() if not k.isupper()}
    triton.compile(source, target=codegen.gpu_target("gfx942"), options=options)
    print(kernel, "compiles")
"""


@pytest.mark.slow
def test_rotating_attention_compiles_when_the_sequence_length_is_one():
    """Triton turns an integer argument equal to 1 into a compile-time constant (and so
    does Inductor's analysis of a kernel): the one-trip loop that fences RoPE's rotation
    must still compile then - a sequence of length 1 on a GPU."""
    proc = run_cli(["-c", SEQUENCE_OF_ONE], env={"TRITON_INTERPRET": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("compiles") == 3, proc.stdout
