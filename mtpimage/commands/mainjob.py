"""The main job's command line, `build.py [--profile NAME] [...]`: the options only it takes,
added to the top-level parser here and nowhere else, and read back into a pipeline.MainJob.

Its other options each have one home, shared with the other commands that take them:
  cli._common                    --manifests, --set, --json, --substitute-base, --omit-packages
                                 (every command)
  image.add_build_arguments      --ca-bundle, --netrc, --builder, --progress, --engine,
                                 --reproducible, --no-cache, --registry-mirror, --gpu,
                                 --full-checks (the main job and `test`)
The fast path (assembly/fastpath.py, standard library only: it runs before this is imported)
keeps its own list of the options a remembered run may have; tests/unit/test_main_flags.py
holds that list to this parser (each a main-job option that takes one value).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtpimage.assembly.pipeline import MainJob
from mtpimage.commands.image import add_build_arguments, build_options_from_args
from mtpimage.errors import InputError
from mtpimage.imageref import Registry
from mtpimage.settings import DEFAULT_PROFILE


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help=f"profile to build (default: {DEFAULT_PROFILE})")
    parser.add_argument(
        "--dry-run", action="store_true", help="resolve, check and print the plan without Docker"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="in the plan: each declared departure's reason and link, each warning's message and fix",
    )
    parser.add_argument(
        "--frozen",
        dest="frozen",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop when manifests/ and manifests/lock.yaml disagree (default: on when "
        "lock.yaml exists; --frozen also requires it to exist)",
    )
    parser.add_argument(
        "--cache-from",
        action="append",
        metavar="SPEC",
        help="BuildKit cache source, e.g. type=registry,ref=REG/mtp-verl:buildcache (repeatable)",
    )
    parser.add_argument(
        "--cache-to",
        action="append",
        metavar="SPEC",
        help="BuildKit cache export (buildx only), e.g. type=registry,ref=...,mode=max",
    )
    parser.add_argument(
        "--summary-file",
        type=Path,
        metavar="PATH",
        help="write a JSON summary (profile, image, pushed, references, digest) for CI",
    )
    parser.add_argument("--push", action="store_true", help="push after the tests pass (needs --registry)")
    parser.add_argument("--registry", metavar="HOST[:PORT]/NAMESPACE", help="registry to publish to")
    add_build_arguments(parser, main=True)


def main_job(args, manifests, plan) -> MainJob:
    """The main job's options (`build.py --profile NAME ...`) as a MainJob."""
    reg = None
    if args.push or args.registry:
        if not (args.push and args.registry):
            raise InputError(
                "--push",
                None,
                "--push and --registry go together",
                "use --push --registry HOST[:PORT]/NAMESPACE",
            )
        reg = Registry.parse(args.registry)
    # the profile's builds.compression says how its published layers are compressed: it
    # matters only when publishing (a local image is the engine's own, uncompressed)
    said = None
    if reg is not None and plan.layer_compression:
        said = (plan.layer_compression, f"profile {plan.profile}: builds.compression")
    return MainJob(
        manifests=manifests,
        plan=plan,
        frozen=getattr(args, "frozen", None),
        registry=reg,
        build=build_options_from_args(args, said),
        gpu=getattr(args, "gpu", False),
        full_checks=getattr(args, "full_checks", False),
        summary_file=getattr(args, "summary_file", None),
    )
