"""The build context: rendered files + the pinned sources, as one normalised tar.

Sources of git components are fetched on this machine with the git CLI, so the user's
git configuration applies (url.<mirror>.insteadOf, credential helpers, proxies), and
the build itself needs no access to the git servers. Each fetch is checked against the
Plan's commit and cached by commit (content-addressed) under the user's cache directory.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .errors import EnvironmentProblem
from .plan import Component
from .render import Rendered, deterministic_tar


def cache_dir() -> Path:
    base = os.environ.get("MTP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mtp-image-builder")
    return Path(base) / "sources"


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, env=env)


def fetch_archive(comp: Component) -> bytes:
    """`git archive` of the component's pinned commit (a tar), fetched or from the cache."""
    assert comp.source == "git" and comp.commit and comp.repo
    cache = cache_dir() / f"{comp.commit}.tar"
    if cache.is_file():
        data = cache.read_bytes()
        meta = cache.with_suffix(".sha256")
        if meta.is_file() and meta.read_text().strip() == hashlib.sha256(data).hexdigest():
            return data
    with tempfile.TemporaryDirectory(prefix="mtp-src-") as tmp:
        repo = Path(tmp)
        steps = [["init", "-q"], ["fetch", "-q", "--depth", "1", comp.repo, comp.commit]]
        for args in steps:
            proc = _git(args, repo)
            if proc.returncode != 0:
                raise EnvironmentProblem(
                    f"git {' '.join(args[:2])} {comp.repo} {comp.commit} failed for {comp.name}: "
                    f"{proc.stderr.decode(errors='replace').strip()[-300:]} (fix: check network access, "
                    "or point git at a mirror with url.<mirror>.insteadOf)")
        head = _git(["rev-parse", "FETCH_HEAD^{commit}"], repo).stdout.decode().strip()
        if head != comp.commit:
            raise EnvironmentProblem(f"{comp.repo} gave commit {head} for {comp.name}, the plan pins "
                                     f"{comp.commit}")
        proc = _git(["archive", "--format=tar", comp.commit], repo)
        if proc.returncode != 0:
            raise EnvironmentProblem(f"git archive {comp.commit} failed: {proc.stderr.decode()[-300:]}")
        data = proc.stdout
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmpf = cache.with_suffix(".tmp")
    tmpf.write_bytes(data)
    tmpf.replace(cache)
    cache.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    return data


def source_entries(comp: Component, archive: bytes) -> list[tuple[str, bytes, int]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue  # directories are implied; symlinks in sources are not needed to install
            data = tar.extractfile(member).read()
            mode = 0o755 if member.mode & 0o111 else 0o644
            out.append((f"src/{comp.name}/{member.name}", data, mode))
    origin = {"name": comp.name, "repo": comp.repo, "commit": comp.commit, "ref": comp.ref}
    out.append((f"src/{comp.name}/.mtp-source.json",
                (json.dumps(origin, indent=2, sort_keys=True) + "\n").encode(), 0o644))
    return out


def build_context(rendered: Rendered, progress=print) -> bytes:
    """The full context tar: rendered files plus src/<name>/ for each git component."""
    extra: list[tuple[str, bytes, int]] = []
    for comp in rendered.plan.components:
        if comp.source != "git":
            continue
        progress(f"source  {comp.name:<16} {comp.repo} @ {comp.commit[:12]}")
        extra.extend(source_entries(comp, fetch_archive(comp)))
    return deterministic_tar(rendered.files, extra)
