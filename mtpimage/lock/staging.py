"""The files a lock run writes, as one transaction.

`lock`, `lock --upgrade` and `bump` verify everything on texts held in memory (components.yaml
as the bump would write it, lock.yaml as the lock would) and call `commit` last, only when every
check passed. `commit` writes each new text aside in its own directory and fsyncs it, then
renames all of them into place with SIGINT/SIGTERM held back for those few system calls, and
fsyncs the directories: a run stopped at any point leaves either every old file or every new
one, and a failed run leaves every file byte-identical.

`set_field` edits one scalar of components.yaml by its line (the file keeps its comments and
layout: it is a person's file, never re-dumped).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from mtpimage import children
from mtpimage.errors import InputError


def commit(files: dict[Path, str]) -> list[Path]:
    """Write every (path, text) whose bytes differ; returns the paths written (in order)."""
    todo = [
        (Path(p), t)
        for p, t in files.items()
        if not (Path(p).is_file() and Path(p).read_text(encoding="utf-8") == t)
    ]
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in todo:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".yaml.tmp", dir=path.parent)
            staged.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, (path.stat().st_mode & 0o777) if path.exists() else 0o644)
        held: list[int] = []
        with children._holding(held) as before:
            _replace_all(staged)
            for d in {path.parent for _tmp, path in staged}:
                _fsync_dir(d)
        if held:
            children._deliver(held[0], before[held[0]])
    finally:
        for tmp, _path in staged:
            for leftover in (tmp, tmp + ".old"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    return [path for path, _t in todo]


def _replace_all(staged: list[tuple[str, Path]]) -> None:
    """Rename every staged file into place; when one rename fails (a full disk, a read-only
    file), put back the files already replaced (hard links kept of the old ones), so the
    manifests are never half old and half new."""
    done: list[tuple[str, Path]] = []
    for tmp, path in staged:
        if path.exists():
            os.link(path, tmp + ".old")
    try:
        for tmp, path in staged:
            os.replace(tmp, path)
            done.append((tmp, path))
    except OSError:
        for tmp, path in reversed(done):
            if os.path.exists(tmp + ".old"):
                os.replace(tmp + ".old", path)
        raise


def _fsync_dir(d: Path) -> None:
    """The renames themselves reach the disk (a crash after commit keeps the new names)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


_SCALAR = re.compile(
    r"""^(?P<head>\s*(?:-\s+)?(?P<key>[A-Za-z_][\w-]*)\s*:\s*)(?P<value>"[^"]*"|'[^']*'|[^\s#]+)"""
)


def set_field(text: str, where: str, key: str, old, new: str, what: str) -> str:
    """`text` with the scalar `key: old` on the line `where` (file:line, from SourceDoc.where)
    replaced by `new` (quoted when the old value was); an InputError naming the line when the
    line is not that scalar (a flow mapping, a multi-line value): a person edits it then."""
    lines = text.splitlines(keepends=True)
    lineno = int(where.rsplit(":", 1)[1]) - 1 if ":" in where else -1
    m = _SCALAR.match(lines[lineno]) if 0 <= lineno < len(lines) else None
    if m is None or m.group("key") != key or m.group("value").strip("\"'") != str(old):
        raise InputError(
            where, what, f"cannot find `{key}: {old}` on this line to rewrite", f"set {key}: {new} by hand"
        )
    value = m.group("value")
    quote = value[0] if value[0] in "\"'" else ""
    line = lines[lineno]
    lines[lineno] = line[: m.start("value")] + f"{quote}{new}{quote}" + line[m.end("value") :]
    return "".join(lines)
