"""Shared test helpers.

On a machine without a GPU, Triton kernels run in the interpreter: the
variable must be set before triton is first imported, so it is set here.
"""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

VERSION_MODULES = {"v1": "version1_baseline.tiny_llama_v1", "v2": "version2_fused.tiny_llama_v2",
                   "v3": "version3_triton.tiny_llama_v3", "v4": "version4_sdpa.tiny_llama_v4"}


def load_version(version: str):
    """Import a version's model module, or skip the test if it does not exist yet."""
    name = VERSION_MODULES[version]
    if not (REPO / (name.replace(".", "/") + ".py")).exists():
        pytest.skip(f"{version} not written yet")
    return importlib.import_module(name)


def run_cli(args, cwd=REPO, env=None, timeout=300):
    """Run a command line as an attendee would; returns CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm GPU")
