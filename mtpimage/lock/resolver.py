"""One resolution of a whole image's Python environment, with uv, and the exact file of each pin.

Why uv (`uv pip compile`): verl's own images resolve with uv, it resolves the real stack in
seconds where pip backtracked for minutes, and it takes upstream's conflict handling as data:
`--overrides` (a requirement that replaces every declaration of that package) and
`--excludes` (a package dropped from the resolution). The image itself never resolves: it
installs the files chosen here with `pip install --no-deps --require-hashes --only-binary`.

Inputs are requirements plus *stub wheels*: metadata-only wheels standing for what the
indexes cannot answer for: a git source (its Requires-Dist as read from the source, or as
declared in components.yaml when it is installed without its declared dependencies) and a
package whose index is unreachable from here (its Requires-Dist as data, with where that
fact came from). Stubs are named by direct reference, so an index file of the same version
never wins over them.

File selection: for every resolved `name==version` from a real index, the index's PEP 691
JSON page gives the files with their sha256; the wheel is the one whose best tag ranks first
for the target (CPython 3.12, the base image's glibc, the platform's CPU: x86_64 or aarch64),
as pip would pick it there.

One resolution and one file choice per platform (`arch`): uv's --python-platform and the
wheel tags are the platform's, and both caches (the online marker, the chosen files) are keyed
by it, so two platforms never share an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from mtpimage import children, netpolicy, settings
from mtpimage.errors import EnvironmentProblem
from mtpimage.gitfetch import cache_root
from mtpimage.lock import pydeps

UV_PLATFORM = pydeps.uv_platform()  # linux/amd64's; resolve(arch=...) takes another


class ResolutionFailed(Exception):
    """uv could not resolve: its reason first, then its warnings (uv prints them before the
    reason, and they were read as the cause)."""

    def __init__(self, reason: str, warnings: tuple[str, ...] = ()):
        self.reason, self.warnings = reason, tuple(warnings)
        tail = f" (uv's warnings: {'; '.join(self.warnings)})" if self.warnings else ""
        super().__init__(reason + tail)

    @property
    def no_platform_wheel(self) -> dict[str, str]:
        """{name: version} of pins uv refused because no file of theirs installs on the target
        platform (uv: "X==V has no wheels with a matching platform tag"; "all versions of X"
        when every version lacks one: version "")."""
        out = {
            canonicalize_name(n): v
            for n, v in re.findall(
                r"([A-Za-z0-9._-]+)==([^\s,]+?) has no wheels with a matching platform tag", self.reason
            )
        }
        for n in re.findall(
            r"all versions of ([A-Za-z0-9._-]+) have no wheels with a matching platform tag", self.reason
        ):
            out.setdefault(canonicalize_name(n), "")
        return dict(sorted(out.items()))

    @property
    def not_on_index(self) -> list[str]:
        """`NAME==VERSION` pins the index does not list (uv: "there is no version of ..."),
        or names it does not serve at all ("... was not found in the package registry")."""
        found = re.findall(r"there is no version of ([A-Za-z0-9._-]+==[^\s,]+?)(?=[\s,]|$)", self.reason)
        found += re.findall(r"\b([A-Za-z0-9._-]+) was not found in the package registry", self.reason)
        return list(dict.fromkeys(found))


def uv_failure(stderr: str, returncode: int) -> ResolutionFailed:
    """uv's stderr as a ResolutionFailed: the lines that say why, then its warnings apart."""
    lines = [line for line in stderr.splitlines() if line.strip() and not _UNDATED.search(line)]
    warned = [line for line in lines if line.strip().lower().startswith("warning:")]
    reason = " ".join(" ".join(line for line in lines if line not in warned).split())
    warnings = tuple(" ".join(w.split())[:300] for w in warned[:5])
    return ResolutionFailed(reason[-2500:] or f"uv exited {returncode}", warnings)


@dataclass
class Resolved:
    packages: dict = field(default_factory=dict)  # canonical name -> {"version", "via": [...], "stub": bool}
    seconds: float = 0.0
    unbounded: list[str] = field(default_factory=list)  # resolved without the cutoff: no upload times


def uv_bin() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise EnvironmentProblem(
        "uv is not installed (fix: pip install -r requirements.txt; "
        "`python3 build.py` does it on its first run)"
    )


def _uv_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env["UV_CACHE_DIR"] = str(cache_root() / "uv")
    env["UV_NO_CONFIG"] = "1"  # a user's uv.toml must not change the answer
    env["UV_PYTHON_DOWNLOADS"] = "never"  # resolving for 3.12 needs no interpreter download (and
    # asking for one costs seconds where GitHub is unreachable)
    env["UV_HTTP_RETRIES"] = str(netpolicy.attempts())  # the network policy, as pip's --retries
    if pydeps.ca_bundle():
        env["SSL_CERT_FILE"] = pydeps.ca_bundle()
    return env


_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?"
    r"(?:==(?P<version>[^\s#]+)| @ (?P<url>\S+))\s*(?:#\s*via\s+(?P<via>.*))?$"
)


def parse_compiled(text: str) -> dict:
    out: dict = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ResolutionFailed(f"cannot read uv's output line {line!r}")
        via = [v.strip() for v in (m.group("via") or "").split(",") if v.strip()]
        entry = {"via": sorted(canonicalize_name(v) for v in via if not v.startswith("-"))}
        if m.group("url"):
            stub = re.search(r"/([^/]+?)-([^-/]+)-py3-none-any\.whl$", m.group("url"))
            entry.update(version=stub.group(2) if stub else "", stub=True)
        else:
            entry.update(version=m.group("version"), stub=False)
        out[canonicalize_name(m.group("name"))] = entry
    return dict(sorted(out.items()))


# uv's warning for a file whose index serves no upload time (PEP 700): with a cutoff, uv drops
# such files, so a package that only has them would not resolve at all
_UNDATED = re.compile(r"`([^`]+)` is missing an upload date")


def _undated_packages(stderr: str) -> set[str]:
    from packaging.utils import InvalidSdistFilename, parse_sdist_filename

    out = set()
    for fname in _UNDATED.findall(stderr):
        try:
            out.add(str(parse_wheel_filename(fname)[0]))
        except InvalidWheelFilename:
            try:
                out.add(str(parse_sdist_filename(fname)[0]))
            except InvalidSdistFilename:
                continue
    return out


def _online_marker(key: dict) -> Path:
    """Where `resolve` notes that exactly these inputs were resolved online: only then may a
    later run answer from uv's cache alone. A cache filled before a recorded cutoff moved
    (a colleague's `lock --upgrade`, pulled here) lacks files uploaded before the new cutoff,
    and answering from it would give another lock than the indexes do."""
    blob = json.dumps(key, sort_keys=True).encode()
    return cache_root() / "uv-online" / hashlib.sha256(blob).hexdigest()[:32]


def _write_inputs(
    tmpd: Path, requirements: list[str], stubs: dict, overrides: list[str], excludes: list[str]
) -> None:
    """uv's input files: the requirements (stubbed distributions as file URLs of their
    stand-in wheels), the overrides and the excludes."""
    wheels = {}
    for name, spec in sorted(stubs.items()):
        wheels[canonicalize_name(name)] = pydeps.write_stub_wheel(
            tmpd, name, spec["version"], list(spec.get("requires") or []), spec.get("extras") or {}
        )
    lines = []
    for line in requirements:
        name = canonicalize_name(re.split(r"[\[=<>!~ ;@]", line, maxsplit=1)[0])
        if name in wheels:
            extras = re.match(r"^[^\[]*(\[[^\]]*\])?", line).group(1) or ""
            lines.append(f"{name}{extras} @ {wheels[name].as_uri()}")
        else:
            lines.append(line)
    (tmpd / "requirements.in").write_text("".join(f"{x}\n" for x in lines))
    (tmpd / "overrides.txt").write_text("".join(f"{x}\n" for x in overrides))
    (tmpd / "excludes.txt").write_text("".join(f"{x}\n" for x in excludes))


def _write_preferences(tmpd: Path, preferences: dict[str, str]) -> Path:
    """uv's preferences: an existing output file whose `name==version` lines uv keeps where
    they still satisfy every requirement (it rewrites the file; the answer is read from stdout)."""
    path = tmpd / "preferred.txt"
    path.write_text("".join(f"{canonicalize_name(n)}=={v}\n" for n, v in sorted(preferences.items())))
    return path


def _compile_command(
    tmpd: Path, python: str, index_urls: list[str], find_links: list[str] | None, arch: str = pydeps.ARCH
) -> list[str]:
    """`uv pip compile` for the target platform over _write_inputs' files (the cutoff and
    --offline are added per attempt)."""
    # not --quiet: uv's warnings name the files that have no upload time
    cmd = [
        uv_bin(),
        "pip",
        "compile",
        str(tmpd / "requirements.in"),
        "--no-header",
        "--annotation-style",
        "line",
        "--python-version",
        python,
        "--python-platform",
        pydeps.uv_platform(arch),
        "--prerelease",
        "if-necessary-or-explicit",
        "--overrides",
        str(tmpd / "overrides.txt"),
        "--excludes",
        str(tmpd / "excludes.txt"),
    ]
    if index_urls and index_urls[0]:
        cmd += ["--default-index", pydeps.rewrite(index_urls[0])]
        for url in index_urls[1:]:
            cmd += ["--index", pydeps.rewrite(url)]
    else:
        cmd += ["--no-index", "--offline"]
    for link in find_links or []:
        cmd += ["--find-links", link]
    return cmd


def resolve(
    requirements: list[str],
    stubs: dict,
    overrides: list[str],
    excludes: list[str],
    index_urls: list[str],
    python: str,
    find_links: list[str] | None = None,
    exclude_newer: str | None = None,
    exclude_newer_package: dict | None = None,
    preferences: dict[str, str] | None = None,
    arch: str = pydeps.ARCH,
) -> Resolved:
    """requirements: PEP 508 lines; stubs: name -> {"version", "requires", "extras"};
    index_urls: reachable indexes, the default (PyPI) first; exclude_newer: the resolution
    cutoff (RFC 3339 UTC: files uploaded later are not candidates), exclude_newer_package:
    name -> an older cutoff for that package. Raises ResolutionFailed with uv's explanation
    of the conflict. A package whose index serves no upload times cannot be bounded by a
    cutoff; it is resolved without one and named in `Resolved.unbounded`. preferences: name ->
    version to keep where it still fits (the previous lock's pins, as uv keeps an existing
    output file's), so a re-lock at the same cutoff is a fixed point even on an index that
    lists files later than their upload times say (seen here: filelock 4.3.2, uploaded
    2026-11-27, listed only after a lock at cutoff 2026-11-30 was made). arch: the platform's
    CPU (x86_64, aarch64): uv resolves for it (markers, wheel tags)."""
    import time

    with tempfile.TemporaryDirectory(prefix="mtp-resolve-") as tmp:
        tmpd = Path(tmp)
        _write_inputs(tmpd, requirements, stubs, overrides, excludes)
        cmd = _compile_command(tmpd, python, index_urls, find_links, arch)
        if preferences:
            cmd += ["--output-file", str(_write_preferences(tmpd, preferences))]
        holds = dict(exclude_newer_package or {})
        unbounded: set[str] = set()

        def cutoff_args() -> list[str]:
            if not exclude_newer:
                return []
            out = ["--exclude-newer", exclude_newer]
            for pkg in sorted(set(holds) | unbounded):
                out += ["--exclude-newer-package", f"{pkg}={'false' if pkg in unbounded else holds[pkg]}"]
            return out

        marker = _online_marker(
            {
                "uv": uv_bin(),
                "requirements": sorted(requirements),
                "stubs": stubs,
                "overrides": overrides,
                "excludes": excludes,
                "indexes": [pydeps.rewrite(u) for u in index_urls],
                "python": python,
                "python_platform": pydeps.uv_platform(arch),  # one answer per platform
                "find_links": find_links or [],
                "exclude_newer": exclude_newer,
                "exclude_newer_package": holds,
                "preferences": dict(sorted((preferences or {}).items())),
            }
        )
        t0 = time.monotonic()
        # Warm caches first: uv answers from its cache alone (--offline) when these exact inputs
        # were resolved online here before (the marker); anything missing, or
        # MTP_LOCK_REFRESH=1, asks the indexes again.
        offline = not settings.current().lock_refresh and bool(index_urls) and marker.is_file()
        proc = None
        for _ in range(64):  # each round names at least one more undated package; bounded anyway
            proc = children.run(
                cmd + cutoff_args() + (["--offline"] if offline else []),
                capture_output=True,
                text=True,
                env=_uv_env(),
                timeout=900,
            )
            if proc.returncode != 0 and offline:
                offline = False  # the cache lacks a page: ask the indexes
                continue
            more = _undated_packages(proc.stderr) - unbounded if exclude_newer else set()
            if not more:
                break
            unbounded |= more
        took = time.monotonic() - t0
        if proc.returncode != 0:
            raise uv_failure(proc.stderr.replace(str(tmpd), ""), proc.returncode)
        if index_urls and not marker.is_file():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("")
        return Resolved(parse_compiled(proc.stdout), took, sorted(unbounded))


def resolve_allowing_gaps(
    requirements: list[str],
    stubs: dict,
    overrides: list[str],
    excludes: list[str],
    index_urls: list[str],
    python: str,
    **kwargs,
) -> tuple[Resolved, dict[str, str]]:
    """resolve() on a platform where a pin may have no wheel at all (an aarch64 resolution of
    a stack locked for x86_64): each pin uv refuses for that reason alone is excluded and
    named, {name: version}, so the lock records what blocks the platform and the rest of its
    set; any other failure is raised as resolve() raises it."""
    gaps: dict[str, str] = {}
    for _ in range(32):  # each round names at least one more package; bounded anyway
        try:
            res = resolve(
                requirements, stubs, overrides, list(excludes) + sorted(gaps), index_urls, python, **kwargs
            )
            return res, gaps
        except ResolutionFailed as exc:
            more = {n: v for n, v in exc.no_platform_wheel.items() if n not in gaps}
            if not more:
                raise
            gaps.update(more)
    raise ResolutionFailed(f"more than 32 rounds of pins without a wheel: {', '.join(sorted(gaps))}")


# ----------------------------------------------------------------------------- file selection


def target_tags(python: str, arch: str = pydeps.ARCH) -> list:
    major, minor = (int(x) for x in python.split("."))
    plats = pydeps.platform_tags(arch) + [f"linux_{arch}"]
    tags = list(cpython_tags((major, minor), abis=[f"cp{major}{minor}", "abi3", "none"], platforms=plats))
    tags += list(compatible_tags((major, minor), interpreter=f"cp{major}{minor}", platforms=plats))
    return tags


def _html_files(url: str, text: str) -> list[dict]:
    """PEP 503 (HTML) simple page -> PEP 691-like file list; a link without a `#sha256=`
    fragment is downloaded and hashed (plain directory listings serve no hashes)."""
    import hashlib
    from html.parser import HTMLParser
    from urllib.parse import urljoin

    import requests

    links: list[str] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "a":
                href = dict(attrs).get("href")
                if href:
                    links.append(href)

    P().feed(text)
    files = []
    for href in links:
        full = urljoin(url, href)
        base, _, frag = full.partition("#")
        digest = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
        fname = base.rsplit("/", 1)[-1]
        if digest is None and fname.endswith((".whl", ".tar.gz")):
            h = hashlib.sha256()
            with requests.get(
                base, timeout=netpolicy.http_timeout(), verify=pydeps.ca_bundle() or True, stream=True
            ) as r:
                r.raise_for_status()
                for chunk in r.iter_content(1 << 20):
                    h.update(chunk)
            digest = h.hexdigest()
        files.append({"filename": fname, "hashes": {"sha256": digest} if digest else {}})
    return files


def _page(index_url: str, name: str) -> dict:
    import requests

    url = f"{pydeps.rewrite(index_url).rstrip('/')}/{name}/"

    class Unanswered(Exception):
        pass

    def once() -> dict:
        try:
            r = requests.get(
                url,
                timeout=netpolicy.http_timeout(),
                verify=pydeps.ca_bundle() or True,
                headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
            )
            if r.status_code == 200:
                if "json" in r.headers.get("content-type", ""):
                    return r.json()
                return {"files": _html_files(url, r.text)}
        except requests.RequestException as exc:
            raise Unanswered(str(exc)) from exc
        if r.status_code == 404:
            return {"files": []}
        raise Unanswered(f"HTTP {r.status_code}")

    try:
        return netpolicy.retrying(lambda exc: isinstance(exc, Unanswered))(once)
    except Unanswered as exc:
        raise EnvironmentProblem(f"index {url} did not answer: {exc}") from None


def choose_file(
    files: list[dict], name: str, version: str, tags: list, sdist_ok: bool = False
) -> dict | None:
    rank = {t: i for i, t in enumerate(tags)}
    best = None
    for f in files:
        fn = f.get("filename", "")
        if sdist_ok and fn.endswith(".tar.gz") and not f.get("yanked"):
            from packaging.utils import parse_sdist_filename

            try:
                sname, sver = parse_sdist_filename(fn)
            except Exception:  # noqa: BLE001 - an odd name is simply not a candidate
                continue
            if sname == canonicalize_name(name) and str(sver) == version and best is None:
                best = (10**9, f)
            continue
        if not fn.endswith(".whl") or f.get("yanked"):
            continue
        try:
            wname, wver, _, wtags = parse_wheel_filename(fn)
        except InvalidWheelFilename:
            continue
        if wname != canonicalize_name(name) or str(wver) != version:
            continue
        score = min((rank[t] for t in wtags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, f)
    if best is None:
        return None
    f = best[1]
    out = {"file": f["filename"], "sha256": (f.get("hashes") or {}).get("sha256")}
    if not f["filename"].endswith(".whl"):
        out["sdist"] = True
    return out


class NoPlatformWheel(ResolutionFailed):
    """Resolved pins of which the index has no file for the platform: {name: version}."""

    def __init__(self, reason: str, missing: dict[str, str]):
        super().__init__(reason)
        self.missing = dict(sorted(missing.items()))


def select_files(
    pins: dict[str, str],
    index_url: str,
    python: str,
    sdists: set[str] = frozenset(),
    arch: str = pydeps.ARCH,
) -> dict:
    """{name: version} -> {name: {"file", "sha256"}}, cached per index, platform, name and
    version (a released version's files do not change; a tampered one is caught against
    lock.yaml). Raises NoPlatformWheel naming every pin without a file for `arch`."""
    tags = target_tags(python, arch)
    cache = (
        cache_root()
        / "files"
        / pydeps.canonical(re.sub(r"^https?://", "", index_url))[:80]
        / pydeps.wheel_platform(arch)  # two platforms never share a chosen file
    )
    cache.mkdir(parents=True, exist_ok=True)

    def one(item):
        name, version = item
        hit = cache / f"{name}-{version}{'-sdist-ok' if name in sdists else ''}.json"
        if hit.is_file():
            return name, json.loads(hit.read_text())
        chosen = choose_file(_page(index_url, name).get("files", []), name, version, tags, name in sdists)
        if chosen is None:
            return name, None
        tmpf = hit.with_suffix(f".{os.getpid()}.tmp")
        tmpf.write_text(json.dumps(chosen, sort_keys=True))
        tmpf.replace(hit)
        # keys in the order a cache hit reads them back: a cold lock writes the same bytes
        return name, dict(sorted(chosen.items()))

    with ThreadPoolExecutor(max_workers=16) as pool:
        out = dict(pool.map(one, sorted(pins.items())))
    missing = {n: pins[n] for n, f in out.items() if f is None}
    if missing:
        raise NoPlatformWheel(
            f"{', '.join(f'{n}=={v}' for n, v in missing.items())}: no wheel for CPython {python} on "
            f"{pydeps.wheel_platform(arch)} at {index_url} (an sdist is used only when "
            "components.yaml resolution.sdists names the package)",
            missing,
        )
    return out


# ----------------------------------------------------------------------------- layers


def assign_layers(packages: dict, layer_members: list[tuple[str, list[str]]]) -> dict[str, str]:
    """Each resolved package goes into the lowest layer whose members need it (transitively),
    so a layer never needs anything installed above it, and a change high up rebuilds only
    the layers from there. Packages nobody claims (cannot happen with a correct `via`) go to
    the last layer."""
    children: dict[str, set[str]] = {}
    for name, entry in packages.items():
        for parent in entry.get("via", []):
            children.setdefault(parent, set()).add(name)
    out: dict[str, str] = {}
    for layer, members in layer_members:
        stack = [canonicalize_name(m) for m in members if canonicalize_name(m) in packages]
        while stack:
            name = stack.pop()
            if name in out:
                continue
            out[name] = layer
            stack.extend(sorted(children.get(name, ())))
    last = layer_members[-1][0] if layer_members else ""
    for name in packages:
        out.setdefault(name, last)
    return dict(sorted(out.items()))
