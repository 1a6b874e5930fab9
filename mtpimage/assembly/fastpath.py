"""The warm no-op in one look-up: `build.py --profile X` when X's image is already built.

The full main job loads and validates the manifests, plans, checks the rules and the lock,
renders, and only then asks dockerd whether the image exists: ~0.5 s, most of it imports.
None of that can give a different answer while its inputs are the same bytes, so a run that
ended with the image built or found locally is remembered under a key over exactly those
inputs, and the next run with an equal key asks dockerd (through its socket, no CLI) whether
both tags still point at that image. Yes: replay what the full run printed and stop. Any
doubt (no memo, a changed byte, a tag moved or gone, an engine this cannot ask): the full
job runs as before and decides. A miss costs the hashing only (~5 ms).

What the key covers (every input the main job reads before it decides "up to date"):
the command line; every MTP_* and DOCKER_* variable; the bytes of the manifests directory
(lock.yaml included), of this package (code, data, schemas, templates) and of the image
files (Dockerfile template, checks, install helpers); build.py and requirements.txt; the
Python running it and the distributions it can import (jinja2 renders, pyyaml parses).
Only the plain local main job is remembered: a registry, --json, --dry-run or any other
option takes the full path every time. --summary-file is the one option outside the key: it
says where to write the summary, not what to build, and a hit writes the same bytes there
that the full path writes for a local image that is up to date (summary()).

Standard library only, and nothing of the rest of the tool is imported: that is the point.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

from mtpimage import locations, settings
from mtpimage.engine.dockersocket import quick_image_id as image_id
from mtpimage.settings import DEFAULT_PROFILE, local_image

FORMAT = 1  # part of the key: a new memo layout never reads an old one
# The options a remembered run may have (each takes one value). --ca-bundle, --netrc and
# --progress only say how a build would run (a BuildKit secret, the progress format), not
# what it builds; they are in the key all the same.
OPTIONS = (
    "--profile",
    "--manifests",
    "--set",
    "--substitute-base",
    "--omit-packages",
    "--ca-bundle",
    "--netrc",
    "--progress",
    "--summary-file",
)
# Accepted but not part of the key: where the run writes its JSON summary (pipeline.run).
UNKEYED = ("--summary-file",)
# Files the build hands on as secrets: a remembered run is replayed only while they are
# regular files, so a missing or wrong one is said by the full run even when up to date.
SECRET_FILES = ("--ca-bundle", "--netrc")
MAX_INPUT = 64 << 20  # larger than any input of a build (manifests are refused over 1 MiB)


def enabled() -> bool:
    return settings.current().fastpath


def _trace(msg: str) -> None:
    if settings.current().fastpath_trace:
        print(f"fastpath: {msg}", file=sys.stderr)


def parse(argv: list[str]) -> dict | None:
    """The options of a plain main-job command line, or None when it is anything else."""
    out: dict = {"--set": []}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name not in OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        i += 1
        if name == "--set":
            out["--set"].append(value)
        elif name in out:
            return None  # given twice: let argparse decide what that means
        else:
            out[name] = value
    out.setdefault("--profile", DEFAULT_PROFILE)
    return out


def _hash_tree(h, root: Path) -> None:
    if root.is_file():
        h.update(b"F" + root.name.encode() + b"\0" + root.read_bytes() + b"\0")
        return
    if not root.is_dir():
        h.update(b"missing " + str(root).encode() + b"\0")
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INPUT:
                # a device never ends, a FIFO blocks: never read here; the full run refuses it
                raise OSError(f"{path}: not a regular file within {MAX_INPUT} bytes")
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())


def _distributions() -> list[str]:
    """name-version of every distribution importable here (directory names only)."""
    found = []
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            found += [n for n in os.listdir(entry) if n.endswith((".dist-info", ".egg-info"))]
    return sorted(found)


def key(opts: dict, cwd: Path | None = None) -> str:
    cwd = Path(cwd or os.getcwd())
    manifests = Path(opts.get("--manifests") or locations.DEFAULT_MANIFESTS)
    manifests = manifests if manifests.is_absolute() else cwd / manifests
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "format": FORMAT,
                "opts": {k: v for k, v in opts.items() if k not in UNKEYED},
                "python": sys.version,
                "exe": sys.executable,
                "env": sorted(
                    settings.current().key_environment()
                    + [(k, v) for k, v in os.environ.items() if k.startswith("DOCKER_")]
                ),
                "manifests": str(manifests.resolve()),
                "dists": _distributions(),
            },
            sort_keys=True,
        ).encode()
    )
    roots = [manifests, locations.PACKAGE, locations.IMAGES_DIR]
    if locations.CHECKOUT is not None:
        roots += [locations.CHECKOUT / "build.py", locations.CHECKOUT / "requirements.txt"]
    for root in roots:
        h.update(b"\nROOT " + str(root).encode() + b"\n")
        _hash_tree(h, root)
    return h.hexdigest()


def memo_dir() -> Path:
    return settings.current().cache_root / "noop"


# ----------------------------------------------------------------------------- the memo
def _memo_file(k: str) -> Path:
    return memo_dir() / f"{k}.json"


def lookup(argv: list[str]) -> tuple[list | None, str | None]:
    """(what to print, as [stream, text] pairs, or None; the key of these inputs, or None).
    The reply is given only when this command line is a remembered no-op that is still true.
    The key is taken before the run, so inputs edited during a build never get its memo."""
    if not enabled():
        return None, None
    opts = parse(argv)
    if opts is None:
        _trace("miss (not a plain local main job)")
        return None, None
    if any(opts.get(f) and not os.path.isfile(opts[f]) for f in SECRET_FILES):
        _trace("miss (--ca-bundle or --netrc is not a regular file: the full run says which)")
        return None, None
    try:
        k = key(opts)
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13's Path.resolve() on a symlink loop
        _trace("miss (an input cannot be read: the full run says which)")
        return None, None
    try:
        memo = json.loads(_memo_file(k).read_text(encoding="utf-8"))
        want, ref, reply = memo["image_id"], memo["ref"], memo["reply"]
    except (OSError, ValueError, KeyError, TypeError):
        _trace("miss (no memo for these inputs)")
        return None, k
    for r in (ref, local_image(opts["--profile"])):
        if image_id(r) != want:
            _trace(f"miss ({r} is not {str(want)[:19]})")
            return None, k
    if opts.get("--summary-file") and not write_summary(Path(opts["--summary-file"]), opts["--profile"], ref):
        _trace("miss (cannot write the summary file)")
        return None, k
    _trace(f"hit ({ref})")
    return reply, k


def summary(profile: str, ref: str) -> str:
    """The summary pipeline.run writes for a local image that is up to date (same keys, same
    serialisation); tests/e2e/test_fastpath_e2e.py compares the two byte for byte."""
    data = {
        "profile": profile,
        "image": ref,
        "pushed": False,
        "references": [],
        "digest": None,
        "up_to_date": True,
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_summary(path: Path, profile: str, ref: str) -> bool:
    """False when it cannot be written: then the full path runs and reports why."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary(profile, ref))
    except OSError:
        return False
    return True


def replay(reply: list) -> None:
    for stream, text in reply:
        (sys.stderr if stream == "err" else sys.stdout).write(text)
    sys.stdout.flush()


class Recorder:
    """stdout and stderr as one ordered list of writes, while they pass through unchanged."""

    LIMIT = 1 << 20

    def __init__(self) -> None:
        self.events: list[list[str]] = []
        self.size = 0
        self.overflow = False
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, "out", self)
        sys.stderr = _Tee(sys.stderr, "err", self)

    def add(self, stream: str, text: str) -> None:
        if self.overflow:
            return
        self.size += len(text)
        if self.size > self.LIMIT:
            self.overflow = True
            return
        if self.events and self.events[-1][0] == stream:
            self.events[-1][1] += text
        else:
            self.events.append([stream, text])

    def stop(self) -> None:
        sys.stdout, sys.stderr = self._saved


class _Tee:
    def __init__(self, inner, stream: str, recorder: Recorder) -> None:
        self._inner, self._stream, self._recorder = inner, stream, recorder

    def write(self, text: str) -> int:
        self._recorder.add(self._stream, text)
        return self._inner.write(text)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def remember(argv: list[str], k: str, result, events: list) -> bool:
    """Remember a successful local main job from what it returned (pipeline.JobResult: its
    image, built or up to date, with both local tags on it): what it printed (both streams,
    in order) up to its heading line, then the line it prints when the image is up to date.
    Both lines come from the result, so the memo follows the pipeline's wording. Written
    atomically; never raises."""
    opts = parse(argv)
    if opts is None or not enabled() or result is None or not result.rememberable:
        return False
    head = result.heading + "\n"
    reply = []
    for stream, text in events:
        at = text.find(head) if stream == "out" else -1
        if at >= 0:
            reply.append(["out", text[: at + len(head)] + result.up_to_date + "\n"])
            break
        reply.append([stream, text])
    else:
        return False
    # the next lookup asks the socket: remember only what it will see
    iid = result.image_id
    if image_id(result.ref) != iid or image_id(local_image(opts["--profile"])) != iid:
        return False
    try:
        path = _memo_file(k)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"ref": result.ref, "image_id": iid, "reply": reply}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return False
    _trace(f"remembered {result.ref}")
    return True
