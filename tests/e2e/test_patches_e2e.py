"""Patches by reference against real git servers on loopback: lock records the pin and proves
it applies (sglang, a source in a subdir; Megatron-LM, a source at the root: one patch model),
--frozen holds it, a changed hash or a commit missing upstream is one line, and the build
context carries the diff made from the two commits. Manifests keep the real GitHub URLs; git's
url.insteadOf sends them to the loopback daemon (mtpimage/demo/gitserver.py). No docker."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly.buildctx import build_context
from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.demo.gitrepos import MTP_PATH, SGLANG_FIX_PATHS
from mtpimage.errors import InputError
from mtpimage.manifests import manifest
from tests.fixtures.lock_fixtures import fast_net, serve_index, standin_manifests  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "mtp-rollout"  # the profile whose rule (sglang-rollout-fix) needs the patch
TEST_MANIFESTS = ROOT / "tests" / "manifests"
# The stand-in fix's pin, as tests/manifests/components.yaml holds it (one place for the hash).
SGLANG_PATCH = yaml.safe_load((TEST_MANIFESTS / "components.yaml").read_text())["components"]["sglang"][
    "patches"
][0]
MEGATRON_FIX_SHA256 = "5429b8e9a1296acd1fc9525f923cf96347d7e2ff7fc0b526812b0ff01107150f"


def build(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=ROOT,
        timeout=300,
    )


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def _patched_manifests(dest: Path, repos, index_url: str) -> Path:
    """The shipped manifests on stand-ins, with sglang from its main branch (no fix) plus the
    fork's fix by reference, and the broken Megatron-LM plus its fix commit by reference."""
    m = standin_manifests(dest, repos, index_url, megatron="broken")
    path = m / "components.yaml"
    cat = yaml.safe_load(path.read_text())
    sg = cat["components"]["sglang"]
    sg.update(
        repo="https://github.com/sgl-project/sglang",
        ref="main",
        commit=repos.sglang.commits["without_fix"],
        patches=[dict(SGLANG_PATCH)],
    )
    cat["components"]["megatron-lm"]["patches"] = [
        {
            "repo": "https://github.com/NVIDIA/Megatron-LM",
            "base": repos.megatron.commits["broken"],
            "head": repos.megatron.commits["fixed"],
            "paths": [MTP_PATH],
            "sha256": MEGATRON_FIX_SHA256,
            "url": "https://github.com/NVIDIA/Megatron-LM/pull/3457",
            "strip": 1,
        }
    ]
    path.write_text(yaml.safe_dump(cat, sort_keys=False))
    return m


def _edit_patch(m: Path, comp: str, **fields) -> None:
    path = m / "components.yaml"
    cat = yaml.safe_load(path.read_text())
    cat["components"][comp]["patches"][0].update(fields)
    path.write_text(yaml.safe_dump(cat, sort_keys=False))


def test_lock_records_patches_by_reference_proves_they_apply_and_frozen_holds(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    repos = fixture_repos
    m = _patched_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    first = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert first.returncode == 0, first.stdout + first.stderr
    lock = yaml.safe_load((m / "lock.yaml").read_text())
    [sg] = lock["components"]["sglang"]["patches"]
    assert {k: sg[k] for k in ("repo", "base", "head", "paths", "sha256", "strip")} == {
        "repo": "https://github.com/ArronHZG/sglang",
        "base": repos.sglang.commits["without_fix"],
        "head": repos.sglang.commits["with_fix"],
        "paths": list(SGLANG_FIX_PATHS),
        "sha256": SGLANG_PATCH["sha256"],
        "strip": 1,
    }
    assert sg["applies"] is True and sg["verified"] is True
    assert sg["checked_with"] == "git apply --check -p1 at the repository root"  # sglang lives in python/
    assert (
        sg["made_with"].startswith("git diff --no-color --no-ext-diff") and "--full-index" in sg["made_with"]
    )
    [mc] = lock["components"]["megatron-lm"]["patches"]
    assert (mc["applies"], mc["sha256"], mc["paths"]) == (True, MEGATRON_FIX_SHA256, [MTP_PATH])
    probe = lock["profiles"][PROFILE]["probes"]["sglang-rollout-fix"]
    assert probe["status"] == "pass" and "with its patches applied" in probe["detail"], probe
    # both commits of each patch were fetched through the one cache, keyed by repository and commit
    cached = {p.name for p in (fast_net / "git").glob("*/*")}
    assert {
        repos.sglang.commits["without_fix"],
        repos.sglang.commits["with_fix"],
        repos.megatron.commits["fixed"],
    } <= cached

    dry = build("--manifests", str(m), "--profile", PROFILE, "--frozen", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    sglang_line = (
        f"+ patch ArronHZG/sglang {repos.sglang.commits['without_fix'][:8]}.."
        f"{repos.sglang.commits['with_fix'][:8]} (2 files), sha256 {SGLANG_PATCH['sha256']}"
    )
    assert sglang_line in dry.stdout
    explain = build("--manifests", str(m), "explain", "--profile", PROFILE, "--target", "rl")
    assert (
        f"# patch sglang: {sglang_line[len('+ patch ') :]} (https://github.com/sgl-project/sglang/pull/17870)"
        in explain.stdout
    )

    # the lock with the patch passes the rule; the same source without it does not
    before = (m / "lock.yaml").read_bytes()
    bare = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert bare.returncode == 0 and (m / "lock.yaml").read_bytes() == before  # same bytes again
    cat = yaml.safe_load((m / "components.yaml").read_text())
    cat["components"]["sglang"]["patches"] = []
    (tmp_path / "nopatch").mkdir()
    nopatch = _copy(m, tmp_path / "nopatch" / "m")
    (nopatch / "components.yaml").write_text(yaml.safe_dump(cat, sort_keys=False))
    failed = build("lock", "--manifests", str(nopatch), "--profile", PROFILE)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "sglang-rollout-fix" in failed.stderr and "has no unwrap_ipc_tensors" in failed.stderr

    # --frozen: another head is drift, named as such
    _edit_patch(m, "sglang", head=repos.sglang.commits["fix_only"])
    drift = build("--manifests", str(m), "--profile", PROFILE)  # stops before any image stage
    one_line(
        drift, 2, "components.sglang.patches", "drifted", repos.sglang.commits["fix_only"], "build.py lock"
    )

    # a changed hash: lock refuses in one line naming key, digest and fix, and writes nothing
    _edit_patch(m, "sglang", head=repos.sglang.commits["with_fix"], sha256="0" * 64)
    bad = build("lock", "--manifests", str(m), "--profile", PROFILE)
    one_line(
        bad,
        2,
        "components.yaml:",
        "components.sglang.patches[0].sha256",
        SGLANG_PATCH["sha256"],
        "the manifest pins " + "0" * 64,
        f"set sha256: {SGLANG_PATCH['sha256']}",
    )
    assert (m / "lock.yaml").read_bytes() == before


def test_check_says_where_each_patch_applies_from_the_lock_or_by_applying_it(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    """#36 item 5: plain `check` gives each patch's verdict as `lock` applied it (evidence lock),
    `--probe-sources` applies it again to the pinned commit (evidence probe), and a pin the patch
    does not fit fails there in one rule naming the patch and the commit."""
    import json

    repos = fixture_repos
    m = _patched_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    assert build("lock", "--manifests", str(m), "--profile", PROFILE).returncode == 0

    def rule(*extra) -> tuple[int, dict]:
        proc = build("check", "--manifests", str(m), "--profile", PROFILE, "--json", *extra)
        return proc.returncode, {r["id"]: r for r in json.loads(proc.stdout)[0]["rules"]}["patches-apply"]

    code, r = rule()
    assert (code, r["status"], r["evidence"]) == (0, "pass", "lock"), r
    base = repos.sglang.commits["without_fix"]
    assert f"sglang: patch {SGLANG_PATCH['sha256'][:12]} applies to sglang {base[:10]}" in r["detail"], r
    assert f"megatron-lm: patch {MEGATRON_FIX_SHA256[:12]} applies" in r["detail"], r
    code, r = rule("--probe-sources")
    assert (code, r["status"], r["evidence"]) == (0, "pass", "probe"), r
    assert "(git apply --check -p1 at the repository root)" in r["detail"], r
    head = repos.sglang.commits["with_fix"]  # the fix is in it already: the patch cannot apply
    code, r = rule("--probe-sources", "--set", f"sglang.commit={head}")
    assert (code, r["status"], r["evidence"]) == (1, "fail", "probe"), r
    assert (
        f"sglang: patch {SGLANG_PATCH['sha256'][:12]} does not apply to sglang {head[:10]}" in r["detail"]
    ), r


def _copy(src: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dest))


def test_a_patch_commit_missing_upstream_fails_lock_naming_repository_commit_and_fix(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    m = _patched_manifests(tmp_path / "m", fixture_repos, serve_index(http_server, monkeypatch))
    absent = "1234567" * 5 + "12345"  # 40 hex, in no stand-in repository
    _edit_patch(m, "sglang", head=absent)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE)
    line = one_line(
        proc,
        3,
        f"lock failed, {m / 'lock.yaml'} left unchanged",  # the lock --manifests names
        "patch 0 of sglang",
        f"cannot fetch https://github.com/ArronHZG/sglang commit {absent}",
        "git says",
        "(fix: ",
    )
    assert "url.<mirror>.insteadOf" in line
    assert not (m / "lock.yaml").exists()


def test_build_context_carries_the_diff_made_from_the_commits(git_env, fast_net, fixture_repos, tmp_path):
    m = manifest.load(TEST_MANIFESTS)
    rendered = render(plan_for(m, "test-detach", None), m.root)
    assert not [f for f in rendered.files if f.startswith("patches/")]  # render stays pure
    seen: list[str] = []
    ctx = build_context(rendered, progress=seen.append)
    with tarfile.open(fileobj=io.BytesIO(ctx)) as tar:
        names = tar.getnames()
        [patch] = [n for n in names if n.startswith("patches/sglang/")]
        data = tar.extractfile(patch).read()
    sg = fixture_repos.sglang
    assert (
        patch
        == f"patches/sglang/000-ArronHZG-sglang-{sg.commits['without_fix'][:12]}-{sg.commits['with_fix'][:12]}.patch"
    )
    assert hashlib.sha256(data).hexdigest() == SGLANG_PATCH["sha256"]
    assert data.startswith(f"diff --git a/{SGLANG_FIX_PATHS[0]} b/{SGLANG_FIX_PATHS[0]}\n".encode())
    assert b"test_unwrap_once" not in data and "src/sglang/python/pyproject.toml" in names
    assert any(s.startswith("patch   sglang") and "(2 files)" in s for s in seen), seen
    # the Dockerfile applies exactly that file (git apply -p1 at the repository root)
    assert f"--patch /tmp/mtp-patches/sglang/{patch.split('/')[-1]}:1" in rendered.dockerfile

    # a pin that no longer matches what the commits give is refused when the context is made
    root = _copy(TEST_MANIFESTS, tmp_path / "manifests")
    _edit_patch(root, "sglang", sha256="f" * 64)
    m2 = manifest.load(root)
    with pytest.raises(InputError) as exc:
        build_context(render(plan_for(m2, "test-detach", None), m2.root), progress=lambda _m: None)
    msg = exc.value.one_line()
    assert msg.startswith(
        "manifests/components.yaml: components.sglang.patches[0].sha256: the diff ArronHZG/sglang "
    )
    assert SGLANG_PATCH["sha256"] in msg and "f" * 64 in msg and "\n" not in str(exc.value)
