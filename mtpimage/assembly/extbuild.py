"""Getting the compiled extensions' wheels for a build: from the wheel cache, else from a
shared registry, else by building their builder stage (one BuildKit build per missing key,
`--target mtp-ext-wheel-<name> --output type=local`), then into the build context by sha256.

Sources reach the builder through the build context (ext-src/<name>/): an sdist downloaded
here under the network policy and checked against its pinned sha256 (cached by that hash),
or a git tree from the one git fetcher (gitfetch.py), so mirrors and credentials apply.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mtpimage import netpolicy, settings
from mtpimage.assembly.render import Rendered
from mtpimage.errors import EnvironmentProblem
from mtpimage.ext import ccacheserver, extensions, wheelpins
from mtpimage.ext.compileprogress import CompileProgress
from mtpimage.ext.wheelcache import WheelCache, file_sha256
from mtpimage.ext.wheelshare import REPOSITORY, pull, push, repository_tags
from mtpimage.gitfetch import cache_root
from mtpimage.lock.pydeps import ca_bundle, rewrite, sha256_file
from mtpimage.plan.model import Package

Say = Callable[[str], None]


class ExtensionBuildFailed(EnvironmentProblem):
    exit_code = 1


# ----------------------------------------------------------------------------- sources
def _sdist_dir() -> Path:
    return cache_root() / "sdists"


def fetch_sdist(pkg: Package) -> Path:
    """The pinned sdist, from the cache (by sha256) or downloaded and checked."""
    import requests

    b = pkg.build
    name = b.url.rsplit("/", 1)[-1]
    path = _sdist_dir() / b.sha256 / name
    if path.is_file() and sha256_file(path) == b.sha256:
        return path
    url = rewrite(b.url)

    def get() -> bytes:
        r = requests.get(url, timeout=netpolicy.http_timeout(), verify=ca_bundle() or True)
        r.raise_for_status()
        return r.content

    def transient(exc: BaseException) -> bool:
        code = getattr(getattr(exc, "response", None), "status_code", None)
        return code is None or code >= 500 or code == 429

    mirrored = url != b.url  # MTP_INDEX_REWRITE sent it to a mirror
    try:
        data = netpolicy.retrying(transient)(get)
    except Exception as exc:  # noqa: BLE001 - any failure is one line naming the fix
        raise EnvironmentProblem(
            f"cannot download {pkg.name}'s sdist {url}: {str(exc).splitlines()[0][:200]} "
            + (
                "(fix: start or reach the mirror MTP_INDEX_REWRITE names, or correct the setting)"
                if mirrored
                else "(fix: check network access, or mirror the index with MTP_INDEX_REWRITE)"
            )
        ) from None
    got = hashlib.sha256(data).hexdigest()
    if got != b.sha256:
        raise ExtensionBuildFailed(
            f"{pkg.name}: {name} from {url} has sha256 {got}, components.yaml pins {b.sha256} "
            + (
                "(fix: the mirror MTP_INDEX_REWRITE names serves other bytes than the original: "
                "resync it, or correct the setting)"
                if mirrored
                else "(fix: the file changed under the same URL; find out why before pinning the new hash)"
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def sdist_entries(pkg: Package) -> list[tuple[str, bytes, int]]:
    """ext-src/<name>/<sdist file>: the pinned sdist, checked against its sha256."""
    path = fetch_sdist(pkg)
    return [(f"{extensions.CONTEXT_SRC}/{pkg.name}/{path.name}", path.read_bytes(), 0o644)]


# ----------------------------------------------------------------------------- wheels
def _cache():
    return WheelCache()


def share_repository() -> str | None:
    """Where compiled wheels are shared (MTP_WHEEL_CACHE_REPO, HOST[:PORT]/NS/NAME): pulled
    on a local miss, pushed after a build. None: this machine's cache only."""
    return settings.current().wheel_cache_repo


def resolve_share(repo: str, say: Say) -> str:
    """MTP_WHEEL_CACHE_REPO in either form: the repository itself (`REG/NS/NAME`), or the
    `--registry` form that `wheels push`/`pull` take (`REG/NS`, whose repository is
    `REG/NS/ext-wheels`). A name cannot tell them apart (the generated workflows share through
    `REG/mtp-ext-wheels`), so the registry is asked, once, before anything compiles: a
    repository that holds no tags while `REPO/ext-wheels` does was meant as the namespace."""
    if repo.rstrip("/").endswith("/" + REPOSITORY) or repository_tags(repo):
        return repo
    under = f"{repo.rstrip('/')}/{REPOSITORY}"
    if repository_tags(under):
        say(f"share   MTP_WHEEL_CACHE_REPO={repo} names a namespace: its wheels are in {under} (using that)")
        return under
    return repo


def max_jobs(plan_default: int) -> int:
    return settings.current().ext_max_jobs or plan_default


def ensure_wheels(
    rendered: Rendered,
    context_for,
    request_for,
    say: Say = print,
    jobs: int = 2,
    only: frozenset[str] | None = None,
) -> dict:
    """Every compiled extension's wheel for this plan (or the `only` ones), by key: {name: CachedWheel}.
    `context_for(name)` makes the builder's context (buildctx.build_context) and
    `request_for(context_tar, target, out_dir, build_args)` runs one BuildKit build (the
    pipeline passes its engine and options, so secrets and the builder are the same) on the
    host network: the builder reaches the compile cache this serves on loopback."""
    with contextlib.ExitStack() as stack:
        return _ensure(rendered, context_for, request_for, say, jobs, stack, only)


def _ensure(rendered: Rendered, context_for, request_for, say: Say, jobs: int, stack, only=None) -> dict:
    plan = rendered.plan
    cache = _cache()
    repo = share_repository()
    asked = False  # the share's form is asked of the registry at the first local miss only
    pins = wheelpins.load(rendered.manifests_root)
    remote: list[str] = []  # the compile cache's URL, served only while something compiles
    out: dict = {}
    for stage in rendered.recipe.builders:
        pkg, key = stage.package, stage.key
        if only is not None and pkg.name not in only:
            continue
        pin = pins.get(key)
        hit = cache.get(key)
        if hit is not None:
            wheelpins.check(
                pins,
                key,
                hit.sha256,
                f"wheel cache entry {cache.root / key}",
                f"the cache's wheel is not the reviewed one: `build.py wheels remove {key[:12]}`, then "
                "build or `wheels pull` it again",
            )
        if hit is None and repo:
            if not asked:
                repo, asked = resolve_share(repo, say), True
            hit = pull(cache, key, repo, pin=pin)
            if hit is not None:
                say(f"wheel   {pkg.name:<16} {hit.filename} from {repo} (key {key[:12]})")
        if hit is not None:
            say(f"wheel   {pkg.name:<16} {hit.filename} sha256 {hit.sha256[:12]} (cached, key {key[:12]})")
            if pin is None:
                say(wheelpins.unpinned_note(pkg.name, key, hit.sha256, plan.profile))
            out[pkg.name] = hit
            continue
        say(
            f"compile {pkg.name:<16} {pkg.version} from {extensions.origin(pkg)} (key {key[:12]}, {jobs} jobs)"
        )
        if not remote:
            remote.append(stack.enter_context(ccacheserver.serve()))
        with tempfile.TemporaryDirectory(prefix="mtp-ext-") as tmp:
            wheel, meta = compile_wheel(
                rendered, pkg, context_for, request_for, jobs, remote[0], Path(tmp), say
            )
            wheelpins.check(
                pins,
                key,
                file_sha256(wheel),
                f"the {pkg.name} wheel compiled here",
                "its build is not reproducible from its key here, or the pin is wrong: find out which "
                f"(`build.py wheels verify {key[:12]}` elsewhere) before changing {wheelpins.PINS_NAME}",
            )
            hit = cache.put(key, wheel, meta)
        say(
            f"wheel   {pkg.name:<16} {hit.filename} sha256 {hit.sha256[:12]} built in "
            f"{meta['build_seconds']:.0f}s (key {key[:12]})"
        )
        if pin is None:
            say(wheelpins.unpinned_note(pkg.name, key, hit.sha256, plan.profile))
        if repo:
            say(f"share   {pkg.name:<16} {push(cache, key, repo, say=say)}")
        out[pkg.name] = hit
    return out


def compile_wheel(
    rendered: Rendered,
    pkg: Package,
    context_for,
    request_for,
    jobs: int,
    remote: str,
    tmp: Path,
    say: Say = print,
) -> tuple[Path, dict]:
    """Run `pkg`'s builder stage once into `tmp`: (the one wheel it left, its meta.json).
    Its output is read for progress (objects done, elapsed, estimate, compile-cache hits: a
    live line on a terminal, a line a minute in a log); the builder's own lines are said."""
    context = context_for(pkg.name)
    t0 = time.monotonic()
    args = (("MTP_EXT_MAX_JOBS", str(jobs)), ("MTP_CCACHE_REMOTE", remote))
    progress = CompileProgress(pkg.name, say, live=sys.stderr.isatty())
    try:
        request_for(context, extensions.wheel_stage(pkg.name), tmp, args, on_line=progress.feed)
    except BaseException:  # a failed or interrupted compile: say where it stopped, not "compiled"
        say(progress.finish(stopped=True))
        raise
    say(progress.finish())
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise ExtensionBuildFailed(
            f"{pkg.name}: its builder stage left {len(wheels)} wheels, expected one "
            f"({', '.join(w.name for w in wheels) or 'none'})"
        )
    info_file = tmp / "build.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    meta = {
        "inputs": rendered.recipe.builder(pkg.name).key_inputs,
        "built_by": f"{platform.node()} ({os.cpu_count()} cores), BuildKit",
        "built_at": int(time.time()),
        "build_seconds": round(time.monotonic() - t0, 1),
        "compile_seconds": info.get("seconds"),
        "max_jobs": jobs,
        "ccache": info.get("ccache", []),
    }
    return wheels[0], meta


def wheel_entries(rendered: Rendered, wheels: dict) -> list[tuple[str, bytes, int]]:
    """build/ext-wheels/: each wheel, a hash-pinned requirements file (pip refuses any other
    bytes), and extensions.json for the image's records."""
    if not wheels:
        return []
    base = extensions.CONTEXT_WHEELS
    out, reqs, listing = [], [], []
    for stage in rendered.recipe.builders:
        pkg, entry = stage.package, stage.entry
        w = wheels[pkg.name]
        out.append((f"{base}/{w.filename}", w.path.read_bytes(), 0o644))
        reqs.append(f"{pkg.name} @ file:///tmp/mtp-ext-wheels/{w.filename} --hash=sha256:{w.sha256}\n")
        listing.append({**entry, "wheel": w.filename, "sha256": w.sha256})
    out.append((f"{base}/requirements.txt", "".join(reqs).encode(), 0o644))
    out.append((f"{base}/extensions.json", extensions.wheels_listing(listing), 0o644))
    return out
