"""`build.py lock`: verify every pin and write manifests/lock.yaml; `--frozen` for builds.

    python3 build.py lock [--profile NAME] [--upgrade [COMPONENT]] [--exclude-newer WHEN]
                         [--require-verified]

What cannot be checked from this machine (a host git cannot resolve, an index that does
not answer, the base image's registry) is recorded as `verified: false` with the reason
and listed at the end; `lock` still writes the file and exits 0 unless --require-verified.
The base image's digest stays as components.yaml pins it; where its registry (or the mirror of
--registry-mirror / MTP_REGISTRY_MIRROR) answers, the digest of the manifest a build pulls from
it for the build platform is recorded beside it (docs/platform-pin.md).
A package (not one the tool compiles) whose index does not answer is not recorded but fails
the lock (exit 3): without its file's sha256 the image would install it by version alone.
Anything that answered and said no (a commit missing upstream, a refused connection, a
transfer cut off) fails the lock: the message names repository, commit and git's error,
and neither lock.yaml nor the source cache is changed.

The resolution is bounded in time by the cutoff recorded in lock.yaml (uv's exclude-newer:
files uploaded later are not candidates), so `lock` with unchanged inputs writes the same
bytes whatever the indexes publish later. `--upgrade` (every profile) or `--exclude-newer`
moves it, and the run prints every resolved version that changed.

A lock is written only complete and with every check passed: a probe that fails, a patch that
no longer applies or a set that does not resolve prints its error first and writes nothing
(lock.yaml, and with --upgrade components.yaml, stay byte-identical). `--upgrade` is one
transaction: components.yaml's new commits (and the versions read from the new sources) are
checked in memory and written together with lock.yaml, or not at all.

Exit status: 0 written (maybe with unverified entries), 1 a probe, patch or dependency
conflict failed (nothing written), 2 bad input, 3 a source or index failed (nothing written).
"""

from __future__ import annotations

import argparse
import sys

from mtpimage.commands.image import add_registry_mirror
from mtpimage.commands.load import load, load_for
from mtpimage.errors import EXIT_ENV, EXIT_RULES, InputError
from mtpimage.lock import lockfile
from mtpimage.lock.locker import exclusive, lock
from mtpimage.mirrors import Mirrors

__all__ = ["register", "cmd_lock"]


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "lock", help="resolve and verify every pin, probe the sources, write manifests/lock.yaml"
    )
    add_common(p)
    p.add_argument(
        "--profile",
        default=argparse.SUPPRESS,
        help="lock only this profile (the other profiles' entries are kept)",
    )
    p.add_argument(
        "--upgrade",
        nargs="?",
        const="*",
        default=None,
        metavar="COMPONENT",
        help="move git pins (components and packages built from git) to the commit their ref "
        "points at now (git ls-remote), all of them or only COMPONENT; rewrites the commit (and "
        "the version, read from the new source) in components.yaml together with lock.yaml, only "
        "when every check passed. Without COMPONENT it also moves the resolution cutoff to now "
        "(less an hour)",
    )
    p.add_argument(
        "--exclude-newer",
        metavar="WHEN",
        default=None,
        help="resolve at this cutoff (YYYY-MM-DDTHH:MM:SSZ, or `now`: an hour ago) and record "
        "it; files uploaded later are not considered. Default: the one lock.yaml records",
    )
    p.add_argument(
        "--require-verified",
        action="store_true",
        help="fail (exit 3, nothing written) when anything could not be verified",
    )

    add_registry_mirror(p)  # the base's platform manifest is read where builds pull it
    p.set_defaults(func=cmd_lock)


def cmd_lock(args) -> int:
    if getattr(args, "sets", None):
        raise InputError(
            "--set",
            ",".join(args.sets),
            "lock records manifests/ as they are",
            "put the override in a profile (stack.overrides) and lock that",
        )
    m = load_for(args)
    with exclusive(m.root, waiting=lambda msg: print(msg, file=sys.stderr, flush=True)):
        m = load(m.root)  # as the previous lock run (if any) left them
        out = lock(
            m,
            getattr(args, "profile", None),
            args.upgrade,
            args.require_verified,
            args.exclude_newer,
            mirrors=Mirrors.configured(getattr(args, "registry_mirror", None)).for_build(()),
        )
    if out.failures:
        return refused(out, m.root)
    if not out.written:
        for line in out.unverified:
            print(f"unverified: {line}", file=sys.stderr)
        print("error: --require-verified: lock.yaml not written", file=sys.stderr)
        return EXIT_ENV
    for line in out.moved:
        print(f"upgraded {line}")
    print(
        f"{'wrote' if out.changed else 'unchanged'} {m.root.name}/lock.yaml: {out.profiles} profile(s), "
        f"{out.components} components, {out.packages} Python packages resolved "
        + (
            f"({', '.join(f'{p} {n}' for p, n in out.per_platform.items())}; "
            if len(out.per_platform) > 1
            else "("
        )
        + f"uv {out.resolve_seconds:.1f} s, total {out.elapsed:.1f} s)"
    )
    for line in out.no_wheel:
        print(f"no wheel for {line}: rule platform-wheels refuses those plans")
    for line in out.notes:
        print(line)
    if out.cutoff_was is not None:
        print(f"resolution cutoff moved: {out.cutoff_was or 'none'} -> {out.cutoff}")
    else:
        print(f"resolution cutoff: {out.cutoff} (as recorded)")
    for line in out.changes:
        print(f"changed: {line}")
    if out.unverified:
        print(f"{len(out.unverified)} item(s) NOT verified from this machine (recorded as verified: false):")
        for line in out.unverified:
            print(f"  - {line}")
    return 0


def refused(out, root) -> int:
    """A run that failed a check: its errors first, then that nothing was written (no list of
    resolved versions before them: a set that does not resolve would "remove" every package)."""
    for line in out.failures:
        print(f"error: {line}", file=sys.stderr)

    files = (
        f"{lockfile.shown(root, 'components.yaml')} and lock.yaml" if out.moves else lockfile.shown(root)
    )  # the manifests --manifests named, not always the checkout's
    print(
        f"error: lock failed ({len(out.failures)} error(s) above): nothing written, {files} unchanged",
        file=sys.stderr,
    )
    for line in out.moved:
        print(f"not moved: {line}", file=sys.stderr)
    return EXIT_RULES
