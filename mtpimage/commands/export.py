"""`export --format enroot`: a squashfs of the tested image for pyxis/enroot clusters."""

from __future__ import annotations

from pathlib import Path

from mtpimage import engine
from mtpimage.assembly.render import render
from mtpimage.commands.load import load_for, plan_for, substitutions_of


def cmd_export(args) -> int:
    # deferred: import cost: loaded only when `export` runs, not to build the parser
    from mtpimage.outputs.enroot import export_enroot

    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    image = args.image or render(plan, m.root).image()
    out = args.out or Path("out") / f"{image.split('/')[-1].replace(':', '+')}.sqsh"
    sqsh, vector = export_enroot(image, out, engine.named())
    print(
        f"exported {image}\n  squashfs        {sqsh}\n  version vector  {vector}\n"
        f"  use: srun --container-image={sqsh} ..."
    )
    return 0


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser("export", help="export the tested image for a cluster (enroot squashfs)")
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--format", required=True, choices=["enroot"])
    p.add_argument("--image", help="image to export (default: the profile's tested local image)")
    p.add_argument("--out", type=Path, help="squashfs path (default: out/<image>.sqsh)")
    p.set_defaults(func=cmd_export)
