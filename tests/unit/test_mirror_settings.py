"""#21 item 4: a mirror without uploadpack.allowFilter (needed by the partial fetch of
MTP_GIT_ALLOW_MISSING_BLOBS=1) is named in the error, not left to a network hint. A real
repository served over file:// (git's upload-pack, as a mirror runs it) with a blob removed."""

from __future__ import annotations

import subprocess

import pytest

from mtpimage import gitfetch


def _git(*args, cwd):
    return subprocess.run(
        ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def snapshot(tmp_path, monkeypatch):
    """A repository whose commit and trees are whole but one blob is gone (a snapshot)."""
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MTP_GIT_ALLOW_MISSING_BLOBS", "1")
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    repo = tmp_path / "mirror"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    (repo / "keep.txt").write_text("kept\n")
    (repo / "big.gif").write_text("a large file the snapshot lacks\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "snapshot", cwd=repo)
    blob = _git("rev-parse", "HEAD:big.gif", cwd=repo)
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    _git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=repo)
    return repo, _git("rev-parse", "HEAD", cwd=repo)


def test_a_mirror_without_allow_filter_is_named_in_the_error(snapshot):
    repo, commit = snapshot
    _git("config", "uploadpack.allowFilter", "false", cwd=repo)
    with pytest.raises(gitfetch.GitError) as exc:
        gitfetch.fetch(f"file://{repo}", commit)
    text = exc.value.one_line()
    assert "config uploadpack.allowFilter true" in text and "network" not in text


def test_with_allow_filter_the_commit_is_fetched_without_the_missing_blob(snapshot):
    repo, commit = snapshot
    _git("config", "uploadpack.allowFilter", "true", cwd=repo)
    tree = gitfetch.fetch(f"file://{repo}", commit)
    assert (tree.path / "keep.txt").is_file() and gitfetch.missing_paths(tree.path) == ["big.gif"]
