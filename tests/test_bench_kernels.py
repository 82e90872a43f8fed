"""The kernel benchmark (benchmarks/bench_kernels.py) end to end: its quick mode writes
every timing column."""
import json

import pytest

tk = pytest.importorskip("version3_triton.kernels", reason="needs triton")

pytestmark = pytest.mark.usefixtures("poisoned_kernels")


@pytest.mark.slow  # the kernel benchmark end to end in the interpreter: make test-slow
def test_bench_kernels_quick_runs_and_reports_host_overhead(tmp_path, capsys):
    """The kernel benchmark's smoke mode (interpreter on a CPU, tiny shapes on a GPU)
    writes every timing column, including the host-overhead ones."""
    from benchmarks import bench_kernels

    out = tmp_path / "k.json"
    assert bench_kernels.main(["--quick", "--output", str(out)]) == 0
    assert "Host overhead per forward+backward call" in capsys.readouterr().out
    result = json.loads(out.read_text())
    for row in result["rmsnorm"] + result["attention"]:
        assert {"fwd_bwd_extra_ms", "fwd_bwd_host_ms", "fwd_bwd_graph_ms",
                "fwd_bwd_graph_error"} <= row.keys()
    assert set(tk.KERNEL_NAMES) - {"rope", "cross_entropy"} <= set(result["kernel_configs"])  # not benched
