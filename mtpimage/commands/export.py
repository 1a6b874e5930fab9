"""`export --format enroot|apptainer`: a squashfs of the tested image for pyxis/enroot or
Apptainer clusters, compressed as that runtime reads best (data/runtimes.yaml)."""

from __future__ import annotations

from pathlib import Path

from mtpimage import engine
from mtpimage.assembly.render import render
from mtpimage.commands.load import load_for, plan_for, substitutions_of

FORMATS = ("enroot", "apptainer")
# how a node runs the file, per runtime (the path is filled in)
USE = {
    "enroot": "srun --container-image={path} ...   (pyxis; or: enroot create {path})",
    "apptainer": "apptainer exec --nv {path} ...   (a site that allows SIF only: apptainer build IMAGE.sif {path})",
}


def cmd_export(args) -> int:
    # deferred: import cost: loaded only when `export` runs, not to build the parser
    from mtpimage.outputs.squashfs import export_squashfs

    runtimes = _table()

    rt = runtimes.runtime(args.format)
    comp = runtimes.compression(args.squash_compression, rt)
    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    image = args.image or render(plan, m.root).image()
    out = args.out or Path("out") / f"{image.split('/')[-1].replace(':', '+')}.sqsh"
    done = export_squashfs(image, out, engine.named(), rt, comp)
    default = " (the default for this runtime)" if comp.name == rt.export_default else ""
    print(
        f"exported {image} for {rt.title}\n"
        f"  squashfs        {done.squashfs}\n"
        f"                  {comp.name}{default}, {done.size / 1e6:.1f} MB, sha256 {done.sha256}\n"
        f"  version vector  {done.vector}\n"
        f"  read by         {rt.reads_line(comp.name)}\n"
        f"  use: {USE[rt.name].format(path=done.squashfs)}"
    )
    return 0


def _table():
    # deferred: import cost: the parser is built for every command; the table only here
    from mtpimage.outputs import runtimes

    return runtimes


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "export", help="export the tested image for a cluster (squashfs for enroot/pyxis or Apptainer)"
    )
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--format", required=True, choices=FORMATS, help="the runtime the squashfs is for")
    table = _table()
    defaults = ", ".join(f"{rt.name} {rt.export_default}" for rt in table.runtimes().values())
    p.add_argument(
        "--squash-compression",
        choices=list(table.compressions()),
        help=f"mksquashfs compression (default per runtime: {defaults}); the output says which "
        "versions of the runtime read it (mtpimage/data/runtimes.yaml)",
    )
    p.add_argument("--image", help="image to export (default: the profile's tested local image)")
    p.add_argument("--out", type=Path, help="squashfs path (default: out/<image>.sqsh)")
    p.set_defaults(func=cmd_export)
