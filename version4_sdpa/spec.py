"""Version 4 declared once: V2's fusions and the SDPA backend (harness/spec.py says who reads this)."""
from harness.spec import Switch, VersionSpec
from version2_fused.spec import FUSIONS

# --sdpa-backend's choices, each with the torch.nn.attention.SDPBackend member it forces
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION", "math": "MATH"}

SPEC = VersionSpec(
    name="v4", adds="PyTorch SDPA (vendor flash kernels), CUDA/HIP graphs",
    modes=("eager", "compile", "reduce-overhead", "max-autotune", "compile-master",
           "reduce-overhead-master"),
    memory={"attention": "flash", "gqa_native": True},
    switches=FUSIONS + (
        # SDPA's math backend materialises the scores like V1
        Switch("sdpa_backend", "attention kernel: auto lets PyTorch choose; the others force one "
               "(an unavailable one is an error)", default="auto", choices=("auto", *BACKENDS),
               memory={"math": {"attention": "explicit"}}),
        # chosen by the preflight: the kernel that runs, and whether k/v are repeated per head
        Switch("sdpa_kernel", "the SDPA kernel that runs", default=None, flag=False, memory={}),
        Switch("gqa", "grouped-query attention: native, repeat or n/a (MHA)", default=None,
               flag=False, memory={"repeat": {"gqa_native": False}}),
    ))
