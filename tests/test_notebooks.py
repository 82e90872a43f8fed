"""The instructor notebooks run top to bottom (CPU: tiny shapes), and are committed clean."""
import json
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
