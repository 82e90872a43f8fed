"""Version 1 declared once: plain PyTorch, no switches (harness/spec.py says who reads this)."""
from harness.spec import VersionSpec

SPEC = VersionSpec(
    name="v1", adds="plain PyTorch, written to be read: the baseline", modes=("eager",),
    # explicit attention: the T x T scores are saved, and cast to fp32 before softmax (a copy)
    memory={"attention": "explicit", "scores_fp32_copy": True})
