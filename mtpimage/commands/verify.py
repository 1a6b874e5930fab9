"""`verify`: rebuild a published image's plan on a clean builder and compare, layer by layer.

  python build.py verify --profile NAME --image HOST[:PORT]/NS/mtp-verl@sha256:...

One line per layer, then the config and the manifest; exit 0 only when the image is bit
for bit what the lock builds, 1 when it is not (or names another plan), with one error line.
The comparison is assembly/verify.py's; the rebuild is the reproducible engine's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtpimage.commands.image import add_registry_mirror, build_options_from_args
from mtpimage.commands.load import load_for, plan_for, substitutions_of


def _say(msg: str) -> None:
    print(msg, flush=True)


def cmd_verify(args) -> int:
    # deferred: import cost: loaded only when `verify` runs, not to build the parser
    from mtpimage.assembly import verify

    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))

    def progress(msg: str) -> None:  # the rebuild's own progress goes to stderr
        print(msg, file=sys.stderr, flush=True)

    try:
        report = verify.run(m.root, plan, args.image, build_options_from_args(args), progress)
    except verify.NotDescribed as exc:  # the layers it names, then the one error line
        for line in exc.details:
            _say(line)
        raise
    for line in verify.lines(report):
        _say(line)
    verify.verdict(report)
    _say(f"identical: {report.image} is bit for bit what {plan.profile} builds from this lock")
    return 0


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "verify",
        help="rebuild a published image's plan on a clean builder and compare it layer by layer",
    )
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument(
        "--image", required=True, metavar="HOST[:PORT]/NAME@sha256:...", help="the published image"
    )
    p.add_argument("--ca-bundle", type=Path, metavar="PATH", help="CA bundle for HTTPS inside the rebuild")
    p.add_argument("--netrc", type=Path, metavar="PATH", help="netrc with index tokens for the rebuild")
    add_registry_mirror(p)
    p.set_defaults(func=cmd_verify, progress=argparse.SUPPRESS)
