"""#36 items 2 and 12: `lock --upgrade` computes components.yaml's new text without writing
it (lock() writes it with lock.yaml once every check passed), and moves every git pin that
docs/lock-and-mirrors.md says it moves: components' and compiled packages' (packages.*.build.git,
apex's `ref: master`). git ls-remote is replaced by a table here; the e2e tests run it for real."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mtpimage import gitfetch
from mtpimage.errors import InputError
from mtpimage.lock import locker, staging
from mtpimage.manifests import manifest

NEW = "c0ffee" + "0" * 34


@pytest.fixture
def m(tmp_path) -> manifest.Manifests:
    root = Path(shutil.copytree(manifest.load().root, tmp_path / "manifests"))
    return manifest.load(root)


def _heads(m, moved: dict[str, str]):
    cat = m.catalogue.data
    commits = {c["repo"]: c["commit"] for c in cat["components"].values() if c.get("commit")}
    for p in cat["packages"].values():
        g = (p.get("build") or {}).get("git")
        if g:
            commits[g["repo"]] = g["commit"]
    commits.update(moved)
    return lambda repo, ref: commits[repo]


def test_upgrade_moves_a_package_built_from_git(m, monkeypatch):
    before = (m.root / "components.yaml").read_bytes()
    monkeypatch.setattr(gitfetch, "ls_remote", _heads(m, {"https://github.com/NVIDIA/apex": NEW}))
    moves, text = locker.upgrade(m, m.names(), "*")
    assert [mv.name for mv in moves] == ["apex"] and moves[0].kind == "package"
    assert moves[0].line().startswith("apex: master 6424da3b4faa -> c0ffee000000")
    assert yaml.safe_load(text)["packages"]["apex"]["build"]["git"]["commit"] == NEW
    assert (m.root / "components.yaml").read_bytes() == before  # nothing written here
    one, _ = locker.upgrade(m, m.names(), "apex")
    assert [mv.name for mv in one] == ["apex"]
    # the rest of the file is untouched: only the commit line differs
    diff = [(a, b) for a, b in zip(before.decode().splitlines(), text.splitlines()) if a != b]
    assert len(diff) == 1 and NEW in diff[0][1]


def test_set_field_keeps_quotes_and_comments_and_refuses_what_it_cannot_find():
    text = 'a:\n  version: "0.1"   # why\n  ref: main\n'
    assert staging.set_field(text, "f:2", "version", "0.1", "0.2", "a.version") == (
        'a:\n  version: "0.2"   # why\n  ref: main\n'
    )
    with pytest.raises(InputError, match="cannot find `ref: master`"):
        staging.set_field(text, "f:3", "ref", "master", "main", "a.ref")


def test_commit_writes_every_file_or_none(tmp_path, monkeypatch):
    a, b = tmp_path / "components.yaml", tmp_path / "lock.yaml"
    a.write_text("old a\n")
    b.write_text("old b\n")
    real = staging.os.replace
    calls = []

    def fail_second(src, dst):
        calls.append(dst)
        if len(calls) == 2 and str(src).endswith(".tmp"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(staging.os, "replace", fail_second)
    with pytest.raises(OSError):
        staging.commit({a: "new a\n", b: "new b\n"})
    assert (a.read_text(), b.read_text()) == ("old a\n", "old b\n")  # the first one put back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["components.yaml", "lock.yaml"]
    monkeypatch.setattr(staging.os, "replace", real)
    assert staging.commit({a: "new a\n", b: "new b\n"}) == [a, b]
    assert staging.commit({a: "new a\n", b: "new b\n"}) == []  # same bytes: nothing written


def test_bump_of_an_unknown_component_names_bump_not_upgrade():
    """Issue #46: `bump NAME` said `--upgrade: ...`, a flag the user never typed."""
    from .helpers import assert_one_line_error, run_main

    proc = run_main("bump", "no-such-thing", "--dry-run")
    line = assert_one_line_error(proc, "error: bump: no-such-thing:", "use one of: ", code=2)
    assert "--upgrade" not in line
