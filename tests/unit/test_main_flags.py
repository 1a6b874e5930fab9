"""The main job's flags have one home each (commands/mainjob.py for its own, cli._common and
image.add_build_arguments for those it shares), and the fast path's own list of the options a
remembered run may have (standard library only, so it cannot read the parser) stays in step."""

from __future__ import annotations

import argparse

import pytest

from mtpimage import cli
from mtpimage.assembly import fastpath
from mtpimage.commands import mainjob


def _top_level_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        s: a
        for a in parser._actions
        if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
        for s in a.option_strings
    }


def test_only_mainjob_and_the_shared_groups_add_top_level_options():
    """No subcommand module adds options to the main job behind mainjob.py's back (they did:
    lock.py --frozen, image.py --push, --registry, --cache-from, ...)."""
    alone = cli.OneLineParser(prog="build.py")
    cli._common(alone, sub=False)
    mainjob.add_options(alone)
    assert set(_top_level_options(cli.make_parser())) == set(_top_level_options(alone))


@pytest.mark.parametrize("option", fastpath.OPTIONS)
def test_each_fast_path_option_is_a_main_job_option_that_takes_one_value(option):
    action = _top_level_options(cli.make_parser()).get(option)
    assert action is not None, f"{option} is in fastpath.OPTIONS but not an option of the main job"
    assert isinstance(action, (argparse._StoreAction, argparse._AppendAction)), option
    assert action.nargs is None, option  # fastpath.parse() takes exactly one value after it


@pytest.mark.parametrize("option", fastpath.OPTIONS)
def test_the_fast_path_reads_each_option_as_argparse_does(option):
    parser = cli.make_parser()
    action = _top_level_options(parser)[option]
    value = action.choices[-1] if action.choices else "v1"
    for argv in ([option, value], [f"{option}={value}"]):
        seen = fastpath.parse(argv)
        got = vars(parser.parse_args(argv))[action.dest]
        want = seen["--set"] if option == "--set" else seen[option]
        assert [str(x) for x in got] == want if isinstance(got, list) else str(got) == want


def test_options_outside_the_list_take_the_full_path():
    parser = cli.make_parser()
    outside = set(_top_level_options(parser)) - set(fastpath.OPTIONS) - {"-h", "--help"}
    assert {"--push", "--registry", "--dry-run", "--json", "--reproducible", "--engine"} <= outside
    for option in sorted(outside):
        action = _top_level_options(parser)[option]
        argv = [option] if action.nargs == 0 else [option, "v"]
        assert fastpath.parse(argv) is None, option


def test_unkeyed_options_are_accepted_options():
    assert set(fastpath.UNKEYED) <= set(fastpath.OPTIONS)
