"""#36 item 11: a mirror that lacks some blobs of a pinned commit (git: "unable to read <sha>",
"possible repository corruption") gets a fix naming MTP_GIT_ALLOW_MISSING_BLOBS, not one about
`git ls-remote`. A real local repository with one blob deleted; no network."""

from __future__ import annotations

import subprocess

import pytest

from mtpimage import gitfetch


def _git(cwd, *args) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_a_mirror_without_some_blobs_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTP_GIT_ALLOW_MISSING_BLOBS", raising=False)
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    src = tmp_path / "mirror"
    src.mkdir()
    _git(src, "init", "-q")
    (src / "small.txt").write_text("kept\n")
    (src / "large.bin").write_text("absent from the snapshot\n")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "two files")
    blob = _git(src, "rev-parse", "HEAD:large.bin")
    (src / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    commit = _git(src, "rev-parse", "HEAD")
    with pytest.raises(gitfetch.GitError) as exc:
        gitfetch.fetch(str(src), commit)
    text = exc.value.one_line()
    assert "MTP_GIT_ALLOW_MISSING_BLOBS=1" in text and "ls-remote" not in text, text
    assert exc.value.fix == gitfetch.MISSING_BLOBS_FIX
