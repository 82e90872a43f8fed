"""Parsers of every profiler into the common kernel table (pure Python, no torch, fast).

Fixtures (tests/fixtures/profilers/, see its README.md):
  nvidia_h200/  real outputs from an NVIDIA H200 (ncu 2025.3.1, torch 2.11)
  rocprofv3/, rocprof_compute/, nsys/  synthetic rows under the documented headers
"""
import json
import os
import shutil
from pathlib import Path

import pytest

import profiling
from profiling import kernel_table as kt
from profiling import ncu, nsys, rocprof_compute, rocprofv3, torch_profiler
from profiling.__main__ import main as cli_main

FIX = Path(__file__).parent / "fixtures" / "profilers"
GEMM = "Cijk_Alik_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0"


# ----------------------------------------------------------------- categories
@pytest.mark.parametrize("name, category", [
    ("nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    (GEMM, "gemm"),
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::linear", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("attn_fwd", "attention"), ("flash_attention_prefill_f16", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(T4 *, const T2 *, int)", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)", "other"),
    ("aten::_log_softmax", "other"),
    ("rmsnorm_forward_kernel", "norm"), ("aten::native_layer_norm", "norm"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
    ("triton_poi_fused__to_copy_mul_silu_0", "elementwise"),
    ("void at::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void "
     "templates::normal_and_transform<float, float>>", "elementwise"),  # "normal" is not a norm
    ("void at::vectorized_elementwise_kernel<4, at::GeluCUDAKernelImpl>", "elementwise"),
    ("aten::mul", "elementwise"), ("swiglu_fwd_kernel", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor>",
     "optimizer"),
    ("aten::_foreach_add_", "optimizer"),
    ("Memset (Device)", "copy"), ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("__amd_rocclr_copyBuffer", "copy"), ("aten::copy_", "copy"),
    ("void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda>", "copy"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long>", "copy"),
    ("some_unknown_kernel", "other"),
])
def test_categorize(name, category):
    assert kt.categorize(name) == category


# ----------------------------------------------------------------- the table itself
def test_table_from_launches_aggregates_and_shares():
    table = kt.from_launches([kt.Launch("aten::mm", 3000, flops=10.0), kt.Launch("aten::mm", 1000, flops=6.0),
                              kt.Launch("aten::add", 4000)], "test")
    mm, add = table.rows
    assert (mm.name, mm.calls, mm.total_us, mm.mean_us, mm.flops) == ("aten::mm", 2, 4.0, 2.0, 16.0)
    assert (add.flops, add.bytes) == (None, None)
    assert mm.share == add.share == 0.5
    assert table.by_category()["gemm"] == 0.5


def test_csv_round_trip(tmp_path):
    table = kt.from_launches([kt.Launch("nvjet_a", 1234.5, 2.0 ** 50, 1e9), kt.Launch("b", 7.25)], "x")
    back = kt.read_csv(kt.write_csv(table, tmp_path / "t.csv"))
    assert back.rows == table.rows
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == ",".join(kt.COLUMNS)
    with pytest.raises(kt.ProfileParseError, match="not a kernel table"):
        kt.read_csv(FIX / "rocprofv3" / "kernel_stats.csv")


# ----------------------------------------------------------------- rocprofv3
# Every dispatch of the fixtures: 9 dispatches, 172 us; 8 of them (132 us)
# start inside the "profiled_window" marker.
@pytest.mark.parametrize("variant", ["rocm6.2", "rocm6.3", "rocm6.4", "rocm7.0", "rocpd_convert"])
def test_rocprofv3_kernel_trace_every_header(variant):
    path = FIX / "rocprofv3" / f"kernel_trace_{variant}.csv"
    table = profiling.parse(path, "rocprofv3")
    gemm = table.rows[0]
    assert (gemm.name, gemm.category, gemm.calls, gemm.total_us) == (GEMM, "gemm", 3, 120.0)
    assert len(table.rows) == 6 and table.total_us == pytest.approx(172.0)


def test_rocprofv3_folder_counts_only_the_window(tmp_path):
    for src, dst in [("kernel_trace_rocm7.0.csv", "v1_kernel_trace.csv"),
                     ("marker_api_trace.csv", "v1_marker_api_trace.csv")]:
        shutil.copy(FIX / "rocprofv3" / src, tmp_path / dst)
    table = profiling.parse(tmp_path)
    assert table.source == "rocprofv3"
    assert table.total_us == pytest.approx(132.0) and table.rows[0].calls == 2
    assert "profiled_window" in table.notes[0]
    (tmp_path / "v1_marker_api_trace.csv").unlink()
    assert profiling.parse(tmp_path).total_us == pytest.approx(172.0)


def test_rocprofv3_stats_and_counters(tmp_path):
    stats = rocprofv3.read_kernel_stats(FIX / "rocprofv3" / "kernel_stats.csv")
    assert [(r.name, r.calls, r.total_us) for r in stats.rows[:2]] == [(GEMM, 3, 120.0), ("attn_fwd", 1, 20.0)]
    new = rocprofv3.read_counter_collection(FIX / "rocprofv3" / "counter_collection_rocm7.0.csv")
    old = rocprofv3.read_counter_collection(FIX / "rocprofv3" / "counter_collection_oct2024.csv")
    assert [d["SQ_WAVES"] for d in new] == [d["SQ_WAVES"] for d in old] == [2048.0, 4096.0]
    assert new[0]["duration_ns"] == 40000 and "duration_ns" not in old[0]
    with pytest.raises(kt.ProfileParseError, match="kernel_trace"):
        rocprofv3.parse(tmp_path)


# ----------------------------------------------------------------- rocprof-compute
def test_roofline_every_variant():
    mi200 = rocprof_compute.read_roofline(FIX / "rocprof_compute" / "mi200" / "roofline.csv")[0]
    mid = rocprof_compute.read_roofline(FIX / "rocprof_compute" / "roofline_mid2025.csv")
    mi300 = rocprof_compute.read_roofline(FIX / "rocprof_compute" / "mi300" / "roofline.csv")[0]
    for metrics in (mi200, mid[0], mid[1], mi300):
        # "hbmBwHigh" (typo) lands next to HBMBw; so does "MFMAFI8OpsLow" next to MFMAI8Ops
        assert metrics["HBMBw"] == pytest.approx({"value": 4000.0, "low": 3960.0, "high": 4040.0})
        assert metrics["MFMABF16Flops"]["value"] == 1e6
        assert set(metrics["MFMAI8Ops"]) == {"value", "low", "high"}
        assert "hbmBw" not in metrics and "MFMAFI8Ops" not in metrics
    assert sorted(mid) == [0, 1]
    assert "MALLBw" not in mi200 and mi300["MFMAF4Flops"]["value"] == 0.0
    text = rocprof_compute.describe_ceilings(mi300)
    assert "HBM 4000.0 GB/s" in text and "MFMA BF16 1000.0 TFLOP/s" in text and "F4" not in text


def test_pmc_perf_flops_and_bytes_mi300():
    gemm, _, add = rocprof_compute.read_pmc_perf(FIX / "rocprof_compute" / "mi300" / "pmc_perf.csv")
    assert gemm["flops"] == 512 * 1000 + 64 * 2 * 10  # MFMA BF16 MOPS + VALU FMA F32
    assert add["flops"] == 64 * 100
    assert gemm["hbm_bytes"] == 128 * 10 + 32 * 20 + 64 * 70 + 32 * 20 + 64 * 30
    assert gemm["duration_ns"] == 40000
    assert (gemm["l1_bytes"], gemm["l2_bytes"], gemm["lds_bytes"]) == (64000, 64 * 300, 200 * 4 * 32)


def test_rocprof_compute_workload_mi200_uses_timestamps_csv(tmp_path):
    shutil.copytree(FIX / "rocprof_compute" / "mi200", tmp_path / "v1" / "MI200")
    table = profiling.parse(tmp_path / "v1")  # finds the <gpu_model>/ folder below
    gemm = table.rows[0]
    assert (gemm.calls, gemm.total_us, gemm.flops) == (2, 80.0, 2 * 513280)
    assert gemm.bytes == 2 * (32 * 20 + 64 * 80 + 64 * 30 + 32 * 20)
    assert any("gfx90a" in n for n in table.notes) and any("HBM 4000.0 GB/s" in n for n in table.notes)


# ----------------------------------------------------------------- ncu (real H200 files)
def test_ncu_raw_page_real_file():
    table = profiling.parse(FIX / "nvidia_h200" / "ncu_page_raw.csv")
    assert table.source == "ncu"
    by_name = {r.name.split("<")[0]: r for r in table.rows}
    sgemm = by_name["void cutlass::Kernel2"]
    # worked example in the profiler notes: 17.18 GFLOP in 344.32 us = 49.9 TFLOP/s (fp32 SIMT GEMM)
    assert sgemm.category == "gemm" and sgemm.total_us == pytest.approx(344.32)
    assert sgemm.flops == 2 * 8_589_934_592 + 4_194_304 + 0
    assert sgemm.flops / sgemm.total_us / 1e6 == pytest.approx(49.9, abs=0.05)
    assert sgemm.bytes == 36_020_480
    gelu = by_name["void at::vectorized_elementwise_kernel"]
    assert gelu.bytes / gelu.total_us / 1e3 == pytest.approx(1735.6, abs=0.1)  # GB/s
    assert sum(r.calls for r in table.rows) == 6


def test_ncu_units_row_and_base_units():
    launches = ncu.read_raw(FIX / "nvidia_h200" / "ncu_page_raw_base_units.csv")
    assert len(launches) == 4 and launches[0].duration_ns == 13376
    assert ncu.unit_scale("usecond") == 1e3 and ncu.unit_scale("Mbyte") == 1e6


def test_ncu_no_kernels_profiled_says_why():
    with pytest.raises(kt.ProfileParseError, match="matched nothing.*Kernel2"):
        profiling.parse(FIX / "nvidia_h200" / "ncu_no_kernels_profiled.csv")


def test_ncu_tensor_core_gemm_flops_left_empty(tmp_path):
    raw = (FIX / "nvidia_h200" / "ncu_page_raw.csv").read_text()
    path = tmp_path / "tc.csv"  # pretend the GEMM used the tensor pipe
    path.write_text(raw.replace('"cutlass_80_simt_sgemm', '"x').replace("cutlass::Kernel2", "nvjet_gemm"))
    lines = path.read_text().splitlines()
    header = next(l for l in lines if l.startswith('"ID"')).split('","')
    col = header.index("sm__inst_executed_pipe_tensor.sum")
    fixed = []
    for line in lines:
        if "nvjet_gemm" in line:
            cells = line.split('","')
            cells[col] = "1,024"
            line = '","'.join(cells)
        fixed.append(line)
    path.write_text("\n".join(fixed) + "\n")
    gemm = next(r for r in ncu.parse(path).rows if "nvjet_gemm" in r.name)
    assert gemm.flops is None and gemm.bytes == 36_020_480


# ----------------------------------------------------------------- nsys
def test_nsys_stats_csv_variants(tmp_path):
    table = nsys.parse(FIX / "nsys" / "v1_cuda_gpu_kern_sum.csv")  # log lines, unquoted header
    top = table.rows[0]
    assert (top.name, top.category, top.calls, top.total_us) == (
        "flash_attention_prefill_f16", "attention", 32, pytest.approx(99385.786))
    quoted = nsys.parse(FIX / "nsys" / "quoted_us_cuda_gpu_kern_sum.csv")  # quoted, --timeunit us
    assert [(r.calls, r.total_us) for r in quoted.rows] == [(10, 500.0), (20, 300.0)]
    for name in ("v1_cuda_gpu_kern_sum.csv", "v1_cuda_gpu_mem_time_sum.csv"):
        shutil.copy(FIX / "nsys" / name, tmp_path / name)
    both = profiling.parse(tmp_path)
    assert both.source == "nsys" and both.by_category()["copy"] > 0
    assert {r.name for r in both.rows} >= {"[CUDA memcpy Host-to-Device]", "[CUDA memset]"}


# ----------------------------------------------------------------- PyTorch profiler trace
def test_torch_trace_real_file():
    """The sample keeps the GEMM's launch (inside ProfilerStep#2) but not the memset's: a GPU
    event whose launch the trace lacks was queued before the window and is not counted."""
    table = torch_profiler.read_trace(FIX / "nvidia_h200" / "trace_sample.json")
    assert [(r.name, r.category, r.total_us) for r in table.rows] == [
        ("nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN", "gemm", pytest.approx(5.376))]
    assert "1 profiled step(s)" in table.notes


def test_torch_trace_counts_what_the_steps_launched(tmp_path):
    """A graph-replayed window also records the kernels of the step queued before it: the
    kernel table keeps a kernel or a copy only when its launch lies inside a recorded step."""
    def gpu(cat, name, ts, correlation):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 10, "args": {"correlation": correlation}}

    def launch(name, ts, correlation):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1,
                "args": {"correlation": correlation}}
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 100, "dur": 100},
              launch("cudaGraphLaunch", 50, 1), gpu("kernel", "gemm_of_the_step_before", 110, 1),
              launch("cudaGraphLaunch", 120, 2), gpu("kernel", "nvjet_gemm", 150, 2),
              gpu("kernel", "nvjet_gemm", 170, 2), launch("cudaMemsetAsync", 130, 3),
              gpu("gpu_memset", "Memset (Device)", 180, 3)]
    path = tmp_path / "host.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    table = torch_profiler.read_trace(path)
    assert sorted((r.name, r.calls) for r in table.rows) == [("Memset (Device)", 1), ("nvjet_gemm", 2)]
    # a profiler that does not correlate kernels with launches: nothing to match, all kept
    uncorrelated = [dict(e, args={}) if e["cat"] == "cuda_runtime" else e for e in events]
    path.write_text(json.dumps({"traceEvents": uncorrelated}))
    assert sum(r.calls for r in torch_profiler.read_trace(path).rows) == 4


class _Avg:  # stands in for torch's FunctionEventAvg
    def __init__(self, key, self_device, self_cpu, annotation=False, device_type="DeviceType.CPU"):
        self.key, self.count, self.is_user_annotation, self.device_type = key, 2, annotation, device_type
        self.self_device_time_total, self.device_time_total = self_device, self_device
        self.self_cpu_time_total, self.cpu_time_total, self.flops = self_cpu, self_cpu, 0


def test_operator_table_skips_annotations_and_kernel_rows(tmp_path):
    events = [_Avg("aten::mm", 50.0, 5.0), _Avg("aten::add", 10.0, 9.0),
              _Avg("train_step", 300.0, 0.0, annotation=True), _Avg("ProfilerStep*", 0.0, 1.0),
              _Avg("nvjet_kernel", 50.0, 0.0, device_type="DeviceType.CUDA")]
    rows = torch_profiler.operator_records(events)
    assert [r["name"] for r in rows] == ["aten::mm", "aten::add"]
    table = torch_profiler.read_operator_csv(torch_profiler.write_operator_csv(rows, tmp_path / "operators.csv"))
    assert [(r.name, r.total_us) for r in table.rows] == [("aten::mm", 50.0), ("aten::add", 10.0)]
    assert "aten::mm" in torch_profiler.format_operators(rows)


# ----------------------------------------------------------------- detection and CLI
@pytest.mark.parametrize("path, tool", [
    ("nvidia_h200/ncu_page_raw.csv", "ncu"), ("nvidia_h200/ncu_no_kernels_profiled.csv", "ncu"),
    ("nvidia_h200/trace_sample.json", "pytorch"), ("rocprofv3/kernel_stats.csv", "rocprofv3"),
    ("rocprofv3/kernel_trace_rocm6.2.csv", "rocprofv3"), ("rocprof_compute/mi300", "rocprof-compute"),
    ("rocprof_compute/mi300/pmc_perf.csv", "rocprof-compute"), ("nsys", "nsys"),
])
def test_detect(path, tool):
    assert profiling.detect(FIX / path) == tool


def test_cli_parse_and_errors(tmp_path, capsys):
    out = tmp_path / "k.csv"
    assert cli_main(["parse", str(FIX / "nvidia_h200" / "ncu_page_raw.csv"), "-o", str(out), "--top", "2"]) == 0
    printed = capsys.readouterr().out
    assert "by category: gemm" in printed and "2 more kernels" in printed
    assert kt.read_csv(out).rows[0].category == "gemm"
    assert cli_main(["parse", str(tmp_path / "missing.csv")]) == 2
    assert cli_main(["parse", str(FIX / "nvidia_h200" / "env.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.startswith("error: ")
    assert cli_main(["roofline", str(FIX / "rocprof_compute" / "mi300" / "roofline.csv")]) == 0
    assert "MFMA BF16 1000.0 TFLOP/s" in capsys.readouterr().out


def cpu_operator_table(folder):
    """The operators.csv of a CPU run: one operator, self CPU time only."""
    rows = [{"name": "aten::mm", "calls": 1, "self_device_us": 0.0, "device_total_us": 0.0, "self_cpu_us": 5.0,
             "cpu_total_us": 5.0, "flops": 0, "self_cpu_memory_bytes": 0, "self_device_memory_bytes": 0}]
    return torch_profiler.write_operator_csv(rows, folder / "operators.csv")


def test_cpu_trace_names_the_operator_table_instead_of_zero_kernels(tmp_path, capsys):
    trace = tmp_path / "v1.1.pt.trace.json"  # a CPU run's trace: operators, no kernel events
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}')
    assert cli_main(["parse", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a CPU trace" in err and "operators.csv" in err
    operators = cpu_operator_table(tmp_path)
    assert cli_main(["parse", str(trace)]) == 2
    assert f"python -m profiling parse {operators}" in capsys.readouterr().err
    assert cli_main(["parse", str(tmp_path)]) == 0  # the folder: the operator table, as the hint says
    assert "aten::mm" in capsys.readouterr().out


def test_folder_whose_operator_table_is_older_than_its_trace_is_refused(tmp_path, capsys):
    # the run of the newest trace stopped before writing its operator table: the table
    # in the folder is an earlier run's, and reading it would pass it off as this one's
    operators = cpu_operator_table(tmp_path)
    trace = tmp_path / "v1.2.pt.trace.json"
    trace.write_text('{"traceEvents": []}')
    os.utime(operators, (1_000_000, 1_000_000))  # written long before the trace
    assert cli_main(["parse", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different runs" in err and trace.name in err
