"""Subcommands of the stages after the plan: parsing and printing only; what they do lives
in the domain modules (lock/locker.py, assembly/pipeline.py, assembly/release.py, outputs/squashfs.py, ...).

Each module in MODULES exposes:
  register(subparsers, add_common)   add its subcommands; set `func=handler(args) -> int`
The main job (`build.py --profile ...`) has no subcommand: its own options are mainjob.py's,
and it runs as pipeline.run(commands.mainjob.main_job(args, ...)).
"""

from mtpimage.commands import bump, ci, demo, export, image, lock, sbom, verify, wheels

# the order of their subcommands in --help
MODULES = [lock, bump, image, ci, export, wheels, sbom, verify, demo]
