"""Patches by reference: the tool makes the diff of two pinned commits itself, with the same
bytes under any git configuration, checks its sha256, and names what went wrong in one line.
Real git on a local stand-in fork (mtpimage/demo/gitrepos.py, served by file://); no network."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from mtpimage import gitfetch
from mtpimage.assembly.buildctx import patch_entries
from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.demo.gitrepos import SGLANG_FIX_PATHS, make_sglang
from mtpimage.errors import InputError
from mtpimage.manifests import manifest, patches
from mtpimage.plan.model import Patch

from .helpers import REPO, assert_one_line_error, run_cli

TESTS = REPO / "tests" / "manifests"
HOSTILE_GITCONFIG = """\
[diff]
    noprefix = true
    mnemonicPrefix = true
    context = 9
    interHunkContext = 20
    algorithm = patience
    renames = copies
    indentHeuristic = false
    suppressBlankEmpty = true
    relative = true
    external = /bin/false
    orderFile = {order}
[color]
    ui = always
    diff = always
[core]
    abbrev = 12
    quotePath = false
"""


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    """The sglang stand-in with its fork branch: main is the base, the branch head the fix."""
    return make_sglang(tmp_path_factory.mktemp("repos"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    gitfetch._DIFFS.clear()
    yield tmp_path / "cache"
    gitfetch._DIFFS.clear()


def _url(repo) -> str:
    return f"file://{repo.path}"


def _patch(repo, paths=SGLANG_FIX_PATHS, sha256="0" * 64, head=None) -> Patch:
    return Patch(
        None,
        sha256,
        "https://example.org/pr/1",
        1,
        (),
        _url(repo),
        repo.commits["without_fix"],
        head or repo.commits["with_fix"],
        tuple(paths),
    )


def test_diff_is_made_from_both_commits_and_limited_to_its_paths(fork, cache):
    data, files = gitfetch.commit_diff(
        _url(fork), fork.commits["without_fix"], fork.commits["with_fix"], SGLANG_FIX_PATHS
    )
    assert files == SGLANG_FIX_PATHS
    text = data.decode()
    assert text.startswith(f"diff --git a/{SGLANG_FIX_PATHS[0]} b/{SGLANG_FIX_PATHS[0]}\n")
    assert "+def unwrap_ipc_tensors(named_tensors):" in text and "test_unwrap_once" not in text
    # full blob ids, whatever the repository's size (an abbreviation's length is not stable)
    index = [line for line in text.splitlines() if line.startswith("index ")]
    assert len(index) == 2 and all(len(line.split()[1]) == 40 + 2 + 40 for line in index)
    whole, all_files = gitfetch.commit_diff(_url(fork), fork.commits["without_fix"], fork.commits["with_fix"])
    assert all_files == (*SGLANG_FIX_PATHS, "test/test_unwrap_once.py") and whole != data
    # both commits came through the one fetcher: its cache, keyed by repository and commit
    trees = {p.name for p in (cache / "git").glob("*/*")}
    assert trees == {fork.commits["without_fix"], fork.commits["with_fix"]}
    # and the diff applies to the base, as the build applies it (git apply -p1)
    base = cache / "base-copy"
    subprocess.run(["git", "clone", "-q", str(fork.path), str(base)], check=True)
    subprocess.run(["git", "-C", str(base), "checkout", "-q", fork.commits["without_fix"]], check=True)
    proc = subprocess.run(["git", "-C", str(base), "apply", "-p1", "-"], input=data, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert "def unwrap_ipc_tensors" in (base / SGLANG_FIX_PATHS[0]).read_text()


def test_diff_bytes_do_not_depend_on_the_users_git_configuration(fork, cache, tmp_path, monkeypatch):
    plain, _ = gitfetch.commit_diff(
        _url(fork), fork.commits["without_fix"], fork.commits["with_fix"], SGLANG_FIX_PATHS
    )
    order = tmp_path / "order"
    order.write_text("\n".join(reversed(SGLANG_FIX_PATHS)) + "\n")
    hostile = tmp_path / "gitconfig"
    hostile.write_text(HOSTILE_GITCONFIG.format(order=order))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(hostile))
    monkeypatch.setenv("GIT_DIFF_OPTS", "--unified=7")
    # the configuration does change what a plain `git diff` prints (--no-ext-diff: else the
    # external /bin/false fails it)...
    mine = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--bare", str(fork.path), str(mine)], check=True)
    theirs = subprocess.run(
        [
            "git",
            "-C",
            str(mine),
            "diff",
            "--no-ext-diff",
            fork.commits["without_fix"],
            fork.commits["with_fix"],
            "--",
            *SGLANG_FIX_PATHS,
        ],
        capture_output=True,
    )
    assert theirs.returncode == 0 and theirs.stdout and theirs.stdout != plain, theirs.stderr
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", "/bin/false")
    # ...and not the tool's bytes, with a cold cache and no memo
    gitfetch._DIFFS.clear()
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache-hostile"))
    again, _ = gitfetch.commit_diff(
        _url(fork), fork.commits["without_fix"], fork.commits["with_fix"], SGLANG_FIX_PATHS
    )
    assert again == plain


def test_pinned_sha256_is_checked_and_a_wrong_one_names_key_digest_and_fix(fork, cache):
    data, _ = gitfetch.commit_diff(
        _url(fork), fork.commits["without_fix"], fork.commits["with_fix"], SGLANG_FIX_PATHS
    )
    digest = hashlib.sha256(data).hexdigest()
    good = _patch(fork, sha256=digest)
    assert patches.patch_bytes("sglang", 0, good, None, "components.yaml") == data
    with pytest.raises(InputError) as exc:
        patches.patch_bytes(
            "sglang", 0, dataclasses.replace(good, sha256="a" * 64), None, "components.yaml:70"
        )
    msg = exc.value.one_line()
    assert msg.startswith(
        "components.yaml:70: components.sglang.patches[0].sha256: the diff sgl-project/sglang "
    )
    assert digest in msg and "a" * 64 in msg and f"set sha256: {digest}" in msg and "\n" not in str(exc.value)


def test_a_path_the_fix_does_not_change_is_named(fork, cache):
    p = _patch(fork, paths=(*SGLANG_FIX_PATHS, "python/sglang/__init__.py"))
    with pytest.raises(
        InputError, match=r"patches\[0\]\.paths\[2\]: 'python/sglang/__init__.py' is not changed"
    ):
        patches.patch_bytes("sglang", 0, p, None, "components.yaml")


def test_a_commit_that_cannot_be_fetched_names_repository_commit_and_fix(fork, cache):
    absent = "1234567" * 5 + "12345"
    with pytest.raises(patches.PatchUnavailable) as exc:
        patches.patch_bytes("sglang", 0, _patch(fork, head=absent), None, "components.yaml")
    msg = exc.value.one_line()
    assert f"cannot fetch {_url(fork)} commit {absent}" in msg and "git says" in msg
    assert "(fix: check that base" in msg and "url.<mirror>.insteadOf" in msg
    assert not exc.value.offline
    # the base was fetched and stays cached; nothing half-fetched is left for the head
    assert [p.name for p in (cache / "git").glob("*/*")] == [fork.commits["without_fix"]]


def test_shipped_render_needs_no_network_and_the_context_says_what_is_missing(tmp_path, monkeypatch):
    """Render records the pin (pure, no git); the bytes are made for the build context, and
    without the commits (no network, nothing cached) that is one error naming repository,
    commit and fix."""

    def no_fetch(repo, commit):
        raise AssertionError(f"render fetched {repo} {commit}")

    monkeypatch.setattr(gitfetch, "fetch", no_fetch)
    m = manifest.load()
    rendered = render(plan_for(m, "mtp-rollout", None), m.root)
    assert not [f for f in rendered.files if f.startswith("patches/")]
    name = "000-ArronHZG-sglang-47e9ec11ad7a-99433255ca36.patch"
    assert f"/tmp/mtp-patches/sglang/{name}:2" in rendered.dockerfile
    monkeypatch.undo()
    # an empty cache and a git whose "network" has no such repository
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(f'[url "file://{tmp_path}/nowhere/"]\n    insteadOf = https://github.com/\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    gitfetch._DIFFS.clear()
    with pytest.raises(patches.PatchUnavailable) as exc:
        patch_entries(rendered, progress=lambda _m: None)
    msg = exc.value.one_line()
    assert "patch 0 of sglang (ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 " in msg
    assert (
        "cannot fetch https://github.com/ArronHZG/sglang commit 47e9ec11ad7a12b85aff4ed6efc5eb3a43961d16"
        in msg
    )
    assert "(fix: " in msg


def test_local_patch_file_for_a_site_fix_reaches_the_context_checked(tmp_path):
    """A site's own fix stays possible as a file under manifests/, pinned the same way; two
    patches with one basename in two folders do not overwrite each other, and the Dockerfile
    applies them in order."""
    root = _site_manifests(tmp_path)
    m = manifest.load(root)
    plan = plan_for(m, "test-detach", None)
    rendered = render(plan, m.root)
    ctx = {k: v for k, v, _mode in patch_entries(rendered, progress=lambda _m: None)}
    assert sorted(ctx.values()) == sorted([(root / FIRST).read_bytes(), (root / SECOND).read_bytes()])
    names = [k.split("/", 2)[2] for k in sorted(ctx)]
    assert names == ["000-0001-fix.patch", "001-0001-fix.patch"]
    pos = [rendered.dockerfile.index(f"/tmp/mtp-patches/sglang/{n}") for n in names]
    assert pos == sorted(pos)
    # changed after the plan was made: refused when the context is made, naming the file
    (root / SECOND).write_bytes((root / SECOND).read_bytes() + b"\n")
    with pytest.raises(InputError, match="changed after the plan was made") as exc:
        patch_entries(rendered, progress=lambda _m: None)
    assert SECOND in str(exc.value) and "patches[1].sha256" in str(exc.value)


FIRST = "patches/site/0001-fix.patch"
SECOND = "patches/site-extra/0001-fix.patch"


def _site_manifests(tmp_path: Path) -> Path:
    import shutil

    root = shutil.copytree(TESTS, tmp_path / "manifests")
    entries = []
    for i, rel in enumerate((FIRST, SECOND)):
        body = f"--- a/x{i}\n+++ b/x{i}\n@@ -0,0 +1 @@\n+site fix {i}\n".encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
        entries.append(
            {
                "file": rel,
                "sha256": hashlib.sha256(body).hexdigest(),
                "strip": 1,
                "url": "https://example.org/site-fix",
            }
        )
    cat = yaml.safe_load((root / "components.yaml").read_text())
    cat["components"]["sglang"]["patches"] = entries
    (root / "components.yaml").write_text(yaml.safe_dump(cat, sort_keys=False))
    return root


def test_tampered_local_patch_is_refused_at_load_naming_it(tmp_path):
    root = _site_manifests(tmp_path)
    with open(root / FIRST, "ab") as f:
        f.write(b"\n+os.system('id')\n")
    out = tmp_path / "out"
    proc = run_cli("--manifests", str(root), "render", "--profile", "test-detach", "--out", str(out))
    assert_one_line_error(proc, FIRST, "patches[0].sha256", "review the file")
    assert not out.exists()


def test_describe_names_repository_commits_files_and_sha256():
    p = Patch(
        None,
        "b" * 64,
        "https://x",
        2,
        (),
        "https://github.com/ArronHZG/sglang.git",
        "47e9ec11ad7a12b85aff4ed6efc5eb3a43961d16",
        "99433255ca365028b6c36d892ac67ac155e3d021",
        ("a.py", "b.py", "c.py"),
    )
    assert p.describe() == f"ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 {'b' * 64}"
    assert p.name == "ArronHZG-sglang-47e9ec11ad7a-99433255ca36.patch"
    assert patches.describe(dataclasses.asdict(p)) == p.describe()
    one = dataclasses.replace(p, paths=("a.py",))
    assert "(1 file)" in one.describe()
    assert "(whole diff)" in dataclasses.replace(p, paths=()).describe()
    local = Patch("patches/site/fix.patch", "c" * 64, "https://x", 1, ())
    assert local.describe() == f"patches/site/fix.patch (local file), sha256 {'c' * 64}"
    assert local.name == "fix.patch"


def test_a_git_source_in_a_subdir_is_patched_at_its_repository_root(tmp_path):
    """One patch model: a git source's patch paths are repository paths, so the build helper
    applies them at the source's root (where .mtp-source.json is), also for a subdir package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mtp_install", REPO / "images" / "lib" / "mtp_install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = tmp_path / "mtp-src" / "sglang"
    (src / "python" / "pkg").mkdir(parents=True)
    (src / ".mtp-source.json").write_text("{}\n")
    (src / "python" / "pkg" / "mod.py").write_text("x = 1\n")
    assert mod._source_root(src / "python") == src
    assert mod._source_root(tmp_path / "plain") == tmp_path / "plain"
    fix = tmp_path / "fix.patch"
    fix.write_text(
        "diff --git a/python/pkg/mod.py b/python/pkg/mod.py\n--- a/python/pkg/mod.py\n"
        "+++ b/python/pkg/mod.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )
    mod._apply([(fix, 1)], mod._source_root(src / "python"))
    assert (src / "python" / "pkg" / "mod.py").read_text() == "x = 2\n"


def test_the_committed_lock_made_the_shipped_patch_the_way_the_tool_makes_it_now():
    """lock.yaml holds the shipped patch's result (made where the real commits are reachable):
    pinned as in the manifests, applying, and made with today's diff command, so a change of
    the diff options cannot pass CI with a lock made the old way."""
    lock = yaml.safe_load((REPO / "manifests" / "lock.yaml").read_text())
    [p] = plan_for(manifest.load(), "mtp-rollout", None).component("sglang").patches
    [entry] = lock["components"]["sglang"]["patches"]
    assert (entry["repo"], entry["base"], entry["head"], tuple(entry["paths"]), entry["sha256"]) == (
        p.repo,
        p.base,
        p.head,
        p.paths,
        p.sha256,
    )
    assert entry["made_with"] == gitfetch.diff_command(p.base, p.head, p.paths)
    assert entry["applies"] is True and entry["verified"] is True
    assert entry["checked_with"] == "patch --dry-run -p2 on the sglang 0.5.12 wheel"
    probe = lock["profiles"]["mtp-rollout"]["probes"]["sglang-rollout-fix"]
    assert probe["status"] == "pass" and "with its patches applied" in probe["detail"]
