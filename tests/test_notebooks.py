"""The instructor notebooks run top to bottom (CPU: tiny shapes), and are committed clean."""
import json
import os
import subprocess
import time

import pytest

from conftest import REPO, run_cli

NOTEBOOKS = sorted((REPO / "exercises" / "notebooks").glob("*.ipynb"))
CPU_BUDGET_S = 90  # each notebook is meant to take < 60 s on a CPU; some slack for busy CI


def test_there_are_four_notebooks_committed_without_outputs():
    assert len(NOTEBOOKS) >= 4
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


def test_notebooks_match_their_generator():
    pytest.importorskip("nbformat")
    proc = run_cli([REPO / "tools" / "make_notebooks.py", "--check"], timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow  # ~35 s each on a 2-core CPU; their generator's check runs in make test
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(path, as_version=4)
    # The notebooks write results under the repo's results/ (git-ignored); keep CI runs apart.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    start = time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: {str(e)[-2000:]}")
    elapsed = time.perf_counter() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.get("output_type") == "error"]
    assert not errors
    import torch
    if not torch.cuda.is_available():
        assert elapsed < CPU_BUDGET_S, f"{path.name} took {elapsed:.0f} s on a CPU"


def test_notebook_02_counts_operators_without_profiler_noise(capfd):
    """The profiler's C++ side prints start/stop lines for every profile: 12 lines of noise
    under notebook 02's operator counts, unless the cell filters them."""
    pytest.importorskip("nbformat")
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    import make_notebooks
    import pandas as pd
    import torch

    from harness import PRESETS
    from version1_baseline import tiny_llama_v1 as v1
    from version2_fused import tiny_llama_v2 as v2

    cell = next(source for kind, source in make_notebooks.NB2 if "def count_ops" in source)
    cell = cell.split("\nvariants = ")[0]  # the function alone: one model counted is enough
    cfg = PRESETS["tiny"].model
    scope = {"torch": torch, "pd": pd, "cfg": cfg, "v1": v1, "v2": v2,
             "ids": torch.randint(0, cfg.vocab_size, (2, 16))}
    exec(cell, scope)
    assert scope["count_ops"](v1.build_model(cfg))["aten::mm"] > 0
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err, err


def _make_dry_run(target, tmp_path, uid):
    """What `make -n TARGET` would run, for a user whose id is uid (a stand-in `id`)."""
    (tmp_path / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (tmp_path / "id").chmod(0o755)
    proc = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_notebooks_starts_jupyter_as_root_too(tmp_path):
    assert "jupyter lab exercises/notebooks/ --allow-root" in _make_dry_run("notebooks", tmp_path, 0)
    assert "--allow-root" not in _make_dry_run("notebooks", tmp_path, 1000)


def test_make_check_notebooks_runs_every_notebook_headless(tmp_path):
    out = _make_dry_run("check-notebooks", tmp_path, 1000)
    command = next(line for line in out.splitlines() if "pytest" in line)
    assert "tests/test_notebooks.py" in command and " -m " not in command.split("pytest", 1)[1]  # slow too


def test_the_docs_install_the_notebooks_into_the_projects_environment():
    """A bare `pip` is the system's, outside .venv: the docs say `make notebooks`."""
    docs = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "setup").glob("*.md"),
            *(REPO / "exercises").rglob("*.md")]
    for path in docs:
        text = path.read_text()
        assert '.[notebooks]"' not in text and "pip install jupyterlab" not in text, path
    assert "make notebooks" in (REPO / "setup" / "INSTALL.md").read_text()
    assert "make check-notebooks" in (REPO / "README.md").read_text()
