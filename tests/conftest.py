"""Shared test helpers.

On a machine without a GPU, Triton kernels run in the interpreter: the
variable must be set before triton is first imported, so it is set here.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The command lines the tests run start a fresh Python each. Where the packages were
# installed without their compiled bytecode and PYTHONDONTWRITEBYTECODE is set (common in
# containers), each start recompiles torch's modules (~5 s on a GPU machine). They share
# one bytecode cache under results/ instead (never beside the sources). Where pip compiled
# them at install (the project's own venv), that bytecode is used as it is: a cache prefix
# would hide it and a fresh clone would compile torch again into an empty cache.
import importlib.util  # noqa: E402

_TORCH_BYTECODE = Path(importlib.util.cache_from_source(torch.__file__))
if "PYTHONPYCACHEPREFIX" not in os.environ and not _TORCH_BYTECODE.exists():
    os.environ["PYTHONPYCACHEPREFIX"] = str(REPO / "results" / ".pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Under pytest-xdist (make test: one worker per core) each worker and the command lines it
# starts compute on one thread: two workers on two cores, not four threads fighting for them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness import config  # noqa: E402  (after the TRITON_INTERPRET default above)


def load_version(version: str):
    """Import a version's model module, or skip the test if it does not exist yet."""
    if not (REPO / config.VERSIONS[version].script).exists():
        pytest.skip(f"{version} not written yet")
    return config.load_version(version)


def as_if_under_torchrun(monkeypatch, world_size: int = 2) -> None:
    """The variables torchrun sets in each process it starts (no process group is joined)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": str(world_size), "MASTER_ADDR": "localhost",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)


def run_cli(args, cwd=REPO, env=None, timeout=300):
    """Run a command line as an attendee would; returns CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def poisoned_kernels(monkeypatch):
    """V3's Triton kernels with NaN-filled outputs (an element a kernel forgets to write
    fails the comparison), no autotuning (on a GPU it would compile every candidate again
    for each odd test shape) and no launch configuration forced from Python or the
    environment. Modules of kernel tests use it for every test (pytestmark)."""
    from version3_triton.kernels import common, configs

    monkeypatch.setattr(common, "POISON_OUTPUTS", True)
    monkeypatch.setattr(configs, "AUTOTUNE", False)
    monkeypatch.setattr(configs, "FORCED_CONFIGS", configs.ForcedConfigs())
    for name in configs.ENV_NAMES.values():
        monkeypatch.delenv(name, raising=False)


def aten_ops_of(run) -> set:
    """The names of the aten operators PyTorch dispatches while run() runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    names = set()
    with Recorder():
        run()
    return names


def pytest_collection_modifyitems(config, items):
    """Tests marked @pytest.mark.gpu skip on a machine without a GPU; `pytest -m gpu` runs them all."""
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
