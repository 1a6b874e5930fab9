"""Package-index helpers for `lock`: the target platform, index probing and mirrors
(MTP_INDEX_REWRITE), one wheel downloaded for a probe (the sglang wheel the patch is
checked against), and metadata-only stub wheels. The resolution itself is resolver.py's.

pip runs isolated from the user's pip configuration (extra indexes, find-links,
constraints would change the answer); only a CA bundle is passed through
(MTP_CA_BUNDLE, PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE), as TLS-intercepting
proxies need it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from mtpimage import children, mirrors, netpolicy, settings
from mtpimage.engine.containerengine import SECRET_LIMITS
from mtpimage.errors import EnvironmentProblem
from mtpimage.manifests import inputfile
from mtpimage.publish.registryclient import network_reason

# The base image is Ubuntu 24.04 (glibc 2.39): every manylinux tag up to 2.39 installs there.
# manylinux_2_28 alone is not enough: sglang 0.5.12's wheels are manylinux_2_34. pip 23
# does not expand a given manylinux_2_x platform to the older ones, so all are listed.
GLIBC = (2, 39)  # the same on linux/arm64: Ubuntu 24.04 ships glibc 2.39 for both CPUs
ARCH = "x86_64"  # linux/amd64's wheel architecture: the lock's first platform (platforms.yaml)


def wheel_platform(arch: str = ARCH) -> str:
    """The newest manylinux tag the base's glibc installs on `arch` (manylinux_2_39_aarch64)."""
    return f"manylinux_{GLIBC[0]}_{GLIBC[1]}_{arch}"


def platform_tags(arch: str = ARCH) -> list[str]:
    """Every manylinux platform tag the base installs on `arch`, newest first (as pip ranks
    them); the legacy aliases exist for x86_64 only up to manylinux2014."""
    legacy = ["manylinux2014", "manylinux2010", "manylinux1"] if arch == "x86_64" else ["manylinux2014"]
    return [f"manylinux_2_{m}_{arch}" for m in range(GLIBC[1], 16, -1)] + [f"{x}_{arch}" for x in legacy]


def uv_platform(arch: str = ARCH) -> str:
    """uv's --python-platform for `arch` on the base's glibc (aarch64-manylinux_2_39)."""
    return f"{arch}-manylinux_{GLIBC[0]}_{GLIBC[1]}"


PLATFORM = wheel_platform()
PLATFORMS = platform_tags()
IMPLEMENTATION = "cp"


class IndexUnreachable(EnvironmentProblem):
    pass


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def rewrite(url: str) -> str:
    """Index mirrors, the pip counterpart of git's url.insteadOf (MTP_INDEX_REWRITE, parsed
    and applied by mirrors.py): the lock keeps the manifests' URL; only the network calls go
    to the mirror."""
    return mirrors.index_url(url)


def ca_bundle() -> str | None:
    """The CA bundle the index requests use, checked to be a regular file of a CA bundle's
    size (inputfile.py: a device or FIFO named there is refused in one line, not read)."""
    named = [("MTP_CA_BUNDLE", settings.current().ca_bundle)]
    named += [(var, os.environ.get(var)) for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    for var, path in named:
        if path:
            inputfile.check(Path(path), SECRET_LIMITS["--ca-bundle"], "a CA bundle", f"{var} {path}")
            return path
    return None


TLS_REASON = "TLS failed"
CA_FIX = (
    "give the CA bundle that signs the index's certificate with MTP_CA_BUNDLE (or PIP_CERT, "
    "REQUESTS_CA_BUNDLE, SSL_CERT_FILE)"
)
# what uv (rustls) and pip/OpenSSL say when no CA here vouches for a server's certificate
_TLS_TEXT = re.compile(
    r"(invalid peer certificate: [\w()]+|certificate verify failed[^)\]\n]*|UnknownIssuer|SSLError)", re.I
)


def tls_failure(text: str) -> str | None:
    """`TLS failed (...)` with the failure's own words when `text` (uv's or pip's error) is a
    certificate failure; None otherwise."""
    m = _TLS_TEXT.search(text or "")
    if not m:
        return None
    url = re.search(r"https://\S+?(?=[\s)]|$)", text)
    return f"{TLS_REASON} ({m.group(1).strip()})" + (f" at {url.group(0)}" if url else "")


class _Transient(Exception):
    pass


def probe_index(url: str, project: str) -> str | None:
    """None when `<url>/<project>/` answers; else the reason it could not be reached."""
    import requests  # lazy: only `lock` talks to indexes; keeps no-op builds fast

    target = f"{rewrite(url).rstrip('/')}/{canonical(project)}/"

    def call():
        try:
            r = requests.get(
                target,
                timeout=netpolicy.http_timeout(),
                verify=ca_bundle() or True,
                headers={"Accept": "application/vnd.pypi.simple.v1+html, text/html"},
            )
        except (requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code >= 500 or r.status_code == 429:
            raise _Transient(f"HTTP {r.status_code}")
        return r

    try:
        r = netpolicy.retrying(lambda exc: isinstance(exc, _Transient))(call)
    except _Transient as exc:
        return f"{target}: {exc}"
    except requests.exceptions.SSLError as exc:
        return f"{target}: {network_reason(exc)}"  # `TLS failed (certificate verify failed)`
    except requests.RequestException as exc:
        text = str(exc)
        m = re.search(r"(NameResolutionError|Failed to resolve|Connection refused|timed out)[^)]*", text)
        return f"{target}: {type(exc).__name__}: {m.group(0) if m else text[:200]}"
    if r.status_code == 404:
        return None  # the index answers; the project is simply not there (pip will say)
    if r.status_code >= 400:
        return f"{target}: HTTP {r.status_code}"
    return None


def pip_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _pip(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        *args,
        "--timeout",
        str(int(netpolicy.http_timeout())),
        "--retries",
        str(netpolicy.attempts()),
    ]
    if ca_bundle():
        cmd += ["--cert", ca_bundle()]
    try:
        return children.run(cmd, capture_output=True, text=True, env=pip_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"pip timed out after {timeout} s")


def _target_args(python: str) -> list[str]:
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    return ["--python-version", python, *plats, "--implementation", IMPLEMENTATION, "--only-binary=:all:"]


def pip_error(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    keep = [
        l
        for l in lines
        if l.startswith("ERROR")
        or "conflict" in l.lower()
        or "requires" in l.lower()
        or "depends on" in l.lower()
    ]
    return " | ".join(keep or lines[-5:])[-1500:]


# ----------------------------------------------------------------------------- distributions


def download_dist(package: str, version: str, index_url: str, python: str = "3.12") -> Path:
    """The wheel of package==version for the target platform, cached under pypi/."""
    dest = settings.current().cache_root / "pypi" / f"{canonical(package)}-{version}"
    hit = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if hit:
        return hit[0]
    host = index_url.split("/")[2] if "://" in index_url else index_url
    reason = probe_index(index_url, package)
    if reason:
        raise IndexUnreachable(f"index {host} unreachable: {reason}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{canonical(package)}-", dir=dest.parent))
    try:
        proc = _pip(
            "download",
            "--no-deps",
            "-q",
            "-d",
            str(tmp),
            "--index-url",
            rewrite(index_url),
            *_target_args(python),
            f"{package}=={version}",
        )
        if proc.returncode != 0:
            raise IndexUnreachable(
                f"pip download {package}=={version} from {host} failed: "
                f"{pip_error(proc.stderr + proc.stdout)}"
            )
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
        return sorted(dest.glob("*.whl"))[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def unpacked_dist(package: str, version: str, index_url: str, python: str = "3.12") -> Path:
    wheel = download_dist(package, version, index_url, python)
    tree = wheel.parent / "tree"
    if tree.is_dir():
        return tree
    tmp = Path(tempfile.mkdtemp(prefix=".tree-", dir=wheel.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        try:
            os.rename(tmp, tree)
        except OSError:
            if not tree.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tree


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- resolution


def write_stub_wheel(
    directory: Path,
    name: str,
    version: str,
    requires: list[str] | None = None,
    extras: dict[str, list[str]] | None = None,
) -> Path:
    """A metadata-only wheel: it stands for a package whose index is unreachable (no
    requirements), or carries a git source's declared requirements into the resolution."""
    dist = f"{canonical(name).replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    for req in requires or []:
        meta += f"Requires-Dist: {req}\n"
    for extra, reqs in sorted((extras or {}).items()):
        meta += f"Provides-Extra: {extra}\n"
        for req in reqs:
            marker = f'extra == "{extra}"'
            meta += (
                f"Requires-Dist: {req}; {marker}\n"
                if ";" not in req
                else f"Requires-Dist: {req.split(';')[0].strip()}; ({req.split(';', 1)[1].strip()}) and {marker}\n"
            )
    files = {
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: mtp-image-builder stub\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for k, v in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b"=").decode()
        record += f"{k},sha256={d},{len(v.encode())}\n"
    files[f"{dist}/RECORD"] = record + f"{dist}/RECORD,,\n"
    path = directory / f"{canonical(name).replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            info = zipfile.ZipInfo(k, date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, v)
    return path
