"""`ci` (generate / check the GitHub Actions workflows), `diff` (two version vectors), and
the image workflow's own steps: `stack` (the shared stack, built once), `disk` (the free disk
a job needs), `published` (a pushed image's digest, for signing) and `summary` (the job
summary). See mtpimage/commands/__init__.py.

  python3 build.py ci [--registry HOST[:PORT]/NAMESPACE] [--check]
  python3 build.py diff A B [--set C.F=V ...] [--set-a C.F=V ...] [--json] [--exit-code]
  python3 build.py stack [--profile NAME ...] [--push --registry REG] [--cache-from-args]
  python3 build.py disk --need-gb N --job NAME [--path PATH ...]
  python3 build.py published --profile NAME --registry REG
  python3 build.py summary --profile NAME FILE
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from mtpimage import engine, invocation, settings
from mtpimage.assembly.render import render
from mtpimage.commands.image import add_engine, add_registry_mirror, build_options_from_args
from mtpimage.commands.load import load_for, plan_for, substitutions_of
from mtpimage.errors import EXIT_RULES, InputError
from mtpimage.imageref import Registry
from mtpimage.manifests import manifest
from mtpimage.outputs import reproduce, vectordiff, workflow
from mtpimage.plan.model import IMAGE_REPOSITORY
from mtpimage.publish import sbomattach
from mtpimage.publish.registryclient import RegistryClient


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "ci",
        help="generate .github/workflows/ from the profiles (--check: fail when stale)",
        description="Write .github/workflows/images.yml (one matrix entry per image) and "
        ".github/workflows/tests.yml from the profiles and the templates in "
        "mtpimage/templates/workflows/. Without --registry, the registry recorded in "
        "the committed images.yml is kept (GHCR of the repository owner by default).",
    )
    p.add_argument(
        "--manifests",
        type=Path,
        default=argparse.SUPPRESS,
        help="manifests directory (default: the checkout's manifests/; installed: ./manifests)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming each workflow that differs from what would be generated",
    )
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT]/NAMESPACE",
        help=f"registry the image workflow pushes to, baked into images.yml "
        f"(default: the committed one, else {workflow.DEFAULT_REGISTRY}; "
        f"'{workflow.OWNER}' is the lower-cased repository owner)",
    )
    p.add_argument("--root", type=Path, default=workflow.REPO_ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_ci)

    p = subparsers.add_parser(
        "diff",
        help="what differs between two profiles or images (version vectors)",
        description="Compare the version vectors of A and B: base image, components (commit, "
        "ref, version, patches), packages, engine, layers and the verl overrides per "
        "target. A and B are profile names, image references (the vector is read from "
        "the image) or version.json files. --set changes B only; --set-a changes A, so "
        "`diff P P --set megatron-lm.commit=SHA` shows what a pin change does to P. "
        "Exit status: 0 whether or not A and B differ (it is a report); with "
        "--exit-code, 1 when they differ, as `git diff --exit-code`; 2 on bad input.",
    )
    add_common(p)
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument(
        "--set-a",
        action="append",
        dest="sets_a",
        metavar="COMPONENT.FIELD=VALUE",
        help="override a pin of A (repeatable); --set applies to B",
    )
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when A and B differ (without it diff exits 0 either way)",
    )
    p.set_defaults(func=cmd_diff)

    _register_jobs(subparsers, add_common)

    p = subparsers.add_parser(
        "summary", help="markdown job summary of one image build (used by the image workflow)"
    )
    p.add_argument("--profile", required=True)
    p.add_argument("file", type=Path, nargs="?", help="the JSON written by `build.py --summary-file`")
    p.add_argument(
        "--verify", metavar="REG/mtp-verl@sha256:...", help="instead: how to verify this signed image"
    )
    p.add_argument(
        "--signed-by", metavar="OWNER/REPO", help="with --verify: the repository whose workflow signed it"
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="the image was built with --engine buildah: add how to verify it from a clean checkout "
        "at its revision (read from the local image's label; the wheel share from $MTP_WHEEL_CACHE_REPO)",
    )
    p.add_argument(
        "--platform",
        metavar="OS/ARCH",
        help="with --reproducible: the image's builds.platform (verify names it); with --verify: "
        "the platform of the signed image",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="with --verify: the signed image is the profile's multi-arch index (what its tag names)",
    )
    p.set_defaults(func=cmd_summary)


# -- ci --------------------------------------------------------------------------------------
def cmd_ci(args) -> int:
    root: Path = args.root
    m = manifest.load(getattr(args, "manifests", None))
    registry = workflow.parse_registry(args.registry or workflow.current_registry(root))
    files = workflow.render_workflows(m, registry)
    if args.check:
        stale = workflow.stale(root, files)
        for rel in stale:
            path = root / rel
            old = path.read_text().splitlines(keepends=True) if path.is_file() else []
            sys.stdout.writelines(
                list(
                    difflib.unified_diff(
                        old, files[rel].splitlines(keepends=True), f"{rel} (committed)", f"{rel} (generated)"
                    )
                )[:60]
            )
        for rel in stale:
            print(
                f"error: {rel} is stale (fix: run `{workflow.regenerate_command(registry)}` "
                "and commit the result)",
                file=sys.stderr,
            )
        if not stale:
            print(f"up to date: {', '.join(sorted(files))}")
        return EXIT_RULES if stale else 0
    changed = workflow.write(root, files)
    for rel in sorted(files):
        print(f"{'wrote' if rel in changed else 'unchanged'} {rel}")
    print(f"registry: {registry}")
    return 0


# -- diff ------------------------------------------------------------------------------------
def _side(m, ref: str, sets, args=None) -> vectordiff.Side:
    if ref in m.profiles:
        return vectordiff.side_from_plan(plan_for(m, ref, sets, **substitutions_of(args)))
    if sets:
        raise InputError(
            "--set",
            ref,
            "--set/--set-a apply to profiles only, not to images or files",
            "compare profiles, or drop the --set",
        )
    path = Path(ref)
    if ref.endswith(".json") and path.is_file():
        return vectordiff.side_from_file(path)
    if vectordiff.looks_like_image(ref):
        vector = vectordiff.vector_from_image(ref, engine.named())  # read, not built: MTP_ENGINE's
        return vectordiff.side_from_vector(ref, vector, kind="image", image=ref)
    raise InputError(
        "diff",
        ref,
        f"'{ref}' is neither a profile, an image reference nor a .json file",
        f"use one of: {', '.join(m.names())}, an image like mtp-verl:TAG, or a version.json",
    )


def cmd_diff(args) -> int:
    m = manifest.load(getattr(args, "manifests", None))
    a = _side(m, args.a, args.sets_a, args)
    b = _side(m, args.b, getattr(args, "sets", None), args)
    changes = vectordiff.diff_vectors(a.vector, b.vector)
    if getattr(args, "json", False):
        print(json.dumps(vectordiff.to_json(a, b, changes), indent=2, sort_keys=True))
    else:
        sys.stdout.write(vectordiff.format_text(a, b, changes))
    return EXIT_RULES if (changes and args.exit_code) else 0


# -- the image workflow's steps: stack, disk, published -------------------------------------
def _register_jobs(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "stack",
        help="build the layers below the mode layer once for the given profiles (the workflow's stack job)",
        description="Build each distinct shared stack (every layer below the mode layer; profiles "
        "with equal pins share one) with its BuildKit cache inside the image, and with --push "
        "push it as REG/mtp-verl:stack-<key>. A stack already there is not built again. "
        "--cache-from-args prints, one per line, the main job's options that take a profile's "
        "layers from its pushed stack, and builds nothing.",
    )
    add_common(p)
    p.add_argument(
        "--profile",
        action="append",
        dest="profiles",
        metavar="NAME",
        help="repeatable; default: every image profile",
    )
    p.add_argument("--push", action="store_true", help="push the stack (needs --registry)")
    p.add_argument("--registry", metavar="HOST[:PORT]/NAMESPACE")
    p.add_argument(
        "--cache-from-args",
        action="store_true",
        help="print the main job's --cache-from options for this profile's stack",
    )
    for flag, kind, text in (
        ("--ca-bundle", Path, "CA bundle for HTTPS inside the build (a BuildKit secret)"),
        ("--netrc", Path, "netrc with index tokens (a BuildKit secret)"),
        ("--builder", str, "buildx builder to build on"),
        ("--progress", str, "BuildKit progress output: auto, plain or tty"),
    ):
        p.add_argument(flag, type=kind, help=text)
    p.add_argument("--cache-from", action="append", metavar="SPEC", help="another BuildKit cache source")

    add_engine(p)
    add_registry_mirror(p)
    p.set_defaults(func=cmd_stack, no_cache=False)

    p = subparsers.add_parser(
        "disk", help="stop with one line when the disk cannot hold what a CI job will write"
    )
    p.add_argument(
        "--need-gb", type=float, required=True, help="free GB the job needs (mtpimage/data/ci.yaml)"
    )
    p.add_argument("--job", required=True, help="the job's name, for the message")
    p.add_argument(
        "--path",
        type=Path,
        action="append",
        dest="paths",
        help="where it writes (repeatable; default: dockerd's data root and the tool's cache, and "
        "with --engine buildah its clean builders' scratch)",
    )
    add_engine(p)
    p.set_defaults(func=cmd_disk)

    p = subparsers.add_parser(
        "published",
        help="name, digest and SBOM of a profile's tested image in a registry, as KEY=VALUE lines",
    )
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--registry", required=True, metavar="HOST[:PORT]/NAMESPACE")
    p.set_defaults(func=cmd_published)

    p = subparsers.add_parser(
        "index",
        help="publish one multi-arch image index of a profile's per-platform images under its tag",
        description="Read each platform's published image of the profile (its content tag) back "
        "from the registry, check its digest from its bytes and its config's platform, and put "
        "one OCI image index that lists them under REG/mtp-verl:<profile> (canonical JSON: the "
        "same images give the same digest). Prints name= and digest= lines (the index).",
    )
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--registry", required=True, metavar="HOST[:PORT]/NAMESPACE")
    p.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        metavar="OS/ARCH",
        help="a platform the index lists (repeatable; default: linux/amd64 and every platform of "
        "mtpimage/data/platforms.yaml)",
    )
    p.set_defaults(func=cmd_index)


def _registry(value: str, flag: str = "--registry"):
    return Registry.parse(value)


def cmd_stack(args) -> int:
    # deferred: import cost: loaded only when `stack` runs, not to build the parser
    from mtpimage.assembly import stack, stackjob

    if args.push and not args.registry:
        raise InputError(
            "--push", None, "--push needs --registry", "use --push --registry HOST[:PORT]/NAMESPACE"
        )
    if args.progress not in (None, "auto", "plain", "tty"):
        raise InputError("--progress", args.progress, "expected auto, plain or tty", "drop it or use plain")
    m = load_for(args)
    names = args.profiles or m.names()
    rendered = [
        render(plan_for(m, n, getattr(args, "sets", None), **substitutions_of(args)), m.root) for n in names
    ]
    registry = _registry(args.registry) if args.registry else None
    if args.cache_from_args:
        if registry is None or len(rendered) != 1:
            raise InputError(
                "--cache-from-args",
                None,
                "needs one --profile and --registry",
                "use stack --cache-from-args --profile NAME --registry HOST[:PORT]/NAMESPACE",
            )
        for spec in stack.cache_sources(registry, rendered[0]):
            print(f"--cache-from\n{spec}")
        return 0
    stackjob.run(rendered, build_options_from_args(args), registry if args.push else None, say=_say)
    return 0


def _say(msg: str) -> None:
    print(msg, flush=True)


def cmd_disk(args) -> int:
    # deferred: import cost: loaded only when `disk` runs, not to build the parser
    from mtpimage.assembly import diskcheck

    paths = args.paths or diskcheck.default_paths(engine.name(args.engine), settings.current().cache_root)
    diskcheck.check(args.need_gb, paths, args.job, say=_say)
    return 0


def cmd_published(args) -> int:
    """KEY=VALUE lines for $GITHUB_OUTPUT: `name` (REG/mtp-verl), `digest` of the profile's
    content tag (pushed only after its checks passed) and `sbom` (its SBOM artifact, REF@DIGEST)."""
    m = load_for(args)
    rendered = render(
        plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args)), m.root
    )
    reg = _registry(args.registry)
    client = RegistryClient(reg)
    digest = client.manifest_digest(IMAGE_REPOSITORY, rendered.identity)
    if digest is None:
        print(
            f"error: {reg.ref(IMAGE_REPOSITORY, rendered.identity)} is not in the registry "
            f"(fix: run the profile's publish job first: {invocation.command()} --profile {args.profile} "
            f"--push --registry {reg})",
            file=sys.stderr,
        )
        return EXIT_RULES
    name = reg.ref(IMAGE_REPOSITORY, rendered.identity).rsplit(":", 1)[0]
    print(f"name={name}\ndigest={digest}")
    sbom = sbomattach.attached(client, IMAGE_REPOSITORY, digest)
    if sbom:
        print(f"sbom={name}@{sbom}")
    return 0


def cmd_index(args) -> int:
    """The profile's per-platform images (each its plan with builds.platform set), read back and
    listed in one index under the profile's tag; name= and digest= for $GITHUB_OUTPUT."""
    # deferred: import cost: loaded only when `index` runs, not to build the parser
    from mtpimage.plan import platforms as known_platforms  # deferred: as above
    from mtpimage.publish import baseplatform, imageindex  # deferred: as above

    # platforms.yaml names linux/amd64 too (the build platform): each platform once, amd64 first
    allowed = {baseplatform.BUILD_PLATFORM, *known_platforms.known()}
    wanted = args.platforms or [baseplatform.BUILD_PLATFORM, *sorted(allowed - {baseplatform.BUILD_PLATFORM})]
    for p in wanted:
        if p not in allowed:
            raise InputError(
                "--platform", p, "not a platform images are built for", f"use {', '.join(sorted(allowed))}"
            )
    m = load_for(args)
    reg = _registry(args.registry)
    client = RegistryClient(reg)
    members, tag = [], None
    for p in wanted:
        sets = [*(getattr(args, "sets", None) or []), f"builds.platform={p}"]
        plan = plan_for(m, args.profile, sets, **substitutions_of(args))
        tag = tag or plan.profile
        identity = render(plan, m.root).identity
        one = imageindex.member(client, IMAGE_REPOSITORY, identity, p)
        print(f"{p:<12} {reg.ref(IMAGE_REPOSITORY, identity)} {one.digest}", file=sys.stderr)
        members.append(one)
    digest = imageindex.publish(client, IMAGE_REPOSITORY, tag, members)
    name = reg.ref(IMAGE_REPOSITORY, tag).rsplit(":", 1)[0]
    print(f"index        {name}:{tag} {digest} ({len(members)} platforms)", file=sys.stderr)
    print(f"name={name}\ndigest={digest}")
    return 0


# -- summary ---------------------------------------------------------------------------------
def _known_platform(platform: str | None) -> None:
    from mtpimage.plan import platforms as known_platforms  # deferred: only when a summary names a platform

    if platform is not None and platform not in known_platforms.known():
        raise InputError(
            "--platform",
            platform,
            "not a platform images are built for",
            f"use {', '.join(known_platforms.known())}",
        )


def cmd_summary(args) -> int:
    """Never fails the job: a missing or bad file is reported in the summary itself."""
    if args.verify:
        if not args.signed_by or "/" not in args.signed_by:
            raise InputError("--signed-by", args.signed_by, "expected OWNER/REPO", "pass $GITHUB_REPOSITORY")
        if args.index and args.platform:
            raise InputError("--index", None, "an index lists every platform", "drop --platform")
        _known_platform(args.platform)
        sys.stdout.write(
            workflow.verify_summary(args.profile, args.verify, args.signed_by, args.platform, args.index)
        )
        return 0
    if args.file is None:
        raise InputError("summary", None, "needs FILE (or --verify)", "pass the --summary-file JSON")
    data, problem = None, None
    try:
        data = json.loads(args.file.read_text())
        if not isinstance(data, dict):
            data, problem = None, "the summary file is not a JSON object"
    except FileNotFoundError:
        problem = "the build stopped before writing its summary file"
    except (OSError, ValueError) as exc:
        problem = f"unreadable summary file ({type(exc).__name__})"
    how = None
    if args.reproducible and data is not None:
        how = reproduce.for_published(
            args.profile,
            data,
            engine.named().labels,  # the image this runner built: either engine reads it in dockerd
            settings.current().wheel_cache_repo,
            reproduce.describe_builder(engine.reproducible().describe),
            args.platform,
        )
    sys.stdout.write(workflow.render_summary(args.profile, data, problem, how))
    return 0
