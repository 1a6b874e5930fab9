"""Every download is verified: a package file whose sha256 differs from the lock is refused
with a message naming it (patches: tests/unit/test_patches.py)."""

from __future__ import annotations

from mtpimage.lock import lockfile


def _lock(sha: str) -> dict:
    return {
        "components": {
            "sglang": {"version": "0.5.12", "file": "sglang-0.5.12-py3-none-any.whl", "sha256": sha}
        },
        "python_sets": {
            "k1": {"packages": {"torch": {"version": "2.11.0", "file": "torch-2.11.0.whl", "sha256": sha}}}
        },
    }


def test_a_package_file_whose_sha256_differs_from_the_lock_is_named():
    old, new = _lock("a" * 64), _lock("b" * 64)
    found = lockfile.changed_files(old, new)
    assert len(found) == 2
    assert any("sglang-0.5.12-py3-none-any.whl" in f and "a" * 64 in f and "b" * 64 in f for f in found)
    assert any("torch-2.11.0.whl" in f for f in found)
    assert lockfile.changed_files(old, _lock("a" * 64)) == []
    assert lockfile.changed_files(None, new) == []
    moved = _lock("b" * 64)
    moved["components"]["sglang"]["version"] = "0.5.13"  # a new pin may have a new file
    moved["components"]["sglang"]["file"] = "sglang-0.5.13-py3-none-any.whl"
    assert len(lockfile.changed_files(old, moved)) == 1
