"""Patches: a fix on top of a component, pinned by the sha256 of its bytes.

Two kinds, one model (the same fields, checks and records for wheels and git sources):

  by reference   repo + base + head (+ paths): the fix is the diff base..head that the tool
                 makes itself from the two commits (gitfetch.commit_diff: both fetched by the
                 one git fetcher, the diff made with fixed options so its bytes do not depend
                 on anyone's git configuration). No upstream code is carried in this project.
  local file     file: patches/... under manifests/, for a site's own fixes.

Rendering stays pure: the Plan records the pin and the Dockerfile names the file; the bytes
are made (and their sha256 checked) only where they are used: the build context
(buildctx.py), `lock` (does it apply?) and the sglang source probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mtpimage import gitfetch
from mtpimage.errors import EnvironmentProblem, InputError


def short_repo(url: str) -> str:
    """https://github.com/ArronHZG/sglang(.git) -> ArronHZG/sglang."""
    tail = re.sub(r"\.git$", "", str(url).rstrip("/")).split("/")[-2:]
    return "/".join(t for t in tail if t)


def context_name(p: Any) -> str:
    """The patch's file name in the build context (render.patch_name prefixes its position)."""
    if getattr(p, "repo", None):
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", short_repo(p.repo)).strip("-") or "patch"
        return f"{slug}-{p.base[:12]}-{p.head[:12]}.patch"
    return Path(p.file).name


def describe(p: Any) -> str:
    """One line naming a patch, from a Patch, a plan dict, a version-vector or lock entry:
    `ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 <64 hex>`."""
    get = p.get if isinstance(p, Mapping) else (lambda k, d=None: getattr(p, k, d))
    sha = get("sha256")
    if get("repo") and get("base") and get("head"):
        paths = list(get("paths") or ())
        n = len(paths)
        scope = f"{n} file{'s' if n != 1 else ''}" if n else "whole diff"
        return f"{short_repo(get('repo'))} {get('base')[:8]}..{get('head')[:8]} ({scope}), sha256 {sha}"
    return f"{get('file')} (local file), sha256 {sha}"


class PatchUnavailable(EnvironmentProblem):
    """A patch by reference whose commits could not be fetched (or diffed)."""

    def __init__(self, comp: str, index: int, p: Any, exc):
        self.offline = bool(getattr(exc, "offline", False))
        self.reason = (
            f"{p.repo} commit {getattr(exc, 'commit', None) or '?'}: git says: {exc.stderr or '(no message)'}"
        )
        super().__init__(
            f"patch {index} of {comp} ({describe(p)}): cannot fetch {p.repo} commit "
            f"{getattr(exc, 'commit', None) or '?'} ({exc.what}): git says: {exc.stderr or '(no message)'} "
            f"(fix: check that base {p.base} and head {p.head} exist in {p.repo} (`git ls-remote {p.repo}`; "
            "a force-pushed fork branch loses its commits: pin commits that still exist, e.g. the merged "
            "upstream PR's), or point git at a mirror with url.<mirror>.insteadOf)"
        )


def origin(plan: Any, comp: str, manifests_root: Path | None) -> str:
    """Where a component's patch list was written, for error messages made after the plan."""
    if "patches" in dict(getattr(plan, "profile_overridden_fields", ()) or ()).get(comp, ()):
        return f"profile {plan.profile} (stack.overrides.{comp}.patches)"
    return f"{Path(manifests_root).name if manifests_root else 'manifests'}/components.yaml"


def patch_bytes(comp: str, index: int, p: Any, manifests_root: Path | None, where: str) -> bytes:
    """The patch's bytes, verified against its pinned sha256.

    By reference: the diff of its two commits (fetched through the git cache). A path in
    `paths` that the diff does not change, an empty diff, or a sha256 that differs from the
    pin are one-line InputErrors naming the key and the fix; a commit that cannot be fetched
    is PatchUnavailable naming the repository and the commit."""
    key = f"components.{comp}.patches[{index}]"
    if getattr(p, "repo", None):
        try:
            data, files = gitfetch.commit_diff(p.repo, p.base, p.head, tuple(p.paths))
        except gitfetch.GitError as exc:
            raise PatchUnavailable(comp, index, p, exc) from None
        short = f"{short_repo(p.repo)} {p.base[:8]}..{p.head[:8]}"
        for i, path in enumerate(p.paths):
            if path not in files:
                raise InputError(
                    where,
                    f"{key}.paths[{i}]",
                    f"{path!r} is not changed between base and head of {short}",
                    "list only files the fix changes (`git diff --name-only BASE HEAD` in "
                    "a clone), or check base and head",
                )
        if not data:
            raise InputError(
                where,
                f"{key}.head",
                f"the diff {short} is empty",
                "set base to where the fix branched off (git merge-base) and head to its last commit",
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != p.sha256:
            raise InputError(
                where,
                f"{key}.sha256",
                f"the diff {short} ({len(files)} file{'s' if len(files) != 1 else ''}) has sha256 "
                f"{digest}, the manifest pins {p.sha256}",
                f"review it (`{gitfetch.diff_command(p.base[:12], p.head[:12], tuple(p.paths))}` "
                f"in a clone of {p.repo}); if it is the fix you want, set sha256: {digest}",
            )
        return data
    root = Path(manifests_root or ".").resolve()
    path = (root / p.file).resolve()
    if root not in path.parents or not path.is_file():
        raise InputError(
            where,
            f"{key}.file",
            f"patch file {p.file!r} not found under {root.name}/",
            "keep a site's own patch under manifests/patches/, or pin the fix by its commits",
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != p.sha256:
        raise InputError(
            where,
            f"{key}.sha256",
            f"patch file {p.file} changed after the plan was made: sha256 {digest}, "
            f"the manifest pins {p.sha256}",
            "re-run; if it persists, review the file and update its sha256",
        )
    return data


@contextlib.contextmanager
def as_files(
    comp: str, patches: tuple, manifests_root: Path | None, where: str
) -> Iterator[list[tuple[Path, int]]]:
    """Each patch's verified bytes in a temporary file, as [(path, strip)], for `git apply`
    and `patch`; removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="mtp-patches-") as tmp:
        out = []
        for i, p in enumerate(patches):
            f = Path(tmp) / f"{i:03d}-{context_name(p)}"
            f.write_bytes(patch_bytes(comp, i, p, manifests_root, where))
            out.append((f, p.strip))
        yield out
