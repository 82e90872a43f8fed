"""Flash attention's launch tables (kernels/attention_tables.py): AMD's LDS budget, legal
block shapes per GPU family, the head-size lists. Whether each candidate compiles without
spilling: test_codegen.py; whether each computes the right numbers: test_flash_attention.py."""
import pytest

pytest.importorskip("version3_triton.kernels", reason="needs triton")
from version3_triton.kernels import attention_tables, common, configs  # noqa: E402
from kernel_checks import ATTENTION_KERNELS, TARGETS, family_configs  # noqa: E402


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_amd_configs_fit_in_64_kib_of_lds(kernel):
    """MI200/MI300 give a workgroup 64 KiB of LDS (H100: 227 KiB). Every AMD candidate
    fits at the workshop's head size 64 in bf16, and whatever the prune lets the
    autotuner pick for any head size (16..128) and dtype stays within 64 KiB."""
    target, spec = common.amd_target("gfx942"), configs.SPECS[kernel]
    for config in attention_tables.attention_configs(kernel, target):
        need = spec.shared_bytes(config, 64, 2)
        assert need <= target.shared_bytes, f"{config} needs {need} bytes"
    for width in (16, 32, 64, 96, 128):
        for elem_bytes in (2, 4):
            allowed = configs.candidates(spec, target, width, elem_bytes)
            assert allowed, (width, elem_bytes)
            for config in allowed:
                assert spec.shared_bytes(config, width, elem_bytes) <= target.shared_bytes


def test_configs_are_legal_block_shapes_per_family():
    """Every family's lists: whole tiles on the diagonal, AMD-only compiler options in
    the AMD lists only, and on the GPUs of tests/test_codegen.py (and MI50) two
    candidates or more that fit in shared memory for every head size up to 128."""
    families = {"sm_90", "sm_80", "cdna2", "cdna3", "hip", "interpreter"}
    assert {attention_tables.config_family(t) for t in TARGETS.values()} == families - {"interpreter"}
    for kernel, tables in attention_tables.ATTENTION_CONFIGS.items():
        assert set(tables) == families
        for family in families:
            for c in family_configs(kernel, family):
                m, n = c["BLOCK_M"], c["BLOCK_N"]
                assert (n % m if kernel == "attn_bwd_dkdv" else m % n) == 0, (kernel, c)
                amd_only = {"waves_per_eu", "matrix_instr_nonkdim"} & set(c)
                assert not amd_only or family in ("cdna2", "cdna3", "hip"), (kernel, family, c)
        for name in ("sm_90", "sm_80", "gfx90a", "gfx942", "gfx950", "gfx906"):
            target, spec = TARGETS[name], configs.SPECS[kernel]
            for head_dim in (16, 64, 96, 128):
                assert len(configs.candidates(spec, target, head_dim, 2)) >= 2, (name, head_dim)
    mi50 = configs.usable_on(family_configs("attn_fwd", "hip")[0], common.amd_target("gfx906"))
    assert "matrix_instr_nonkdim" not in mi50 and "waves_per_eu" in mi50  # no MFMA on an MI50


def test_head_size_picks_the_list():
    """Head sizes up to 64 use a family's first list, 65..128 the second; without a
    head size, every candidate of the family (what the autotuner is built with)."""
    h100, fwd = TARGETS["sm_90"], attention_tables.ATTENTION_CONFIGS["attn_fwd"]["sm_90"]
    assert attention_tables.attention_configs("attn_fwd", h100, 64) == fwd[64]
    assert attention_tables.attention_configs("attn_fwd", h100, 32) == fwd[64]
    assert attention_tables.attention_configs("attn_fwd", h100, 96) == fwd[128]
    union = attention_tables.attention_configs("attn_fwd", h100)
    assert all(c in union for c in fwd[64] + fwd[128]) and len(union) == len(fwd[64])
