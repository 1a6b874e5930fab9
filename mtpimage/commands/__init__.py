"""Subcommands of the stages after the plan (lock, image build/test/publish, ...).

Each module exposes:
  register(subparsers, add_common)   add its subcommands; set `func=handler(args) -> int`
  add_main_options(parser)           optional: options of the main job (`build.py --profile ...`)
  run_main(args, manifests, plan, results) -> int | None
                                     optional: its part of the main job; None = not handled
"""
from . import ci, cluster, image, lock

# Order matters for the main job: lock (frozen check) runs before image (build/test/push).
MODULES = [lock, image, ci, cluster]
