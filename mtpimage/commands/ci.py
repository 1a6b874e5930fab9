"""`ci` (generate / check the GitHub Actions workflows), `diff` (two version vectors) and
`summary` (the image workflow's job summary). See mtpimage/commands/__init__.py.

  python build.py ci [--registry HOST[:PORT]/NAMESPACE] [--check]
  python build.py diff A B [--set C.F=V ...] [--set-a C.F=V ...] [--json] [--exit-code]
  python build.py summary --profile NAME FILE
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from mtpimage.errors import EXIT_RULES, InputError
from mtpimage.manifests import manifest
from mtpimage.outputs import vectordiff, workflow


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

    p = subparsers.add_parser(
        "summary", help="markdown job summary of one image build (used by the image workflow)"
    )
    p.add_argument("--profile", required=True)
    p.add_argument("file", type=Path, help="the JSON written by `build.py --summary-file`")
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
    from mtpimage.plan.load import plan_for, substitutions_of

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
        return vectordiff.side_from_vector(ref, vectordiff.vector_from_image(ref), kind="image", image=ref)
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


# -- summary ---------------------------------------------------------------------------------
def cmd_summary(args) -> int:
    """Never fails the job: a missing or bad file is reported in the summary itself."""
    data, problem = None, None
    try:
        data = json.loads(args.file.read_text())
        if not isinstance(data, dict):
            data, problem = None, "the summary file is not a JSON object"
    except FileNotFoundError:
        problem = "the build stopped before writing its summary file"
    except (OSError, ValueError) as exc:
        problem = f"unreadable summary file ({type(exc).__name__})"
    sys.stdout.write(workflow.render_summary(args.profile, data, problem))
    return 0
