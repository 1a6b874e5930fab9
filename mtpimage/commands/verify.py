"""`verify`: rebuild a published image's plan on a clean builder and compare, layer by layer.

  python build.py verify --profile NAME --image HOST[:PORT]/NS/mtp-verl@sha256:...

One line per layer, then the config and the manifest; exit 0 only when the image is bit
for bit what the lock builds, 1 when it is not (or names another plan), with one error line.
A multi-arch index (issue 49) is verified per platform: `--platform OS/ARCH` picks its entry,
else every platform it lists in turn, each against the plan with that builds.platform; the
first that differs ends the run.
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
    sets = getattr(args, "sets", None) or []
    targets = verify.per_platform(args.image, args.platform)
    if isinstance(
        targets, verify.ManifestRead
    ):  # one image: against the plan (--platform sets builds.platform)
        plan = plan_for(m, args.profile, _with_platform(sets, args.platform), **substitutions_of(args))
        return _verify_one(verify, m, plan, args.image, args, targets)
    index, images = targets
    for platform, image in images:
        _say(f"platform {platform}: {image} (listed by the index {index})")
        plan = plan_for(m, args.profile, _with_platform(sets, platform), **substitutions_of(args))
        _verify_one(verify, m, plan, image, args)
    _say(
        f"identical: every platform the index lists was checked ({', '.join(p for p, _ in images)}): "
        f"{index} is what {args.profile} builds from this lock"
        if not args.platform
        else f"identical: {args.platform} of {index} is what {args.profile} builds from this lock"
    )
    return 0


def _with_platform(sets: list[str], platform: str | None) -> list[str]:
    return [*sets, f"builds.platform={platform}"] if platform else list(sets)


def _verify_one(verify, m, plan, image: str, args, read=None) -> int:
    def progress(msg: str) -> None:  # the rebuild's own progress goes to stderr
        print(msg, file=sys.stderr, flush=True)

    try:
        report = verify.run(m.root, plan, image, build_options_from_args(args), progress, read=read)
    except verify.NotDescribed as exc:  # the layers it names, then the one error line
        for line in exc.details:
            _say(line)
        raise
    for line in verify.lines(report):
        _say(line)
    verify.verdict(report)
    _say(
        f"identical: {report.image} is bit for bit what {plan.profile} ({plan.platform}) builds from this lock"
    )
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
    p.add_argument(
        "--platform",
        metavar="OS/ARCH",
        help="verify this platform's image (of a multi-arch index: its entry; of one image: the plan "
        "with builds.platform set); an index without it: every platform it lists, in turn",
    )
    p.add_argument("--ca-bundle", type=Path, metavar="PATH", help="CA bundle for HTTPS inside the rebuild")
    p.add_argument("--netrc", type=Path, metavar="PATH", help="netrc with index tokens for the rebuild")
    add_registry_mirror(p)
    p.set_defaults(func=cmd_verify, progress=argparse.SUPPRESS)
