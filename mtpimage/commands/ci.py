"""Placeholder command module; see mtpimage/commands/__init__.py for the interface."""


def register(subparsers, add_common) -> None:
    return None


def add_main_options(parser) -> None:
    return None


def run_main(args, manifests, plan, results):
    return None
