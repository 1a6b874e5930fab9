"""The build context: rendered files + the pinned sources and patches, as one normalised tar.

Sources of git components come from the one git fetcher (gitfetch.fetch) on this machine,
so the user's git configuration applies (url.<mirror>.insteadOf, credential helpers,
proxies), and the build itself needs no access to the git servers. Each fetch is checked
against the Plan's commit, retried under the network policy and cached by repository and
commit.
Patches by reference are made here from their two commits (same fetcher, same cache),
local patch files read from manifests/; either is checked against its pinned sha256.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from mtpimage import gitfetch
from mtpimage.assembly import extbuild
from mtpimage.assembly.render import Rendered, deterministic_tar
from mtpimage.assembly.steps import patch_name
from mtpimage.errors import EnvironmentProblem, last_words
from mtpimage.ext.wheelcache import WheelCache
from mtpimage.manifests import patches
from mtpimage.plan.model import Component


def fetch_archive(comp: Component) -> bytes:
    """A tar of the component's pinned commit, from the one git fetcher (gitfetch.fetch: cache
    keyed by repository and commit, retries, url.insteadOf mirrors, partial mirrors opted in)."""
    assert comp.source == "git" and comp.commit and comp.repo
    return _tree_archive(comp.name, comp.repo, comp.commit)


def fetch_tree_entries(name: str, repo: str, commit: str, prefix: str) -> list[tuple[str, bytes, int]]:
    """<prefix>/... : the files of a git tree at a pinned commit (a compiled extension's
    source), plus .mtp-source.json naming where it came from."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(_tree_archive(name, repo, commit))) as tar:
        for member in tar.getmembers():
            if member.isfile():
                mode = 0o755 if member.mode & 0o111 else 0o644
                out.append((f"{prefix}/{member.name}", tar.extractfile(member).read(), mode))
    origin = {"name": name, "repo": repo, "commit": commit}
    out.append((f"{prefix}/.mtp-source.json", (json.dumps(origin, sort_keys=True) + "\n").encode(), 0o644))
    return out


def _tree_archive(name: str, repo: str, commit: str) -> bytes:
    try:
        tree = gitfetch.fetch(repo, commit)
    except gitfetch.GitError as exc:
        raise _fetch_error(name, exc) from None
    proc = gitfetch.git("ls-files", "-z", "--cached", cwd=tree.path)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"git ls-files in the {name} cache failed: {last_words(proc.stderr, 300)}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(x for x in proc.stdout.split("\0") if x):
            path = tree.path / rel
            if not path.is_file() or path.is_symlink():
                continue  # sparse (missing from the mirror) or a link: not needed to install
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


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
    if comp.subdir not in (".", ""):
        origin["subdir"] = comp.subdir  # PEP 610's `subdirectory` in the image (mtp_install.py)
    missing = gitfetch.missing_paths(gitfetch.tree_dir(comp.repo, comp.commit))
    if missing:
        origin["missing_from_mirror"] = missing
    out.append(
        (
            f"src/{comp.name}/.mtp-source.json",
            (json.dumps(origin, indent=2, sort_keys=True) + "\n").encode(),
            0o644,
        )
    )
    return out


def patch_entries(rendered: Rendered, progress=print) -> list[tuple[str, bytes, int]]:
    """patches/<name>/<iii>-<file> for every patch of the Plan, each verified against its
    sha256 (a patch by reference is the diff of its two commits, made here)."""
    plan = rendered.plan
    out = []
    for comp in plan.components:
        where = patches.origin(plan, comp.name, rendered.manifests_root)
        for i, p in enumerate(comp.patches):
            progress(f"patch   {comp.name:<16} {p.describe()}")
            data = patches.patch_bytes(comp.name, i, p, rendered.manifests_root, where)
            out.append((f"patches/{comp.name}/{patch_name(i, p)}", data, 0o644))
    return out


def fetch_sources_first(rendered: Rendered, progress=print) -> None:
    """Fetch and verify every source the build will read (each git component's pinned commit,
    each patch against its sha256, the source of each extension that is not in the wheel cache)
    before anything compiles: a missing mirror fails in seconds with its fix, not after a
    26-minute TransformerEngine compile. Everything lands in the caches that build_context
    reads next, so nothing is fetched twice."""
    plan = rendered.plan
    cache = WheelCache()
    n_git = n_ext = 0
    for comp in plan.components:
        if comp.source == "git":
            _fetch_tree(comp.name, comp.repo, comp.commit)
            n_git += 1
    for stage in rendered.recipe.builders:
        pkg = stage.package
        if cache.get(stage.key) is not None:
            continue  # its wheel is here: the source is not needed
        if pkg.build.source == "sdist":
            extbuild.fetch_sdist(pkg)
        else:
            _fetch_tree(pkg.name, pkg.build.repo, pkg.build.commit)
        n_ext += 1
    n_patches = len(patch_entries(rendered, progress=lambda _msg: None))
    progress(
        f"sources {n_git} git source(s), {n_ext} extension source(s), {n_patches} patch(es): "
        "fetched and verified before any build step"
    )


def _fetch_tree(name: str, repo: str, commit: str) -> None:
    """gitfetch.fetch with build_context's one-line error (the mirror fix)."""
    try:
        gitfetch.fetch(repo, commit)
    except gitfetch.GitError as exc:
        raise _fetch_error(name, exc) from None


def _fetch_error(name: str, exc) -> EnvironmentProblem:
    if exc.fix:  # git named the mirror setting that is off; its message carries the fix
        return EnvironmentProblem(f"cannot fetch {name}: {exc.one_line()}")
    return EnvironmentProblem(
        f"cannot fetch {name}: {exc.one_line()} (fix: check network access, "
        "or point git at a mirror with url.<mirror>.insteadOf)"
    )


def build_context(
    rendered: Rendered, progress=print, wheels: dict | None = None, only_extension: str | None = None
) -> bytes:
    """The full context tar: rendered files plus src/<name>/ for each git component,
    patches/<name>/ for each component's patches, and build/ext-wheels/ with the compiled
    extensions' cached wheels (`wheels`, from extbuild.ensure_wheels). With `only_extension`,
    the context of that extension's builder stage instead: the rendered files and its
    source (ext-src/<name>/), nothing else."""
    if only_extension is not None:
        pkg = rendered.plan.package(only_extension)
        progress(f"source  {pkg.name:<16} {extbuild.extensions.origin(pkg)}")
        b = pkg.build
        src = (
            extbuild.sdist_entries(pkg)
            if b.source == "sdist"
            else fetch_tree_entries(
                pkg.name, b.repo, b.commit, f"{extbuild.extensions.CONTEXT_SRC}/{pkg.name}"
            )
        )
        return deterministic_tar(rendered.files, src)
    extra: list[tuple[str, bytes, int]] = extbuild.wheel_entries(rendered, wheels or {})
    for comp in rendered.plan.components:
        if comp.source != "git":
            continue
        progress(f"source  {comp.name:<16} {comp.repo} @ {comp.commit[:12]}")
        extra.extend(source_entries(comp, fetch_archive(comp)))
    extra.extend(patch_entries(rendered, progress))
    return deterministic_tar(rendered.files, extra)


def write_context(rendered: Rendered, out: Path, progress=print, wheels: dict | None = None) -> int:
    """The full build context as a directory (`render --with-sources`): exactly the tar the
    tool sends (with the compiled extensions' `wheels`, as the pipeline gets them), so
    `docker build DIR` builds what the tool builds. The src/ and patches/ folders of the
    plan's components are replaced whole, so files of an earlier commit never linger.
    Returns the number of files written."""
    data = build_context(rendered, progress, wheels=wheels)
    out = Path(out)
    for comp in rendered.plan.components:
        for owned in (out / "src" / comp.name, out / "patches" / comp.name):
            if owned.is_dir() and not owned.is_symlink():
                shutil.rmtree(owned)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(out, filter="data")  # our own tar; the filter refuses links and ../ anyway
    return len(files)
