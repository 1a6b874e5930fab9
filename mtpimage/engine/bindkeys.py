"""The content of a RUN step's bind mounts, in its instruction text, for buildah's layer cache.

buildah 1.28's layer cache (`bud --layers`) takes a RUN step's layer from the cache when the
step's instruction text and the layers under it are the same; what a `--mount=type=bind` from
the build context holds plays no part (BuildKit hashes it; buildah does not). The rendered
Dockerfile binds each component's sources and requirement files (`source=src/verl`,
`source=build/requirements/...`), so after a bump the verl step's text was unchanged and
buildah reused the layer of the old commit: an image labelled verl 549e5bfb held verl 7bc80c00
(measured on the real stack, docs/benchmark.md). So before the build, in the unpacked context
only, each RUN with such mounts gets a no-op first command naming the sha256 of what they hold
(`: mtp-binds sha256:...;`): a change to a bound file changes the step's text and so its cache
key, and the same files give the same text on every machine (a cold build and an incremental
one build the same Dockerfile, so the same bytes). Binds from another stage (`from=`) are left
out: that stage's own steps key them.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_MOUNT = re.compile(r"--mount=(\S+)")
_RUN = re.compile(r"^\s*RUN\s", re.IGNORECASE)


def _sources(flags: list[str]) -> list[str]:
    """The context paths a RUN's mounts bind (type=bind without from=)."""
    out = []
    for flag in flags:
        fields = dict(f.split("=", 1) if "=" in f else (f, "") for f in flag.split(","))
        if fields.get("type") == "bind" and "from" not in fields:
            out.append(fields.get("source", fields.get("src", ".")))
    return out


def content_digest(ctx: Path, sources: list[str]) -> str:
    """sha256 over each bound path's tree: relative names, the executable bit, file bytes and
    link targets, in a fixed order."""
    h = hashlib.sha256()
    for source in sources:
        root = ctx / source
        h.update(f"source {source}\0".encode())
        paths = [root] if not root.is_dir() or root.is_symlink() else sorted(_walk(root))
        for path in paths:
            rel = os.path.relpath(path, ctx)
            if path.is_symlink():
                h.update(f"link {rel} {os.readlink(path)}\0".encode())
            elif path.is_file():
                h.update(f"file {rel} {os.stat(path).st_mode & 0o111:o}\0".encode())
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            elif path.is_dir():
                h.update(f"dir {rel}\0".encode())
            else:
                h.update(f"missing {rel}\0".encode())
    return "sha256:" + h.hexdigest()


def _walk(root: Path):
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        yield Path(dirpath)
        for name in sorted(files):
            yield Path(dirpath) / name
        for name in dirs:  # a link to a directory is listed, not followed
            if (Path(dirpath) / name).is_symlink():
                yield Path(dirpath) / name


def keyed(dockerfile: str, ctx: Path) -> str:
    """`dockerfile` with each RUN that binds context paths keyed by their content: `: mtp-binds
    sha256:...;` after its last --mount flag, so it is the first command the shell runs."""
    lines = dockerfile.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not _RUN.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        start = i  # one instruction: its line and every continuation
        while lines[i].rstrip("\r\n").endswith("\\") and i + 1 < len(lines):
            i += 1
        block = lines[start : i + 1]
        i += 1
        flags = [m for line in block for m in _MOUNT.findall(line)]
        sources = _sources(flags)
        if not sources:
            out.extend(block)
            continue
        last = max(n for n, line in enumerate(block) if _MOUNT.search(line))
        line = block[last]
        end = list(_MOUNT.finditer(line))[-1].end()
        rest = "".join([line[end:], *block[last + 1 :]]).replace("\\\n", " ").lstrip()
        if rest.startswith("["):  # exec form: no shell to run a no-op (none in the templates)
            out.extend(block)
            continue
        note = f" : mtp-binds {content_digest(ctx, sources)};"
        block[last] = line[:end] + note + line[end:]
        out.extend(block)
    return "".join(out)
