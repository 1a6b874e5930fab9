"""Modules that need a GPU at import are a GPU check with their reason, not a silent skip
(issue 22): run_checks.py's gpu-imports group, run here on this interpreter."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from mtpimage.assembly.render import IMAGES_DIR


@pytest.fixture
def rc(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "run_checks_gpu_imports", IMAGES_DIR / "checks" / "run_checks.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    (tmp_path / "needs_driver.py").write_text(
        "raise ImportError('libcuda.so.1: cannot open shared object file')\n"
    )
    (tmp_path / "loads_fine.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return mod


def _skips(mod, monkeypatch, entries):
    monkeypatch.setattr(mod, "skip_list", lambda: entries)


def test_without_a_gpu_they_are_named_as_a_skip(rc, monkeypatch):
    _skips(
        rc,
        monkeypatch,
        {"loads_fine": "(b) CUDA extension", "not_installed_here": "(b) x", "hook": "(a) LD_PRELOAD"},
    )
    [r] = rc.check_gpu_imports(gpu=False)
    assert r["status"] == rc.SKIP and "loads_fine (CUDA extension)" in r["detail"]
    assert (
        "not_installed_here" not in r["detail"] and "hook" not in r["detail"]
    )  # (a) or absent: not GPU imports


def test_with_a_gpu_each_is_imported_and_a_failure_is_named(rc, monkeypatch):
    _skips(rc, monkeypatch, {"loads_fine": "(b) CUDA extension"})
    [ok] = rc.check_gpu_imports(gpu=True)
    assert ok["status"] == rc.PASS and ok["checked"] == 1
    _skips(rc, monkeypatch, {"loads_fine": "(b) CUDA extension", "needs_driver": "(b) CUDA extension"})
    [bad] = rc.check_gpu_imports(gpu=True)
    assert bad["status"] == rc.FAIL and "needs_driver" in bad["detail"] and "libcuda" in bad["detail"]


def test_a_torch_cpp_extension_is_imported_after_torch(rc, tmp_path):
    # like apex's amp_C: NEEDs libc10.so with no path to it, so it loads only after torch did
    (tmp_path / "torch.py").write_text("LOADED = True\n")
    (tmp_path / "cpp_ext.py").write_text(
        "import sys\n"
        "if 'torch' not in sys.modules:\n"
        "    raise ImportError('libc10.so: cannot open shared object file: No such file or directory')\n"
    )
    (tmp_path / "broken_ext.py").write_text(
        "raise ImportError('libfoo.so: cannot open shared object file')\n"
    )
    got = rc.import_fresh("cpp_ext", 60)
    assert got.ok and "after torch" in got.detail
    bad = rc.import_fresh("broken_ext", 60)  # another missing library is a failure, not retried
    assert not bad.ok and "libfoo" in bad.detail
