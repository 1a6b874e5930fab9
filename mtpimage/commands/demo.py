"""`build.py demo`: the tool end to end on this machine, in minutes, without the real stack.

    python3 build.py demo [--base IMAGE]

Parsing and printing only; what it does is mtpimage/demo/run.py's. Exit 0 when every step
passed; a failed step's own exit status otherwise (3: what the demo needs is missing here).
"""

from __future__ import annotations

import sys

from mtpimage.errors import InputError


def _say(msg: str) -> None:
    print(msg, flush=True)


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_demo(args) -> int:
    # deferred: import cost: loaded only when `demo` runs, not to build the parser
    from mtpimage.demo import run

    for flag, value in (("--manifests", args.manifests), ("--set", args.sets)):
        if value:
            raise InputError(
                flag,
                None,
                "the demo writes and uses manifests of its own",
                f"drop {flag}; to build your own profile run build.py --profile NAME",
            )
    _say(
        "demo: lock, check, build, push, pull, test and verify a small profile on loopback stand-ins "
        "(no GPU, no CUDA, no GitHub); everything it makes is removed at the end"
    )
    report = run.run(args.base, _say, _warn)  # its tags and pulls are dockerd's; its builds pass --engine
    width = max(len(s.name) for s in report.steps)
    _say(f"demo passed in {report.seconds:.0f} s:")
    for step in report.steps:
        _say(f"  {step.name:<{width}}  {step.seconds:6.1f} s")
    _say(f"published and verified: {report.image} (gone with the demo's registry)")
    return 0


def register(subparsers, add_common) -> None:
    # deferred: import cost: loaded only when `demo` runs, not to build the parser
    from mtpimage.demo.testbase import DEFAULT_BASE_IMAGE

    p = subparsers.add_parser(
        "demo",
        help="lock, check, build, push, pull, test and verify a small profile on loopback "
        "stand-ins, in minutes (needs what scripts/setup-test-host.sh installs)",
    )
    p.add_argument(
        "--base",
        default=DEFAULT_BASE_IMAGE,
        metavar="IMAGE",
        help=f"the local Debian image with python3 the demo's base is made from (default: {DEFAULT_BASE_IMAGE}, "
        "made by scripts/setup-test-host.sh)",
    )
    p.set_defaults(func=cmd_demo)
