"""Command line: `python3 build.py [SUBCOMMAND] ...`; no subcommand runs the main job."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from mtpimage import invocation, settings
from mtpimage.assembly.driver import served
from mtpimage.assembly.pipeline import base_first, base_platform, build_mirrors, check_frozen, run
from mtpimage.assembly.render import image_of as _image_of
from mtpimage.commands import MODULES
from mtpimage.commands.image import add_registry_mirror
from mtpimage.commands.load import load_for, plan_for, substitutions_of
from mtpimage.errors import (
    EXIT_ENV,
    EXIT_INPUT,
    EXIT_RULES,
    BuilderError,
    InputError,
    quiet_exit_for_gone_reader,
    redact,
    stdout_reader_gone,
)
from mtpimage.lock import lockfile
from mtpimage.lock.lockfile import locked_probes
from mtpimage.lock.probes import evaluate_plans
from mtpimage.manifests import sitefacts
from mtpimage.mirrors import Mirrors
from mtpimage.outputs.report import print_checks, print_plan, resolution_lines, summary_text
from mtpimage.plan import mtponly, rules
from mtpimage.plan.model import Plan, mode_guarantees, verl_facts
from mtpimage.plan.modelconfig import check_model


def image_of(plan: Plan, root) -> str:
    return _image_of(plan, root)


DEFAULT_PROFILE = settings.DEFAULT_PROFILE


class OneLineParser(argparse.ArgumentParser):
    """argparse prints a multi-line usage block on bad flags; users get one line."""

    def error(self, message: str):
        print(f"error: {self.prog}: {message} (fix: see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_INPUT)


# The answer first: by default one short line per declared departure and per warning; the
# reasons and links (300-750 characters each) only when asked. --json always has everything.
VERBOSE_HELP = "each declared departure's reason and link, each warning's message and fix"


def _common(p: argparse.ArgumentParser, sub: bool) -> None:
    d = argparse.SUPPRESS if sub else None
    p.add_argument(
        "--manifests",
        type=Path,
        default=d if sub else None,
        help="manifests directory (default: the checkout's manifests/; installed: ./manifests)",
    )
    p.add_argument(
        "--set",
        action="append",
        dest="sets",
        metavar="COMPONENT.FIELD=VALUE",
        default=d if sub else None,
        help="override a pin for this run, e.g. --set megatron-lm.commit=<sha>, or the GPU "
        "architectures: --set builds.cuda_archs=90,100 (repeatable)",
    )
    p.add_argument("--json", action="store_true", default=d if sub else False, help="machine-readable output")
    # The substitutions change the plan and so the identity: flags of their own, each with its
    # MTP_* variable as the fallback (substitute.py).
    p.add_argument(
        "--substitute-base",
        metavar="NAME:TAG@sha256:...",
        default=d,
        help="build on this local stand-in base instead of the profile's (recorded in the identity; "
        "default: $MTP_SUBSTITUTE_BASE)",
    )
    p.add_argument(
        "--omit-packages",
        metavar="NAME[,NAME...]",
        default=d,
        help="leave these pinned packages out (recorded in the identity; default: $MTP_OMIT_PACKAGES)",
    )


CONSOLE_COMMAND = invocation.CONSOLE_COMMAND


def program_name() -> str:
    """How the user started the tool, for usage lines and `see --help` hints: a line the user
    can copy (`python3 build.py`, never a bare `build.py` that is not on PATH)."""
    return invocation.command()


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=program_name(),
        # argparse's usage line shows COMMAND as if it were required: say what none does
        description="Build tested, reproducible verl + Megatron MTP images from manifests/. "
        f"Without a COMMAND it runs the main job on --profile (default {DEFAULT_PROFILE}): "
        "resolve, check, build, test in the image, tag locally (--push to publish).",
    )
    _common(parser, sub=False)
    # deferred: import cost: the main job's options load only for the main job
    from mtpimage.commands import mainjob

    mainjob.add_options(parser)  # the main job's own options: there and nowhere else
    subs = parser.add_subparsers(
        dest="command",
        metavar="[COMMAND]",
        parser_class=OneLineParser,
        title="commands (none: the main job)",
    )

    p = subs.add_parser("list", help="one line per profile")
    _common(p, sub=True)

    p = subs.add_parser("check", help="validate manifests and run the compatibility rules")
    _common(p, sub=True)
    p.add_argument("--profile", default=argparse.SUPPRESS)
    p.add_argument(
        "--probe-sources",
        action="store_true",
        help="fetch each pinned source and decide rules from its code (see `lock`)",
    )
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)

    add_registry_mirror(p)  # the base's platform manifest is read where builds pull it

    p = subs.add_parser("explain", help="the verl overrides for a profile, and when to choose it")
    _common(p, sub=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--target", required=True, choices=["rl", "sft"])
    p.add_argument("--model-config", type=Path, help="a HF config.json to check against the mode")
    p.add_argument(
        "--cluster",
        choices=["slurm", "apptainer", "kuberay"],
        help="print a ready job pinned to the published image's digest (sbatch script; kuberay: a RayJob)",
    )
    p.add_argument(
        "--registry", metavar="HOST[:PORT]/NAMESPACE", help="where the image was published (with --cluster)"
    )
    p.add_argument(
        "--digest",
        metavar="sha256:...",
        help="use this digest instead of asking the registry (see the job script before publishing)",
    )
    p.add_argument("--why", "--verbose", dest="verbose", action="store_true", help=VERBOSE_HELP)
    # deferred: import cost: loaded only for explain --cluster
    from mtpimage.commands import cluster

    cluster.add_options(p)

    # Stages after the plan live in their own modules; each adds its subcommands here,
    # so cli.py stays a thin dispatcher.
    for module in command_modules():
        module.register(subs, lambda sp: _common(sp, sub=True))
    return parser


def command_modules():
    return MODULES


def plans_of(m, names: list[str], args) -> tuple[list[Plan], list[InputError]]:
    """The plans of `names`, and the errors of the profiles that did not load or resolve (the
    files `load(keep_going=True)` set aside first): one broken profile stops none of the others."""
    plans: list[Plan] = []
    errors: list[InputError] = [b.error for b in m.broken]
    for name in names:
        try:
            plans.append(plan_for(m, name, getattr(args, "sets", None), **substitutions_of(args)))
        except InputError as exc:
            errors.append(exc)
    if errors and not plans:  # nothing loads: one cause (a cycle, base.yaml), one line, as ever
        raise errors[0]
    return plans, errors


def report_broken(errors: list[InputError]) -> None:
    """One `error:` line per broken profile, after the answer for the others; an error every
    profile shares (a broken lock.yaml) once."""
    for line in _lines(errors):
        print(f"error: {line}", file=sys.stderr)


def cmd_list(args) -> int:
    m = load_for(args, keep_going=True)
    rows = []
    plans, broken = plans_of(m, m.names(), args)
    for plan in plans:
        name = plan.profile
        rows.append(
            {
                "name": name,
                "mode": plan.mode,
                "targets": list(plan.targets),
                "experimental": plan.experimental,
                "summary": plan.summary,
                "image": image_of(plan, m.root),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max((len(r["name"]) for r in rows), default=0)
        for r, plan in zip(rows, plans, strict=True):
            print(f"{r['name']:<{width}}  {r['mode']:<9}  {','.join(r['targets']):<6}  {summary_text(plan)}")
    report_broken(broken)
    return EXIT_INPUT if broken else 0


def cmd_check(args) -> int:
    m = load_for(args, keep_going=True)
    one = getattr(args, "profile", None)
    if one:  # the profile asked for: its own error, whole, as before
        plans, broken = [plan_for(m, one, getattr(args, "sets", None), **substitutions_of(args))], []
    else:
        plans, broken = plans_of(m, m.names(), args)
    bases = base_platforms(plans, m.root, getattr(args, "registry_mirror", None))
    reports = evaluate_plans(plans, m.root, args.probe_sources)
    unfetched = {c: why for _, _, missing in reports for c, why in missing.items()}
    failed = any(rules.errors(res) for _, res, _ in reports)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "profile": p.profile,
                        "image": image_of(p, m.root),
                        "ok": not rules.errors(res),
                        "rules": [r.to_dict() for r in res],
                        "base_platform": bases[p.profile].to_dict(),
                        **({"unfetched_sources": miss} if args.probe_sources else {}),
                    }
                    for p, res, miss in reports
                ]
                + [{"profile": None, "ok": False, "error": line} for line in _lines(broken)],
                indent=2,
            )
        )
    else:
        print_checks([(plan, res) for plan, res, _ in reports], args.verbose)
        for line in dict.fromkeys(v.line for v in bases.values()):  # one line per distinct base
            print(f"base image {line}")

        added = sitefacts.load(m.root, rules.facts()).added
        if added:
            print(f"site facts ({len(added)}, merged over the tool's): {'; '.join(added)}")
    if unfetched:
        what = "; ".join(f"{name} ({why})" for name, why in sorted(unfetched.items()))
        fix = (
            ""
            if all("(fix: " in why for why in unfetched.values())
            else " (fix: check that the pinned commit exists upstream and the repository is "
            "reachable, e.g. git ls-remote REPO, then run again)"
        )
        print(
            f"error: check --probe-sources: could not fetch {what}; the rules that need "
            f"{'it' if len(unfetched) == 1 else 'them'} are UNKNOWN above{fix}",
            file=sys.stderr,
        )
    report_broken(broken)
    if broken:  # a profile that does not load is bad input, whatever the others' rules say
        return EXIT_INPUT
    if failed:
        return EXIT_RULES
    return EXIT_ENV if unfetched else 0


def _lines(errors: list[InputError]) -> list[str]:
    return list(dict.fromkeys(exc.one_line() for exc in errors))


def base_platforms(plans: list[Plan], root, registry_mirror=None) -> dict:
    """profile -> its base's platform manifest verdict (pipeline.base_platform), each distinct
    base read once; a lock that records another manifest stops `check` here, in one line."""
    mirrors = Mirrors.configured(registry_mirror)
    return {p.profile: base_platform(p, root, build_mirrors(mirrors, p)) for p in plans}


def cmd_explain(args) -> int:
    m = load_for(args, keep_going=True)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    for b in m.broken:  # the profile asked for is fine; say which others are not, and go on
        print(f"warning: skipped a profile file that does not load: {b.error.one_line()}", file=sys.stderr)
    if args.target not in plan.targets:
        raise InputError(
            "--target",
            args.target,
            f"profile {plan.profile} supports {', '.join(plan.targets)} only",
            f"use --target {plan.targets[0]} or another profile",
        )
    results = rules.evaluate(plan, f=rules.facts_for(m.root))
    notes = [
        f"{r.rule.id}: {r.detail}. {r.rule.message} (fix: {r.rule.fix})"
        for r in rules.errors(results) + rules.warnings(results)
    ]
    failures: list[str] = []  # a model the overrides would fail on: said first, exit 1
    model = check_model(args.model_config) if args.model_config else None
    if model is not None:
        failures, notes = model.failures, notes + model.warnings
    for line in failures:
        print(f"error: {line}", file=sys.stderr)
    done = EXIT_RULES if failures else 0
    if args.cluster:
        # deferred: import cost: loaded only for explain --cluster
        from mtpimage.commands.cluster import layout_of, signed_by_of
        from mtpimage.outputs.jobscripts import published_job_script  # deferred: as above

        job = published_job_script(
            plan,
            m.root,
            args.target,
            args.cluster,
            args.registry,
            args.digest,
            layout_of(args),
            signed_by_of(args),
            args.compression,
        )
        print(job, end="")
        return done
    overrides = plan.verl_cli_overrides_for(args.target)
    entry = verl_facts()["entrypoint"][args.target]
    patches = [(c.name, p) for c in plan.components for p in c.patches]
    guarantees = mode_guarantees(plan)
    recipe = mtponly.report(plan.mode, plan.components, rules.facts_for(m.root))
    if args.json:
        print(
            json.dumps(
                {
                    "profile": plan.profile,
                    "mode": plan.mode,
                    "target": args.target,
                    "entrypoint": entry,
                    "overrides": overrides,
                    "choose_when": plan.choose_when,
                    "guarantees": guarantees,
                    "recipe": recipe.to_dict() if recipe is not None else None,
                    "warnings": notes,
                    **(
                        {"model": {"mtp_layers": model.layers.count, "key": model.layers.key}}
                        if model
                        else {}
                    ),
                    "failures": failures,
                    "patches": [{"component": n, "patch": p.describe(), "url": p.url} for n, p in patches],
                    "image": image_of(plan, m.root),
                    "cuda_archs": list(plan.cuda_archs),
                },
                indent=2,
            )
        )
        return done
    print(_explain_head(plan, args.target, entry, guarantees, recipe, image_of(plan, m.root)))
    departures = resolution_lines(plan, args.verbose)
    if departures and not args.verbose:
        print(f"# {len(departures)} declared departures from upstream's declarations (--why shows why):")
    for line in departures:
        print(f"# {line.strip()}")
    for name, p in patches:
        print(f"# patch {name}: {p.describe()} ({p.url})")
    if "rl" in plan.targets and args.target == "rl":
        # deferred: import cost: loaded only for a multi-node explain
        from mtpimage.outputs.multinode import placement_note

        print(f"# multi-node: {placement_note(plan)}")
    if model is not None and model.layers.found:  # what it found, not only the absence of a warning
        print(f"# model {args.model_config}: {model.layers.found}")
    print("\n".join(overrides))
    for note in notes:
        print(f"# warning: {note}")
    return done


def _explain_head(plan: Plan, target: str, entry: str, guarantees, recipe, image: str) -> str:
    """explain's first lines: the profile, its entry point, when to choose it, what it
    guarantees, its mtp-only recipe, the image and the GPUs it serves."""
    lines = [f"# {plan.profile}: {plan.summary}", f"# mode {plan.mode}; verl {target} entry point: {entry}"]
    if plan.choose_when:
        lines.append(f"# choose it when: {plan.choose_when}")
    lines += [f"# guarantees: {text.strip()}" for text in guarantees]
    lines += [f"# {line}" for line in (recipe.lines() if recipe is not None else ())]
    lines.append(f"# image: {image}")
    if plan.cuda_archs:  # issue 49: the GPUs it serves, which its preflight holds a node to
        lines.append(
            f"# GPUs: {served(plan.cuda_archs)}: what its compiled extensions carry code for "
            "(builds.cuda_archs); the preflight refuses any other GPU"
        )
    return "\n".join(lines)


def cmd_main(args):
    """The main job: an exit status, or the pipeline's JobResult when it ran to the end."""
    m = load_for(args)
    name = args.profile or DEFAULT_PROFILE
    plan = plan_for(m, name, args.sets, **substitutions_of(args))
    if args.dry_run and getattr(args, "frozen", None):
        lockfile.check_frozen(m, plan)  # what the build would stop on, a dry run stops on too

    results = rules.evaluate(plan, locked_probes(m, plan), "lock", rules.facts_for(m.root))
    if args.json:
        print(
            json.dumps(
                {
                    "plan": plan.to_dict(),
                    "image": image_of(plan, m.root),
                    "digest": plan.digest,
                    "rules": [r.to_dict() for r in results],
                    "ok": not rules.errors(results),
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        if not args.dry_run and not rules.errors(results):
            # deferred: import cost: the main job's options load only for the main job
            from mtpimage.commands.mainjob import main_job

            # a build that cannot start says so in one line, not after 65 lines of plan; a lock
            # that drifted is the first thing it stops on (its warning comes with the run)
            job = main_job(args, m, plan)
            check_frozen(job, warn=lambda _msg: None)
            base_first(plan, image_of(plan, m.root), getattr(args, "registry", None), job.build, m.root)
        print_plan(plan, results, image_of(plan, m.root), args.verbose)
    if rules.errors(results):
        return EXIT_RULES
    if args.dry_run:
        return 0
    # deferred: import cost: the main job's options load only for the main job
    from mtpimage.commands.mainjob import main_job

    return run(main_job(args, m, plan))


COMMANDS = {"list": cmd_list, "check": cmd_check, "explain": cmd_explain}


def main(argv: list[str] | None = None) -> int:
    return invoke(argv)[0]


def invoke(argv: list[str] | None = None) -> tuple[int, object]:
    """(exit status, the main job's pipeline.JobResult or None): main() for callers that act
    on what the job did (build.py remembers a local run for its fast path)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "func", None) or COMMANDS.get(args.command, cmd_main)
    try:
        with _terminate_as_interrupt():
            out = handler(args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return (out, None) if isinstance(out, int) else (out.exit_code, out)
    except BrokenPipeError as exc:
        if stdout_reader_gone():
            return quiet_exit_for_gone_reader(), None
        return _internal_error(exc), None  # a socket or a subprocess's pipe, not our reader
    except BuilderError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code, None
    except Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM, None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130, None
    except Exception as exc:
        return _internal_error(exc), None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cancelled CI job, `kill`): unwinds like Ctrl-C, so every cleanup runs (the
    running build ended, its temp directories and throwaway builder removed, no tag moved)."""


@contextmanager
def _terminate_as_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated()

    before = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _internal_error(exc: Exception) -> int:
    """Never a traceback for users; MTP_DEBUG=1 shows it."""
    if settings.current().debug:
        raise exc

    print(
        redact(f"internal error: {type(exc).__name__}: {exc} (rerun with MTP_DEBUG=1 and report it)"),
        file=sys.stderr,
    )
    return 70
