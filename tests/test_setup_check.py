"""setup/check_environment.py: runs, reports this machine correctly, fails when a need is missing."""
import json

from conftest import HAS_GPU, REPO, run_cli

SCRIPT = REPO / "setup" / "check_environment.py"


def test_checklist_runs_and_reports_this_machine_and_its_rocm_variables():
    # One run for both (each run imports torch): ROCm's variables are reported on any machine.
    proc = run_cli([SCRIPT], env={"HSA_OVERRIDE_GFX_VERSION": "9.0.6", "HIP_VISIBLE_DEVICES": "0"},
                   timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "torch" in out and "READY" in out and "NOT READY" not in out
    if HAS_GPU:
        assert "[ ok ] gpu" in out
    else:
        assert "CPU-only build" in out or "no GPU visible" in out
        assert "[warn] gpu" in out  # a missing GPU is a warning, not a failure
    assert "HSA_OVERRIDE_GFX_VERSION=9.0.6: the ROCm runtime treats the GPU as gfx906" in out
    assert "HIP_VISIBLE_DEVICES=0" in out


def test_json_lists_every_check_once():
    proc = run_cli([SCRIPT, "--json"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    checks = json.loads(proc.stdout)
    names = [c["name"] for c in checks]
    for expected in ("python", "torch", "gpu", "sdpa backends", "triton", "deepspeed",
                     "rocprofv3", "rocprof-sys-run", "rocprof-compute", "ncu", "nsys", "jupyterlab"):
        assert expected in names
    assert len(names) == len(set(names))
    assert {c["status"] for c in checks} <= {"ok", "warn", "fail", "info"}


def test_too_old_torch_and_a_required_optional_item_fail_with_a_fix():
    absent = "gpu" if not HAS_GPU else "no-such-tool"
    proc = run_cli([SCRIPT, "--min-torch", "99.0", "--require", absent], timeout=120)
    assert proc.returncode == 1
    assert "[FAIL] torch" in proc.stdout and "fix:" in proc.stdout and "NOT READY" in proc.stdout
    assert f"[FAIL] {absent}" in proc.stdout


def test_missing_torch_fails_and_says_how_to_install(tmp_path):
    # A torch.py that refuses to import stands in for a machine without torch.
    (tmp_path / "torch.py").write_text("raise ImportError('no torch on this machine')\n")
    proc = run_cli([SCRIPT], env={"PYTHONPATH": str(tmp_path)}, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] torch" in proc.stdout and "setup/INSTALL.md" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_bad_flag_is_one_line_and_exit_2():
    proc = run_cli([SCRIPT, "--min-torch", "abc"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_version_parsing():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("check_environment", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    assert mod.version_tuple("2.4.1+rocm6.0") == (2, 4, 1)
    assert mod.version_tuple("2.5.0a0+git1234") == (2, 5, 0)
    assert mod.version_tuple("2.6.0rc1") == (2, 6, 0)
    assert mod.version_tuple("2.13.0+cpu") >= mod.version_tuple("2.4")
    assert mod.check_arch_in_build("gfx906", ["gfx90a", "gfx942"]).status == "warn"
    assert mod.check_arch_in_build("gfx90a:sramecc+:xnack-", ["gfx90a"]).status == "ok"
    assert [mod.override_arch(v) for v in ("9.0.6", "9.0.10", "11.5.1", "x")] == \
        ["gfx906", "gfx90a", "gfx1151", None]


def _fake_rocm_device(monkeypatch, gcn_arch_name):
    """Import the checker as a module and make torch report a ROCm GPU of this gfx target."""
    import importlib.util
    import sys
    import types

    import torch

    spec = importlib.util.spec_from_file_location("check_environment_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=0: types.SimpleNamespace(gcnArchName=gcn_arch_name))
    return module


def test_rocm_gpu_reports_a_tuned_gfx_target(monkeypatch):
    module = _fake_rocm_device(monkeypatch, "gfx942:sramecc+:xnack-")
    check = module.check_amd_target()
    assert check.name == "v3 amd target" and check.status == "ok"
    assert "gfx942" in check.detail and "tuned" in check.detail
    assert "sramecc" not in check.detail


def test_rocm_gpu_warns_on_an_untuned_gfx_target(monkeypatch):
    module = _fake_rocm_device(monkeypatch, "gfx906:sramecc+:xnack-")
    check = module.check_amd_target()
    assert check.status == "warn"
    assert "gfx906" in check.detail and "MFMA" in check.detail
    assert "--no-triton-attention" in check.detail
    assert "sramecc" not in check.detail


def test_no_amd_target_line_without_rocm(monkeypatch):
    import torch

    module = _fake_rocm_device(monkeypatch, "gfx942")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert module.check_amd_target() is None


def test_a_missing_jupyterlab_is_installed_the_way_the_readme_says(monkeypatch):
    import sys
    sys.path.insert(0, str(REPO / "setup"))
    import check_environment as ce

    monkeypatch.setattr(ce, "package_version", lambda name: None)
    check = ce.check_notebooks()
    assert check.status == "warn" and "make notebooks" in check.fix and "pip" not in check.fix
