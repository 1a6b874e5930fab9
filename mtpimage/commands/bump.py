"""`build.py bump`: move one pin, verified before anything is written.

    python3 build.py bump COMPONENT [--to REF|--latest] [--exclude-newer WHEN] [--dry-run]
                                   [--report FILE]

One transaction, on the lock machinery (locker.lock with an upgrade target): resolve the ref
(git ls-remote; a commit is taken as is), fetch the new commit, read its version from the
source, run every rule and probe on the real source, check that every patch applies, re-lock
every profile at the lock's resolution cutoff (or WHEN), and write components.yaml and
lock.yaml together only when all of that passed. COMPONENT is a git component, a package built
from git (apex), or a PyPI component (`--to VERSION`; `--latest`: the newest release its index
lists before the cutoff). Without --to, a git pin moves to where its ref points now.

It prints a Markdown report (outputs/bumpreport.py; `--report FILE` also writes it): what moved,
the resolution diff, each patch, rule and probe with its verdict, the overrides to review, and
which image layers rebuild for which profile. `--dry-run` shows the same and writes nothing.

Exit status: 0 passed (written, or would be with --dry-run), 1 a check failed (its reason first
on stderr; nothing written), 2 bad input, 3 a source or index failed (nothing written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtpimage.commands.load import load, load_for
from mtpimage.commands.lock import refused
from mtpimage.errors import BuilderError, InputError
from mtpimage.lock import locker, lockfile, resolver
from mtpimage.outputs import bumpreport


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "bump",
        help="move one pin (git ref or PyPI version) in one verified transaction, with a report",
    )
    add_common(p)
    p.add_argument("component", metavar="COMPONENT", help="a component, or a package built from git (apex)")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--to", metavar="REF", help="the branch, tag or commit to move to (a PyPI component: the version)"
    )
    how.add_argument(
        "--latest",
        action="store_true",
        help="where the ref points now (the default for git); a PyPI component: its newest "
        "release before the resolution cutoff",
    )
    p.add_argument(
        "--exclude-newer",
        metavar="WHEN",
        default=None,
        help="re-lock at this cutoff (YYYY-MM-DDTHH:MM:SSZ or `now`: an hour ago); default: lock.yaml's",
    )
    p.add_argument(
        "--dry-run", action="store_true", default=argparse.SUPPRESS, help="check and report; write nothing"
    )
    p.add_argument("--report", metavar="FILE", type=Path, help="also write the Markdown report to FILE")
    p.set_defaults(func=cmd_bump)


def cmd_bump(args) -> int:
    if getattr(args, "sets", None):
        raise InputError("--set", ",".join(args.sets), "bump edits manifests/ itself", "leave --set out")
    dry = bool(getattr(args, "dry_run", False))
    m = load_for(args)
    with locker.exclusive(m.root, waiting=lambda msg: print(msg, file=sys.stderr, flush=True)):
        m = load(m.root)
        to = args.to
        if args.latest and _pypi(m, args.component):
            to = latest_release(m, args.component, args.exclude_newer)
        old_plans = locker._plans(m, m.names())
        try:
            out = locker.lock(
                m, None, args.component, False, args.exclude_newer, to=to, write=not dry, flag="bump"
            )
        except BuilderError as exc:
            _write_report(
                args.report, f"# Bump {args.component}\n\n**Failed: nothing written.** {exc.one_line()}\n"
            )
            raise
    status = "failed" if out.failures else ("dry run" if dry else "passed")
    moved = {mv.name: _package_of(m, mv.name) for mv in out.moves}
    review = [n for n in out.notes if n.startswith("override ")]  # read from the sources by the lock
    review += [o for o in bumpreport.overrides_to_review(m.catalogue.data, moved) if not review]
    text = bumpreport.markdown(args.component, out, old_plans, status, review)
    _write_report(args.report, text)
    if out.failures:
        code = refused(out, m.root)  # the reason first, on stderr
        print(text)
        return code
    print(text)
    return 0


def _write_report(path: Path | None, text: str) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(
            "--report", str(path), f"cannot write the report: {exc.strerror}", "give a writable path"
        ) from None


def _pypi(m, name: str) -> bool:
    c = (m.catalogue.data.get("components") or {}).get(name)
    return bool(c) and c.get("source") == "pypi"


def _package_of(m, name: str) -> str:
    c = (m.catalogue.data.get("components") or {}).get(name) or {}
    return str(c.get("package") or name)


def latest_release(m, name: str, exclude_newer: str | None) -> str:
    """The newest final release of a PyPI component its index lists, uploaded before the
    cutoff the bump re-locks at (a later one would not resolve at that cutoff)."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )
    from packaging.version import Version

    c = m.catalogue.data["components"][name]
    url = m.catalogue.data["indexes"][c.get("index", "pypi")]
    where = f"{m.root.name}/{lockfile.LOCK_NAME}"
    cutoff, _notes = locker.choose_cutoff(
        lockfile.read(lockfile.lock_path(m.root)), None, name, exclude_newer, where
    )
    limit = cutoff["exclude_newer"]
    versions: set[Version] = set()
    for f in resolver._page(url, c["package"]).get("files", []):
        if f.get("yanked") or (f.get("upload-time") and f["upload-time"][:19] + "Z" > limit):
            continue
        try:
            v = (
                parse_wheel_filename(f["filename"])[1]
                if f["filename"].endswith(".whl")
                else parse_sdist_filename(f["filename"])[1]
            )
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if not v.is_prerelease and not v.is_devrelease:
            versions.add(v)
    if not versions:
        raise InputError(
            "--latest",
            name,
            f"index {url} lists no release of {c['package']} before {limit}",
            "give one with --to VERSION, or move the cutoff with --exclude-newer now",
        )
    return str(max(versions))
