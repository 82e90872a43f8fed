"""Version 2 declared once: its fusions, each a switch (harness/spec.py says who reads this)."""
from harness.spec import Switch, VersionSpec


def _saved_like(field: str, on) -> dict:
    """memory of a fusion that changes one Implementation field: on -> `on`, off -> False."""
    return {True: {field: on}, False: {field: False}}


# V3 and V4 keep these switches: they are V2 plus one idea each.
FUSIONS = (
    Switch("fused_qkv", "one GEMM for q, k and v", memory=_saved_like("fused_qkv", True)),
    Switch("fused_gate_up", "one GEMM for the MLP's gate and up projections",
           memory=_saved_like("fused_gate_up", True)),
    # F.rms_norm and the generated SiLU*mul are fused kernels on GPUs only (V1's maths on a CPU)
    Switch("fused_rmsnorm", "RMSNorm as one kernel (F.rms_norm)",
           memory=_saved_like("fused_norm", "gpu")),
    Switch("fused_swiglu", "SiLU(gate)*up as one generated kernel (GPU, without --compile)",
           memory=_saved_like("fused_swiglu", "gpu")),
)

SPEC = VersionSpec(
    name="v2", adds="fused projections and ops, torch.compile", modes=("eager", "compile"),
    memory={"attention": "explicit"}, switches=FUSIONS)
