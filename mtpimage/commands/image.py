"""Render, build, test and publish images: the command line of the image stages.

  python3 build.py render --profile NAME [--out DIR] [--with-sources]
  python3 build.py test --profile NAME [--image REF] [--gpu] [--full-checks]
  python3 build.py --profile NAME [--push --registry HOST[:PORT]/NS] [--ca-bundle PATH] ...

The main job itself is pipeline.py's; its command line is commands/mainjob.py's. The build
options it shares with `test` (add_build_arguments) are registered here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtpimage import engine
from mtpimage.assembly import pipeline
from mtpimage.assembly.buildctx import write_context
from mtpimage.assembly.pipeline import BuildOptions, TestsFailed, build_image, run_tests
from mtpimage.assembly.render import render
from mtpimage.commands.load import load_for, plan_for, substitutions_of
from mtpimage.engine import ENGINES, layercompress
from mtpimage.engine.containerengine import SECRET_LIMITS
from mtpimage.errors import InputError
from mtpimage.lock import lockfile
from mtpimage.manifests import inputfile
from mtpimage.mirrors import Mirrors
from mtpimage.plan import rules


def _say(msg: str) -> None:
    print(msg, flush=True)


REGISTRY_MIRROR_HELP = (
    "pull the base of REGISTRY by its digest from this mirror (repeatable; default: "
    "$MTP_REGISTRY_MIRROR); in no layer, label or identity"
)


def add_registry_mirror(p: argparse.ArgumentParser, default=None) -> None:
    """--registry-mirror, on every command that builds (the main job, test, stack, verify's
    rebuild, wheels verify)."""
    p.add_argument(
        "--registry-mirror",
        action="append",
        default=default,
        metavar="REGISTRY=HOST[:PORT][/PREFIX]",
        help=REGISTRY_MIRROR_HELP,
    )


ENGINE_HELP = (
    "what builds: docker (BuildKit, the default) or buildah (bit-for-bit reproducible; "
    "default: $MTP_ENGINE, else docker)"
)


def add_engine(p: argparse.ArgumentParser, default=None) -> None:
    """--engine, the same on every command that builds (the main job, test, stack, render
    --with-sources); build_options_from_args() turns it into the engine object the build is given."""
    p.add_argument("--engine", default=default, choices=list(ENGINES), help=ENGINE_HELP)


def check_secret_files(args) -> None:
    """--ca-bundle and --netrc are regular files within their limits, checked when the command
    line is read: before anything else runs, so a wrong path is said even when the image is
    already up to date and no build would have read it (issue #46)."""
    for flag in ("ca_bundle", "netrc"):
        path = getattr(args, flag, None)
        if path is not None:
            name = "--" + flag.replace("_", "-")
            inputfile.check(Path(path), SECRET_LIMITS[name], f"{name}'s file", name + " " + str(path))


def build_options_from_args(args, compression: tuple[str, str] | None = None) -> BuildOptions:
    """The command's build options, its engine picked here by name (--engine, else
    MTP_ENGINE, else docker) and passed on in them. `compression` is (format, where it was
    said): the profile's builds.compression, used when --compression is not given."""
    check_secret_files(args)
    fmt, where = getattr(args, "compression", None), "--compression"
    if fmt is None and compression is not None:
        fmt, where = compression
    return BuildOptions(
        engine=engine.named(getattr(args, "engine", None), fmt, where),
        mirrors=Mirrors.configured(getattr(args, "registry_mirror", None)),
        ca_bundle=getattr(args, "ca_bundle", None),
        netrc=getattr(args, "netrc", None),
        builder=getattr(args, "builder", None),
        progress=getattr(args, "progress", None),
        no_cache=getattr(args, "no_cache", False),
        cache_from=tuple(getattr(args, "cache_from", None) or ()),
        cache_to=tuple(getattr(args, "cache_to", None) or ()),
    )


# ----------------------------------------------------------------------------- commands
def _refuse_unlocked_platform(plan, m) -> None:
    """A plan for another platform than the lock's own renders only from its platform's locked
    set (rule platform-wheels, which builds enforce with every rule): without it, the render
    would install by version, or x86_64 hashes on arm64."""
    verdict = rules.platform_wheels(plan, {})
    if verdict.status == rules.FAIL:
        rule = next(r for r in rules.rules() if r.id == "platform-wheels")
        raise InputError(lockfile.shown(m.root), "builds.platform", verdict.detail, rule.fix)


def cmd_render(args) -> int:
    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    _refuse_unlocked_platform(plan, m)
    rendered = render(plan, m.root)
    out = Path(args.out) if args.out else Path("out") / plan.profile
    count = len(rendered.write(out))
    with_sources = getattr(args, "with_sources", False)
    if with_sources:

        def say(msg: str) -> None:  # stderr: --json keeps stdout one JSON document
            print(msg, file=sys.stderr, flush=True)

        # compiled extensions come as a build gets them: the wheel cache, its share, or built
        wheels = pipeline.extension_wheels(plan, rendered, build_options_from_args(args), say)
        count = write_context(rendered, out, progress=say, wheels=wheels)
    incomplete = not with_sources and any(c.source == "git" or c.patches for c in plan.components)
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "profile": plan.profile,
                    "identity": rendered.identity,
                    "image": rendered.image(),
                    "context_digest": rendered.context_digest,
                    "out": str(out),
                    "files": sorted(rendered.files),
                    "buildable": not incomplete,
                },
                indent=2,
            )
        )
    else:
        _say(f"rendered {plan.profile} -> {out}/Dockerfile ({count} files)")
        _say(f"identity {rendered.image()}   context sha256:{rendered.context_digest}")
        if incomplete:
            _say(
                "note: without the git sources and patches (src/, patches/) this directory does "
                "not build; --with-sources fetches and writes them"
            )
    return 0


def cmd_test(args) -> int:
    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    options = build_options_from_args(args)
    image = args.image
    if image is None:
        rendered = render(plan, m.root)
        image = rendered.image()
        if options.engine.image_id(image) is None:
            _say(f"{image} is not built yet: building it (untagged) to test it")
            image = build_image(plan, rendered, options, _say)
    report = run_tests(image, args.gpu, options.engine, _say, full=args.full_checks)
    if not report.ok:
        raise TestsFailed(
            f"in-image checks failed for {image}: "
            + "; ".join(f"{r['id']}: {r['detail']}" for r in report.results if r["status"] == "fail")[:1500]
        )
    return 0


# ----------------------------------------------------------------------------- plug-in
def add_build_arguments(p: argparse.ArgumentParser, main: bool) -> None:
    """The build's command-line arguments (--ca-bundle, --netrc, --builder, --progress,
    --reproducible, --no-cache, --gpu, --full-checks) on the main job's parser or, without
    their defaults, on a subcommand's; build_options_from_args() reads them."""
    d = argparse.SUPPRESS if not main else None
    p.add_argument(
        "--ca-bundle",
        type=Path,
        default=d,
        metavar="PATH",
        help="CA bundle for HTTPS inside the build (a BuildKit secret: in no layer, label or log)",
    )
    p.add_argument(
        "--netrc",
        type=Path,
        default=d,
        metavar="PATH",
        help="netrc with index tokens for pip inside the build (a BuildKit secret)",
    )
    p.add_argument(
        "--builder", default=d, metavar="NAME", help="buildx builder (remote BuildKit) to build on"
    )
    p.add_argument(
        "--progress",
        default=d,
        choices=["auto", "plain", "tty"],
        help="BuildKit progress output (default: tty on a terminal, else plain)",
    )
    add_engine(p, d)
    p.add_argument(
        "--reproducible",
        dest="engine",
        action="store_const",
        const="buildah",
        default=d,
        help="the same as --engine buildah",
    )
    p.add_argument(
        "--compression",
        default=d,
        choices=list(layercompress.formats()),
        help="how pushed layers are compressed: gzip (the default; every client), zstd (which runtimes "
        "read it: docs/clusters.md; not Debian 12's docker) or none. The reproducible engine "
        "compresses with the tool's pinned zlib or libzstd, so each format has one digest anywhere; "
        "the docker engine pushes dockerd's gzip",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        default=d if not main else False,
        help="build without the BuildKit cache",
    )
    add_registry_mirror(p, d)
    p.add_argument(
        "--gpu",
        action="store_true",
        default=d if not main else False,
        help="also run the GPU check in the test container (needs a GPU)",
    )
    p.add_argument(
        "--full-checks",
        action="store_true",
        default=d if not main else False,
        help="run every in-image check, also those an image with the same lower layers passed "
        "(by default those are reported as reused)",
    )


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "render",
        help="write the Dockerfile and rendered files of a profile (--with-sources: the whole build context)",
    )
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--out", type=Path, help="output directory (default: out/<profile>)")
    p.add_argument(
        "--with-sources",
        action="store_true",
        help="also fetch and write the git sources and patches (src/, patches/): a directory "
        "that `docker build` builds (without it: rendered files only, no network)",
    )
    add_engine(p)  # --with-sources builds the compiled extensions' wheels it has no cache for
    p.set_defaults(func=cmd_render)

    p = subparsers.add_parser("test", help="run the in-image checks of a profile's image in a container")
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--image", help="image to test (default: the profile's identity tag; built if missing)")
    add_build_arguments(p, main=False)
    p.set_defaults(
        func=cmd_test,
        gpu=False,
        full_checks=False,
        ca_bundle=None,
        netrc=None,
        builder=None,
        progress=None,
        no_cache=False,
        engine=None,
        registry_mirror=None,
    )
