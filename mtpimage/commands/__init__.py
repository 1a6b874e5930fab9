"""Subcommands of the stages after the plan: parsing and printing only; what they do lives
in the domain modules (locking.py, pipeline.py, publish.py, cluster.py, workflow.py, ...).

Each module exposes:
  register(subparsers, add_common)   add its subcommands; set `func=handler(args) -> int`
  add_main_options(parser)           optional: options of the main job (`build.py --profile ...`),
                                     which runs as pipeline.run(commands.image.main_job(args, ...))
"""

from . import ci, cluster, image, lock, sbom, wheels

MODULES = [lock, image, ci, cluster, wheels, sbom]  # the order of their subcommands in --help
