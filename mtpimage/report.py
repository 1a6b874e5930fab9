"""Human-readable output for check and dry-run (JSON output lives in cli.py)."""

from __future__ import annotations

from . import rules
from .plan import Plan


def _rule_lines(results: list[rules.RuleResult]) -> list[str]:
    lines = []
    for r in rules.errors(results):
        lines.append(f"  ERROR {r.rule.id}: {r.detail}. {r.rule.message}\n        fix: {r.rule.fix}")
    for r in rules.warnings(results):
        label = "UNKNOWN" if r.status == rules.UNKNOWN else "WARNING"
        lines.append(f"  {label} {r.rule.id}: {r.detail}. {r.rule.message}\n        fix: {r.rule.fix}")
    return lines


def resolution_lines(plan: Plan) -> list[str]:
    """Where the image departs from upstream's declarations (components.yaml `resolution`),
    and what a local build substituted: shown by check, explain, --dry-run and diff."""
    lines = [f"  override {req}: {why} ({link})" for req, why, link in plan.overrides]
    lines += [f"  exclude  {name}: {why} ({link})" for name, why, link in plan.excludes]
    lines += [f"  sdist    {name}: {why}" for name, why in plan.sdists]
    lines += [
        f"  no-deps  {c.package}: installed without its declared dependencies"
        for c in plan.components
        if not c.deps_declared
    ]
    lines += [f"  SUBSTITUTED {what}: {detail}" for what, detail in plan.substitutions]
    return lines


def print_check(plan: Plan, results: list[rules.RuleResult]) -> None:
    errs = rules.errors(results)
    passed = sum(r.status == rules.PASS for r in results)
    na = sum(r.status == rules.NA for r in results)
    state = "FAILED" if errs else "ok"
    print(
        f"{plan.profile}: {state} ({passed} passed, {na} not applicable, "
        f"{len(errs)} errors, {len(rules.warnings(results))} warnings)"
    )
    for line in _rule_lines(results):
        print(line)
    res = resolution_lines(plan)
    if res:
        print(f"  resolution ({len(res)} declared departures from upstream's declarations):")
        for line in res:
            print(f"  {line}")


def print_plan(plan: Plan, results: list[rules.RuleResult], image: str) -> None:
    print(f"profile   {plan.profile}{' [experimental]' if plan.experimental else ''}: {plan.summary}")
    print(f"mode      {plan.mode}   targets {', '.join(plan.targets)}   engine {plan.engine_dict()}")
    print(f"image     {image}")
    print(f"base      {plan.base_image}   python {plan.python}   cuda {plan.cuda}")
    print("components")
    for c in plan.components:
        pin = f"{c.repo}@{c.commit} ({c.ref})" if c.source == "git" else f"{c.package}=={c.version} (PyPI)"
        patches = "".join(f"\n              + patch {p.describe()}" for p in c.patches)
        print(f"  {c.name:<16}{pin}{patches}")
    print("packages")
    for p in plan.packages:
        print(f"  {p.name:<19}{p.requirement}  [{p.index}]")
    print("layers (base first)")
    for i, layer in enumerate(plan.layers):
        print(f"  {i:>2} {layer.name:<11}{' '.join(layer.items)}")
    for target in plan.targets:
        print(f"verl {target} overrides")
        for line in plan.overrides_for(target):
            print(f"  {line}")
    print_check(plan, results)
