"""What a killed tool leaves is removed at once, not at the next build.

SIGKILL (the OOM killer, `kill -9`, a runner that does not wait) runs no handler: the tool's
children (`docker build`, buildah and its OCI runtime) run on for seconds, and what the tool
would have removed as it unwound stays: buildah storage roots with their overlay mounts
(13 GB for the real stack), the docker engine's temporary directory. So the first path a run
guards starts a janitor: a small detached process (standard library only; its own session, so
no signal to the tool's group reaches it) that waits for the tool's process to end, then, for
each guarded path still there, ends the processes whose command line names it (only the
tool's own children do: the paths are unique to this run) and removes it: a buildah root
through `python -m mtpimage.engine.buildahengine remove-root` (containers, images, mounts,
files: only the engine runs buildah), any other directory as files. A run that ends
normally (SIGTERM and Ctrl-C unwind to one) removes its paths itself and, at exit, dismisses
the janitor (SIGTERM) and waits for it: nothing outlives the tool but after a SIGKILL.

The paths are listed, one per line (`KIND<TAB>PATH`), in $MTP_CACHE_DIR/janitor/<pid>.paths;
the janitor removes that list last.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mtpimage import children, settings

POLL = 0.2  # seconds between looks at the tool's process
GRACE = 10  # seconds a child that names a guarded path gets after SIGTERM

_started: dict[int, Path] = {}  # tool pid -> its list (one janitor per process)
_HERE = str(Path(__file__).resolve().parents[1])  # where `mtpimage` is imported from


def _list_file() -> Path:
    d = settings.current().cache_root / "janitor"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{os.getpid()}.paths"


def guard(path: Path, kind: str = "dir") -> None:
    """Remove `path` (kind `dir`, or `buildah-root`) if this process dies before it does; kind
    `buildah-cache` (the layer cache) is emptied of the build's containers and mounts, not removed."""
    pid = os.getpid()
    listing = _started.get(pid)
    if listing is None:
        listing = _list_file()
        listing.write_text("")
        # held: a SIGTERM inside Popen would unwind before the dismissal is registered, and the
        # janitor would outlive the tool by a poll (a fresh-clone CI run's build-sigterm test)
        with children.signals_held():
            proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "mtpimage.janitor", str(pid), str(listing)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                cwd="/",
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(filter(None, [_HERE, os.environ.get("PYTHONPATH")])),
                },
            )
            _started[pid] = listing
            atexit.register(_dismiss, proc, listing)
    with open(listing, "a") as f:
        f.write(f"{kind}\t{path}\n")


@contextlib.contextmanager
def tempdir(prefix: str, parent: Path | str | None = None, kind: str = "dir") -> Iterator[Path]:
    """A temporary directory (mode 0700) that is guarded before it exists: its name is listed
    first and made second, so a SIGKILL at any moment leaves nothing the janitor does not know
    (tempfile.TemporaryDirectory and then guard() left a window between the two: a fresh-clone
    CI run under load killed a build in it and kept two empty directories). Removed on exit."""
    base = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    while True:
        path = base / f"{prefix}{secrets.token_hex(6)}"
        if not path.exists():
            break
    guard(path, kind)
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dismiss(proc: subprocess.Popen, listing: Path) -> None:
    """At a normal exit (SIGTERM and Ctrl-C unwind to one too) the run has removed its paths:
    the janitor makes sure of it and ends before the tool does, so nothing outlives the tool."""
    try:
        proc.terminate()
        proc.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
    listing.unlink(missing_ok=True)  # a janitor dismissed before it was listening left it


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _naming(path: str) -> list[int]:
    """Processes whose command line names `path` (the tool's children for this path)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if path in entry.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry.parent.name))
        except (OSError, ValueError):
            continue
    return [p for p in found if p != os.getpid()]


def end_naming(path: str) -> None:
    """End the processes whose command line names `path` (SIGTERM, then SIGKILL after GRACE)."""
    _end(_naming(path))


def _end(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(POLL)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


def clean(listing: Path) -> None:
    try:
        lines = listing.read_text().splitlines()
    except OSError:
        return
    entries = [(kind, path) for kind, _, path in (ln.partition("\t") for ln in lines)]
    entries = [(kind, path) for kind, path in entries if path and os.path.lexists(path)]
    # every child that names any guarded path ends in one round (one build names its temp dir
    # and its secrets dir: ending them path by path cost a grace period each)
    # (not the layer cache's: a process naming it may be another build's that holds the cache
    # now; release-cache ends the killed build's own only once it holds the cache's lock)
    _end(sorted({pid for kind, path in entries if kind != "buildah-cache" for pid in _naming(path)}))
    for kind, path in entries:
        if kind == "buildah-cache":  # the layer cache: what the build left in it goes, its layers stay
            subprocess.run(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "mtpimage.engine.buildahengine", "release-cache", path],
                capture_output=True,
                timeout=900,
            )
            continue
        if kind == "buildah-root":  # only the engine runs buildah (its containers, images, mounts)
            subprocess.run(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "mtpimage.engine.buildahengine", "remove-root", path],
                capture_output=True,
                timeout=900,
            )
        _remove(path)
    listing.unlink(missing_ok=True)


def _remove(path: str) -> None:
    """rmtree, again until the path is gone: a process that does not name the path (so was not
    ended) can still write into it while it is removed, and the last rmdir then fails with
    ENOTEMPTY. A fresh-clone CI run under load left two empty temp dirs with the listing gone,
    which fits that (not reproduced in isolation)."""
    deadline = time.monotonic() + GRACE
    shutil.rmtree(path, ignore_errors=True)
    while os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(POLL)
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    pid, listing = int(argv[0]), Path(argv[1])
    dismissed: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: dismissed.append(1))  # the tool is exiting normally
    while _alive(pid) and not dismissed:
        time.sleep(POLL)
    clean(listing)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
