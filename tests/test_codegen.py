"""Version 3's kernels compiled for AMD and NVIDIA GPUs on this (CPU) machine.

`python -m version3_triton.codegen` compiles every launch configuration the
chooser can pick and reads registers, spills, LDS and matrix instructions from
the compiler's output. On the GPUs the kernels are tuned for - MI200 (gfx90a),
MI300X (gfx942), MI350 (gfx950), A100 (sm_80), H100/H200 (sm_90) - nothing the
chooser can pick may spill registers or exceed shared memory, and attention must
run on the matrix units. `make test` runs the workshop's case (bf16, head size 64);
the full table (fp16, head size 128, every target) is marked slow:

    python -m pytest tests/test_codegen.py -m slow
    python -m version3_triton.codegen            # the same table, printed
"""
import json
import os
import sys

import pytest

from conftest import REPO, run_cli

pytest.importorskip("triton", reason="needs triton")
TUNED = "gfx90a,gfx942,gfx950,sm_80,sm_90"


def codegen_table(tmp_path, *args) -> dict:
    out = tmp_path / "codegen.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = run_cli(["-m", "version3_triton.codegen", "--json", out, *args], env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def check_tuned(table: dict) -> None:
    rows = table["rows"]
    assert rows, "nothing compiled"
    for r in rows:
        where = f"{r['target']} {r['kernel']} {r['dtype']} D{r['width']} {r['config']}"
        assert "error" not in r, f"{where}: {r['error']}"
        assert r["spills"] == 0, f"{where}: spills {r['spills']}"
        assert r["shared"] <= r["limit"], f"{where}: {r['shared']} bytes of shared memory"
        if r["kernel"].startswith("attn"):
            assert r["matrix"], f"{where}: no matrix instructions"


def test_tuned_targets_never_spill_bf16_head_dim_64(tmp_path):
    check_tuned(codegen_table(tmp_path, "--targets", TUNED, "--dtypes", "bf16",
                              "--head-dims", "64"))


@pytest.mark.slow
def test_tuned_targets_never_spill_full_table(tmp_path):
    check_tuned(codegen_table(tmp_path, "--targets", TUNED))


def test_mi50_table_shows_no_matrix_cores(tmp_path):
    """gfx906 has no MFMA: the table says so (and V3 warns at run time)."""
    table = codegen_table(tmp_path, "--targets", "gfx906", "--kernels", "attn_fwd",
                          "--dtypes", "fp16", "--head-dims", "64")
    assert table["rows"] and not table["summary"]["gfx906"]["attention_matrix"]
