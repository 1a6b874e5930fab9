"""The cache of compiled extension wheels (TransformerEngine's torch extension, flash-attn,
apex): one wheel per key, where the key is the sha256 of everything that changes the wheel's
bytes. It lives on this machine outside BuildKit, so `docker builder prune` does not empty it;
wheelshare.py carries entries to and from a registry.

Layout (root: $MTP_CACHE_DIR/ext-wheels, default ~/.cache/mtp-image-builder/ext-wheels):
    <key>/<wheel filename>.whl   exactly one wheel
    <key>/meta.json              what was stored with it: the key inputs, built_by, ... and
                                 key, filename, sha256 and size of the wheel (written by put())
    .tmp-*/                      a put() in progress (or one killed mid-way: never an entry)
An entry appears under its key only once complete: put() writes it into a temporary directory
in the same filesystem, fsyncs it and renames it into place; the first writer of a key wins.
Every get() re-hashes the wheel: a wheel that no longer matches its recorded sha256 is
reported (CorruptEntry), never returned.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.gitfetch import cache_root

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl; no separators, so a name
# read from a registry's annotation can never leave the entry's directory.
WHEEL_FILENAME_RE = re.compile(
    r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(?:-[0-9][A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$"
)
META = "meta.json"
RECORDED = ("key", "filename", "sha256", "size")  # put() writes these itself
STALE_TMP_SECONDS = 24 * 3600  # a .tmp-* this old is a killed put(), not one in progress
CHUNK = 1 << 20


def cache_key(inputs: dict) -> str:
    """sha256 hex of the canonical JSON of `inputs` (sorted keys, no spaces, ASCII). Floats and
    anything JSON cannot spell exactly (tuples, sets, bytes, non-string keys) are refused, so a
    key never depends on how a number or a container happens to print."""
    if not isinstance(inputs, dict) or not inputs:
        raise ValueError("cache_key: inputs must be a non-empty dict")
    _check_json(inputs, "inputs")
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _check_json(value, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        raise ValueError(f"cache_key: {where} is a float ({value!r}); give it as a string")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise ValueError(f"cache_key: {where} has a non-string key {k!r}")
            _check_json(item, f"{where}.{k}")
        return
    raise ValueError(f"cache_key: {where} is a {type(value).__name__}, not a JSON value")


def check_key(key: str, where: str = "wheel key") -> str:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise InputError(
            where, str(key), "expected a wheel cache key (64 lower-case hex digits)", "see `wheels list`"
        )
    return key


def valid_filename(name: str) -> bool:
    return bool(WHEEL_FILENAME_RE.match(name or ""))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class CorruptEntry(EnvironmentProblem):
    def __init__(self, key: str, path: Path, problem: str):
        self.key, self.path = key, path
        super().__init__(
            f"wheel cache entry {key} is corrupt: {path}: {problem} (fix: remove the entry with "
            f"`build.py wheels remove {key}` (or delete {path.parent if path.name != key else path}) "
            "and build it again, or pull it again from a registry)"
        )


@dataclass(frozen=True)
class CachedWheel:
    key: str
    path: Path  # the .whl file in the cache
    filename: str  # wheel file name (PEP 427)
    sha256: str  # hex, of the wheel bytes; get() verified it
    meta: dict  # meta.json: the caller's meta plus key, filename, sha256, size

    @property
    def size(self) -> int:
        return int(self.meta.get("size", 0))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WheelCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else cache_root() / "ext-wheels"

    def _dir(self, key: str) -> Path:
        return self.root / check_key(key)

    # -- reading -----------------------------------------------------------------------------
    def _read(self, key: str, verify: bool) -> CachedWheel | None:
        d = self._dir(key)
        if not d.is_dir():
            return None
        try:
            meta = json.loads((d / META).read_text())
        except FileNotFoundError:
            raise CorruptEntry(key, d / META, "missing") from None
        except (OSError, ValueError) as exc:
            raise CorruptEntry(key, d / META, f"unreadable ({exc})") from None
        if not isinstance(meta, dict) or any(k not in meta for k in RECORDED):
            raise CorruptEntry(key, d / META, f"does not record {', '.join(RECORDED)}")
        wheels = sorted(p.name for p in d.glob("*.whl"))
        if wheels != [meta["filename"]]:
            raise CorruptEntry(key, d, f"holds {wheels or 'no wheel'}, meta.json names {meta['filename']}")
        path = d / meta["filename"]
        if verify:
            actual = file_sha256(path)
            if actual != meta["sha256"]:
                raise CorruptEntry(key, path, f"sha256 {actual}, recorded {meta['sha256']}")
        elif path.stat().st_size != meta["size"]:
            raise CorruptEntry(key, path, f"{path.stat().st_size} bytes, recorded {meta['size']}")
        return CachedWheel(key, path, meta["filename"], meta["sha256"], meta)

    def get(self, key: str) -> CachedWheel | None:
        """The entry for `key` with its bytes verified, or None on a miss."""
        return self._read(key, verify=True)

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if KEY_RE.match(p.name) and p.is_dir())

    def scan(self, verify: bool = False) -> tuple[list[CachedWheel], list[CorruptEntry]]:
        """Every entry, and every corrupt one separately. Without `verify` only sizes are
        compared (hashing gigabytes of wheels for a listing is get()'s job)."""
        good, bad = [], []
        for key in self.keys():
            try:
                entry = self._read(key, verify)
            except CorruptEntry as exc:
                bad.append(exc)
                continue
            if entry is not None:  # removed while scanning
                good.append(entry)
        return good, bad

    def entries(self, verify: bool = False) -> list[CachedWheel]:
        """Every entry; the first corrupt one raises CorruptEntry (scan() lists them all)."""
        good, bad = self.scan(verify)
        if bad:
            raise bad[0]
        return good

    def resolve(self, prefix: str) -> str:
        """The one stored key that is `prefix` or starts with it (8+ hex digits, as `wheels
        list` prints 12)."""
        keys = self.keys() if re.fullmatch(r"[0-9a-f]{8,64}", prefix or "") else []
        matches = [k for k in keys if k.startswith(prefix)]
        if len(matches) != 1:
            raise InputError(
                "wheel key",
                prefix,
                f"matches {len(matches)} entries of {self.root}",
                "give 8 or more hex digits of a key that `wheels list` shows",
            )
        return matches[0]

    # -- writing -----------------------------------------------------------------------------
    def put(self, key: str, wheel: Path, meta: dict) -> CachedWheel:
        """Store a copy of `wheel` under `key` atomically and return the entry. When `key` is
        already stored, that entry stays and is returned (first writer wins: two builds of one
        key are equally valid, and whoever read the first must keep seeing it); a corrupt one
        is replaced. `meta` must be JSON; when it carries `inputs`, they must hash to `key`."""
        check_key(key)
        wheel = Path(wheel)
        if not valid_filename(wheel.name):
            raise ValueError(f"wheel cache: {wheel.name} is not a wheel file name (PEP 427)")
        if not zipfile.is_zipfile(wheel):
            raise ValueError(f"wheel cache: {wheel} is not a zip archive")
        if "inputs" in meta and cache_key(meta["inputs"]) != key:
            raise ValueError(
                f"wheel cache: meta inputs hash to {cache_key(meta['inputs'])}, not to key {key}"
            )
        try:
            existing = self.get(key)
        except CorruptEntry:
            self.remove(key)
            existing = None
        if existing is not None:
            return existing
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep()
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        try:
            h, size = hashlib.sha256(), 0
            with open(wheel, "rb") as src, open(tmp / wheel.name, "wb") as dst:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            stored = {
                **{k: v for k, v in meta.items() if k not in RECORDED},
                "key": key,
                "filename": wheel.name,
                "sha256": h.hexdigest(),
                "size": size,
            }
            with open(tmp / META, "w") as f:
                f.write(json.dumps(stored, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            _fsync(tmp)
            try:
                os.rename(tmp, self.root / key)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another writer finished first
                return self.get(key)
            _fsync(self.root)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise EnvironmentProblem(
                f"wheel cache: could not store {wheel.name} under {self.root / key}: {exc.strerror or exc} "
                f"(fix: check free space and permissions of {self.root}, or set MTP_CACHE_DIR elsewhere)"
            ) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CachedWheel(key, self.root / key / wheel.name, wheel.name, stored["sha256"], stored)

    def remove(self, key: str) -> bool:
        """Remove the entry; True when there was one. It leaves its key at once (a rename), so
        a reader never sees half of it."""
        d = self._dir(key)
        if not d.is_dir():
            return False
        gone = Path(tempfile.mkdtemp(prefix=".tmp-rm-", dir=self.root))
        try:
            os.rename(d, gone / key)
        except FileNotFoundError:
            return False  # another remover was first
        finally:
            shutil.rmtree(gone, ignore_errors=True)
        return True

    def _sweep(self) -> None:
        """Remove what killed put()s left behind (a put in progress is never this old)."""
        now = time.time()
        for p in self.root.glob(".tmp-*"):
            try:
                if now - p.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(p, ignore_errors=True)
            except FileNotFoundError:
                pass
