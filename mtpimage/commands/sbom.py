"""`sbom`: the image's software bill of materials (CycloneDX 1.5 JSON, sbom.py).

  python3 build.py sbom --profile NAME [--out FILE]

Made from the plan and lock.yaml alone (no build, no network); the compiled extensions'
wheels are named with their sha256 when this machine's wheel cache holds them. The main job
attaches the same document to every image it pushes (sbomattach.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mtpimage import invocation
from mtpimage.assembly.render import render
from mtpimage.assembly.sbom import document, dumps, known_wheels
from mtpimage.commands.load import load_for, plan_for, substitutions_of


def cmd_sbom(args) -> int:
    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    rendered = render(plan, m.root)
    doc = document(rendered.recipe, rendered.identity, known_wheels(rendered))
    data = dumps(doc)
    if not plan.locked:
        print(
            f"warning: {plan.profile} has no matching lock.yaml: the SBOM lists versions as pinned, "
            f"without files or sha256 (fix: {invocation.command()} lock)",
            file=sys.stderr,
        )
    if args.out is None:
        sys.stdout.write(data.decode("ascii"))  # ensure_ascii: the bytes are ASCII
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"wrote {args.out} (CycloneDX {doc['specVersion']}, {len(doc['components'])} components)")
    return 0


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser("sbom", help="the image's software bill of materials (CycloneDX JSON)")
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--out", type=Path, help="write it here (default: standard output)")
    p.set_defaults(func=cmd_sbom)
