"""`build.py bump` (#36): one verified transaction and its Markdown report, on real git
repositories served on loopback (mtpimage/demo/gitrepos.py) and a loopback index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from mtpimage.demo.gitrepos import _megatron_common
from tests.fixtures.gitrepos import advance_branch
from tests.fixtures.lock_fixtures import fast_net, serve_index, standin_manifests  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]


def build(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=ROOT,
        timeout=600,
    )


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_bump_moves_both_files_or_neither_and_reports(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch
):
    repos = private_git_world.repos
    m = standin_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    cat = m / "components.yaml"
    doc = yaml.safe_load(cat.read_text())
    doc["components"]["megatron-lm"]["version"] = "0.19.0"  # what the "fixed" commit builds
    cat.write_text(yaml.safe_dump(doc, sort_keys=False))
    first = build("lock", "--manifests", str(m))
    assert first.returncode == 0, first.stdout + first.stderr
    old = repos.megatron.commits["fixed"]
    head = advance_branch(repos.megatron, "main", "Bump to 0.20.0", files=_megatron_common((0, 20, 0, "")))

    # --dry-run: the same checks and report, nothing written
    before = snapshot(m)
    dry = build("bump", "megatron-lm", "--manifests", str(m), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "**Dry run: every check passed; nothing written.**" in dry.stdout
    assert snapshot(m) == before

    # a commit that breaks a probe: refused, reason first, files byte-identical, report says so
    report = tmp_path / "bump.md"
    bad = build(
        "bump",
        "megatron-lm",
        "--manifests",
        str(m),
        "--to",
        repos.megatron.commits["broken"],
        "--report",
        str(report),
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stderr.startswith("error: mtp-cp-recompute: recompute-padding-mask"), bad.stderr
    assert snapshot(m) == before
    assert "**Failed: nothing written**" in report.read_text()

    # the bump: both files move, the version is read from the source, the report tells all
    ok = build("bump", "megatron-lm", "--manifests", str(m), "--report", str(report))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    entry = yaml.safe_load(cat.read_text())["components"]["megatron-lm"]
    assert (entry["commit"], entry["version"]) == (head, "0.20.0")
    lock = yaml.safe_load((m / "lock.yaml").read_text())
    assert lock["components"]["megatron-lm"]["commit"] == head
    text = report.read_text()
    assert text.strip() == ok.stdout.strip()  # the report printed is the report written
    assert "**Passed: every check passed; written: `m/lock.yaml`, `m/components.yaml`.**" in text
    assert f"| megatron-lm | main | `{old[:12]}` -> `{head[:12]}` | 0.19.0 -> 0.20.0 |" in text
    assert "- megatron-core 0.19.0 -> 0.20.0" in text
    assert "| recompute-padding-mask |" in text and "pass (probe)" in text
    # megatron's layer and every later one rebuild; the layers before it come from the cache
    layers = [row for row in text.splitlines() if row.startswith("| mtp-cp-recompute | ")]
    assert layers and "| os, torch, extensions |" in layers[-1], layers
    assert "megatron-lm" in layers[-1]
    assert "| rollout-throughput | n/a | n/a | n/a | n/a | warning |" in text  # a warning, not a FAIL
    frozen = build("--manifests", str(m), "--profile", "mtp-cp-recompute", "--frozen", "--dry-run")
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
