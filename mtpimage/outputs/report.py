"""Human-readable output for check and dry-run (JSON output lives in cli.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mtpimage.ext.extensions import origin
from mtpimage.plan import rules
from mtpimage.plan.model import Plan


def summary_text(plan: Plan) -> str:
    """A profile's summary with `[experimental]` when it is, said once: a summary that already
    starts with "experimental" (mtp-rollout's) gets no second mark."""
    if not plan.experimental or plan.summary.lower().startswith("experimental"):
        return plan.summary
    return f"{plan.summary} [experimental]"


def _rule_lines(results: list[rules.RuleResult], verbose: bool = True) -> list[str]:
    """Errors whole (they are the answer); a warning in one line unless `verbose` (its
    rule's message and fix then follow, as an UNKNOWN's always do: it says how to decide it)."""
    lines = []
    for r in rules.errors(results):
        lines.append(f"  ERROR {r.rule.id}: {r.detail}. {r.rule.message}\n        fix: {r.rule.fix}")
    for r in rules.warnings(results):
        if r.status != rules.UNKNOWN and not verbose:
            lines.append(f"  WARNING {r.rule.id}: {r.detail or r.rule.message}")
            continue
        label = "UNKNOWN" if r.status == rules.UNKNOWN else "WARNING"
        lines.append(f"  {label} {r.rule.id}: {r.detail}. {r.rule.message}\n        fix: {r.rule.fix}")
    return lines


@dataclass(frozen=True)
class Departure:
    """One declared departure from upstream's declarations: `short` names it (what a person
    scans for), `full` adds why and the link (what a reviewer reads: --verbose, explain --why)."""

    short: str
    full: str

    def line(self, verbose: bool) -> str:
        return self.full if verbose else self.short


def departures(plan: Plan) -> list[Departure]:
    """Where the image departs from upstream's declarations (components.yaml `resolution`),
    and what a local build substituted: shown by check, explain, --dry-run and diff."""
    out = [
        Departure(f"  override {req}", f"  override {req}: {why} ({link})")
        for req, why, link in plan.resolution_overrides
    ]
    out += [
        Departure(f"  exclude  {name}", f"  exclude  {name}: {why} ({link})")
        for name, why, link in plan.excludes
    ]
    out += [Departure(f"  sdist    {name}", f"  sdist    {name}: {why}") for name, why in plan.sdists]
    out += [
        Departure(
            f"  no-deps  {c.package}", f"  no-deps  {c.package}: installed without its declared dependencies"
        )
        for c in plan.components
        if not c.deps_declared
    ]
    # a substitution is this run's own choice, short already: whole in both forms
    out += [
        Departure(f"  SUBSTITUTED {what}: {detail}", f"  SUBSTITUTED {what}: {detail}")
        for what, detail in plan.substitutions
    ]
    links = dict(plan.route_links)
    out += [
        Departure(
            f"  route    {package}: {choice.split(': ', 1)[0]}",  # the choice's lead: its version
            f"  route    {package}: {choice}: {why}" + (f" ({links[package]})" if package in links else ""),
        )
        for package, choice, why in plan.routes
    ]
    return out


def resolution_lines(plan: Plan, verbose: bool = True) -> list[str]:
    """departures(plan) as lines, short or with why and link."""
    return [d.line(verbose) for d in departures(plan)]


def _resolution_block(header: str, lines: list[str], more: str | None) -> list[str]:
    hint = f"; {more} shows why" if more else ""
    return [f"{header} ({len(lines)} declared departures from upstream's declarations{hint}):"] + [
        f"  {line}" for line in lines
    ]


def shared_resolution(plans: list[Plan], verbose: bool = True, more: str = "--verbose") -> list[str]:
    """The resolution blocks of several profiles, each line once: a block for the lines every
    profile has, then one per set of profiles that alone have a line (named). Grouped by the
    full departure, so two that differ only in their why are not merged in the short form."""
    per_plan = {plan.profile: departures(plan) for plan in plans}
    holders: dict[Departure, list[str]] = {}  # departure -> the profiles that have it, first seen first
    for name, deps in per_plan.items():
        for d in deps:
            holders.setdefault(d, []).append(name)
    groups: dict[tuple[str, ...], list[str]] = {}
    for d, names in holders.items():
        groups.setdefault(tuple(names), []).append(d.line(verbose))
    out = []
    everyone = tuple(per_plan)
    hint = None if verbose else more
    if everyone in groups:
        out += _resolution_block(f"resolution, all {len(everyone)} profiles", groups.pop(everyone), hint)
    for names, lines in groups.items():
        out += _resolution_block(f"resolution, only {', '.join(names)}", lines, hint)
    return out


def print_checks(reports: list[tuple[Plan, list[rules.RuleResult]]], verbose: bool = True) -> None:
    """check over several profiles: each one's verdict and rules, then the resolution once
    (it is mostly the catalogue's, the same five lines in every profile)."""
    if len(reports) == 1:
        print_check(*reports[0], verbose=verbose)
        return
    for plan, results in reports:
        print_check(plan, results, resolution=False, verbose=verbose)
    for line in shared_resolution([plan for plan, _ in reports], verbose):
        print(line)


def engine_text(engine: dict) -> str:
    """`name=megatron bridge=... recompute.granularity=full`: nested settings dotted, None as
    none, the engine's name first."""

    def flat(prefix: str, value) -> list[str]:
        if isinstance(value, dict):
            return [item for k, v in value.items() for item in flat(f"{prefix}.{k}", v)] or [f"{prefix}={{}}"]
        return [f"{prefix}={'none' if value is None else value}"]

    keys = sorted(engine, key=lambda k: k != "name")
    return " ".join(item for k in keys for item in flat(k, engine[k]))


def print_check(
    plan: Plan, results: list[rules.RuleResult], resolution: bool = True, verbose: bool = True
) -> None:
    errs = rules.errors(results)
    passed = sum(r.status == rules.PASS for r in results)
    na = sum(r.status == rules.NA for r in results)
    unknown = sum(r.status == rules.UNKNOWN for r in results)
    # an UNKNOWN is a rule nobody decided, not a warning: counted apart, and no "ok" over it
    warned = len(rules.warnings(results)) - unknown
    state = "FAILED" if errs else ("not decided" if unknown else "ok")
    print(
        f"{plan.profile}: {state} ({passed} passed, {na} not applicable, "
        f"{len(errs)} errors, {warned} warnings{f', {unknown} unknown' if unknown else ''})"
    )
    for line in _rule_lines(results, verbose):
        print(line)
    res = resolution_lines(plan, verbose) if resolution else []
    if res:
        hint = "" if verbose else "; --verbose shows why"
        print(f"  resolution ({len(res)} declared departures from upstream's declarations{hint}):")
        for line in res:
            print(f"  {line}")


def package_origin(p) -> str:
    """Where a package comes from: its index, or the pinned source the tool compiles it from
    (apex from git, flash-attn and the TE torch extension from sdists): never `[pypi]` for those."""
    if p.build is None:
        return p.index

    kind = "git" if p.build.source == "git" else "sdist"
    ref = f" ({p.build.ref})" if kind == "git" and p.build.ref else ""
    return f"built here from {kind} {origin(p)}{ref}"


def print_plan(plan: Plan, results: list[rules.RuleResult], image: str, verbose: bool = True) -> None:
    print(f"profile   {plan.profile}: {summary_text(plan)}")
    print(f"mode      {plan.mode}   targets {', '.join(plan.targets)}")
    print(f"engine    {engine_text(plan.training_engine_dict())}")
    print(f"image     {image}")
    print(f"base      {plan.base_image}   python {plan.python}   cuda {plan.cuda}")
    # one name column for both tables, as wide as the longest name (transformer-engine-torch)
    width = max(len(n) for n in [c.name for c in plan.components] + [p.name for p in plan.packages]) + 1
    print("components")
    for c in plan.components:
        pin = f"{c.repo}@{c.commit} ({c.ref})" if c.source == "git" else f"{c.package}=={c.version} (PyPI)"
        patches = "".join(f"\n  {'':<{width}}+ patch {p.describe()}" for p in c.patches)
        print(f"  {c.name:<{width}}{pin}{patches}")
    print("packages")
    for p in plan.packages:
        print(f"  {p.name:<{width}}{p.requirement}  [{package_origin(p)}]")
    print("layers (base first)")
    for i, layer in enumerate(plan.layers):
        print(f"  {i:>2} {layer.name:<11}{' '.join(layer.items)}")
    for target in plan.targets:
        print(f"verl {target} overrides")
        for line in plan.verl_cli_overrides_for(target):
            print(f"  {line}")
    print_check(plan, results, verbose=verbose)
