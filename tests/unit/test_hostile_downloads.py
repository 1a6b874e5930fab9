"""Every download is verified: a patch or package file whose sha256 differs from the
manifests or the lock is refused with a message naming it."""
from __future__ import annotations

import shutil

import pytest

from mtpimage import lockfile, manifest
from mtpimage.cli import plan_for
from mtpimage.errors import InputError
from mtpimage.render import render

from .helpers import REPO, assert_one_line_error, run_cli

TESTS = REPO / "tests" / "manifests"
PATCH = "patches/sglang/0001-unwrap-ipc-tensors-once.patch"


@pytest.fixture
def tampered(tmp_path):
    root = shutil.copytree(TESTS, tmp_path / "manifests")
    with open(root / PATCH, "ab") as f:
        f.write(b"\n+os.system('id')\n")
    return root


def test_tampered_patch_is_refused_naming_it(tampered, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("--manifests", str(tampered), "render", "--profile", "test-detach", "--out", str(out))
    assert_one_line_error(proc, PATCH, "sha256")
    assert not out.exists()


def test_patch_changed_after_the_plan_is_refused_at_render(tmp_path):
    root = shutil.copytree(TESTS, tmp_path / "manifests")
    m = manifest.load(root)
    plan = plan_for(m, "test-detach", None)
    (root / PATCH).write_bytes((root / PATCH).read_bytes() + b"\n")
    with pytest.raises(InputError, match="patch changed after the plan was made") as exc:
        render(plan, m.root)
    assert PATCH in str(exc.value)


def _lock(sha: str) -> dict:
    return {"components": {"sglang": {"version": "0.5.12", "file": "sglang-0.5.12-py3-none-any.whl",
                                      "sha256": sha}},
            "python_sets": {"k1": {"packages": {"torch": {"version": "2.11.0", "file": "torch-2.11.0.whl",
                                                          "sha256": sha}}}}}


def test_a_package_file_whose_sha256_differs_from_the_lock_is_named():
    old, new = _lock("a" * 64), _lock("b" * 64)
    found = lockfile.changed_files(old, new)
    assert len(found) == 2
    assert any("sglang-0.5.12-py3-none-any.whl" in f and "a" * 64 in f and "b" * 64 in f for f in found)
    assert any("torch-2.11.0.whl" in f for f in found)
    assert lockfile.changed_files(old, _lock("a" * 64)) == []
    assert lockfile.changed_files(None, new) == []
    moved = _lock("b" * 64)
    moved["components"]["sglang"]["version"] = "0.5.13"   # a new pin may have a new file
    moved["components"]["sglang"]["file"] = "sglang-0.5.13-py3-none-any.whl"
    assert len(lockfile.changed_files(old, moved)) == 1

