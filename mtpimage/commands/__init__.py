"""Subcommands of the stages after the plan: parsing and printing only; what they do lives
in the domain modules (lock/locker.py, assembly/pipeline.py, publish/release.py, outputs/enroot.py, ...).

Each module exposes:
  register(subparsers, add_common)   add its subcommands; set `func=handler(args) -> int`
  add_main_options(parser)           optional: options of the main job (`build.py --profile ...`),
                                     which runs as pipeline.run(commands.image.main_job(args, ...))
"""

from mtpimage.commands import bump, ci, demo, export, image, lock, sbom, verify, wheels

# the order of their subcommands in --help
MODULES = [lock, bump, image, ci, export, wheels, sbom, verify, demo]
