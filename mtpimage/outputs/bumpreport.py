"""The report of a bump (`build.py bump`), in Markdown ready for a pull request: what moved
(refs, commits, versions), the resolution diff at the lock's cutoff, each patch and each rule
and probe with its verdict per profile, the overrides whose recorded declaration belongs to
what moved (to review), and which image layers rebuild for which profile.

Built from what the lock run already computed (locker.LockOutcome): the plans before and
after, lock.yaml before and as the run made it, the rules' results. Nothing is re-checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpimage.lock import lockfile
from mtpimage.manifests.patches import describe
from mtpimage.plan import rules
from mtpimage.plan.model import Plan


@dataclass(frozen=True)
class LayerChange:
    profile: str
    rebuilt: tuple[str, ...]  # layers that rebuild (the first changed one and every later one)
    kept: tuple[str, ...]  # layers the build cache keeps
    why: tuple[str, ...]  # what changed in the first rebuilt layer


def layer_changes(
    old: list[Plan], new: list[Plan], old_lock: dict | None, new_lock: dict | None
) -> list[LayerChange]:
    """Per profile, the first layer whose inputs changed (a component's pin or patches, a
    package's pin, a resolved version in that layer): it and every later layer rebuild (each
    layer is built on the one before it), the earlier ones come from the cache."""
    before = {p.profile: p for p in old}
    out = []
    for plan in new:
        prev = before.get(plan.profile)
        changed: dict[str, list[str]] = {}
        if prev is None:
            out.append(
                LayerChange(plan.profile, tuple(lay.name for lay in plan.layers), (), ("a new profile",))
            )
            continue
        for c in plan.components:
            o = prev.component(c.name)
            if o is None or _pin(o) != _pin(c):
                changed.setdefault(_layer_of(plan, c.name), []).append(c.name)
        for p in plan.packages:
            o = prev.package(p.name)
            if o is None or lockfile.package_pin(o) != lockfile.package_pin(p):
                changed.setdefault(_layer_of(plan, p.name), []).append(p.name)
        a, b = _resolved(old_lock, plan.profile), _resolved(new_lock, plan.profile)
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                layer = (b.get(name) or a.get(name))[1]
                changed.setdefault(layer, []).append(f"{name} {_v(a.get(name))} -> {_v(b.get(name))}")
        names = [lay.name for lay in plan.layers]
        first = next((i for i, n in enumerate(names) if n in changed), None)
        if first is None:
            out.append(LayerChange(plan.profile, (), tuple(names), ()))
        else:
            out.append(
                LayerChange(
                    plan.profile, tuple(names[first:]), tuple(names[:first]), tuple(changed[names[first]])
                )
            )
    return out


def _pin(c) -> dict:
    return {**lockfile.component_pin(c), "patches": [lockfile.patch_pin(p) for p in c.patches]}


def _layer_of(plan: Plan, item: str) -> str:
    return next((lay.name for lay in plan.layers if item in lay.items), "")


def _resolved(lock: dict | None, profile: str) -> dict[str, tuple[str, str]]:
    key = (((lock or {}).get("profiles") or {}).get(profile) or {}).get("python_set")
    pkgs = (((lock or {}).get("python_sets") or {}).get(key) or {}).get("packages") or {}
    return {n: (str(e.get("version")), str(e.get("layer", ""))) for n, e in pkgs.items()}


def _v(entry) -> str:
    return entry[0] if entry else "(none)"


def overrides_to_review(catalogue: dict, moved: dict[str, str]) -> list[str]:
    """The resolution overrides (components.yaml `resolution.overrides`) that record replacing
    a declaration of something that moved (`moved`: name -> package): that declaration may
    have changed with the new pin, and the override still covers it without a word."""
    names = {n.lower() for pair in moved.items() for n in pair}
    out = []
    for o in (catalogue.get("resolution") or {}).get("overrides") or []:
        for record in o.get("overrides") or []:
            who = str(record).split(" ", 1)[0].split(":", 1)[0].lower()
            if who in names:
                out.append(
                    f"`{o['requirement']}` overrides `{record}`: {who} moved; check what it declares "
                    "now and update the record (or drop the override)"
                )
    return out


def markdown(target: str, outcome, old_plans: list[Plan], status: str, override_lines: list[str]) -> str:
    """The report. status: "passed" (both files written), "dry run" or "failed"."""
    lines = [f"# Bump {target}", ""]
    written = ", ".join(f"`{f}`" for f in outcome.files) or "nothing"
    if status == "failed":
        lines += ["**Failed: nothing written** (every file byte-identical). The reason:", ""]
        lines += [f"- {f}" for f in outcome.failures] + [""]
    elif status == "dry run":
        lines += ["**Dry run: every check passed; nothing written.**", ""]
    else:
        lines += [f"**Passed: every check passed; written: {written}.**", ""]
    lines += ["## What moved", ""]
    if outcome.moves:
        lines += ["| pin | ref | commit | version |", "|---|---|---|---|"]
        for mv in outcome.moves:
            ref = mv.ref[1] if mv.ref[0] == mv.ref[1] else f"{mv.ref[0]} -> {mv.ref[1]}"
            commit = f"`{mv.commit[0][:12]}` -> `{mv.commit[1][:12]}`" if mv.commit[1] else "-"
            version = (
                mv.version[0] if mv.version[0] == mv.version[1] else f"{mv.version[0]} -> {mv.version[1]}"
            )
            kind = "" if mv.kind == "component" else " (package built from git)"
            lines.append(f"| {mv.name}{kind} | {ref or '-'} | {commit} | {version or '-'} |")
    else:
        lines.append("Nothing: the pin is already where its ref points.")
    lines += ["", f"## Resolution at the lock's cutoff ({outcome.cutoff})", ""]
    if outcome.changes:
        lines += [f"- {c}" for c in outcome.changes]
    else:
        lines.append("No resolved version changed.")
    lines += ["", "## Patches", ""]
    patches = [
        (name, p)
        for name, e in sorted(((outcome.doc or {}).get("components") or {}).items())
        for p in e.get("patches") or []
    ]
    if patches:
        lines += ["| component | patch | applies | checked with |", "|---|---|---|---|"]
        for name, p in patches:
            verdict = {True: "yes", False: f"**no**: {p.get('error', '')}", None: "not checked"}[
                p.get("applies")
            ]
            lines.append(
                f"| {name} | {describe(p)} | {verdict} | {p.get('checked_with', p.get('reason', ''))} |"
            )
    else:
        lines.append("No patches.")
    lines += ["", "## Rules and probes", ""]
    profiles = sorted(outcome.results)
    if profiles:
        lines += ["| rule | " + " | ".join(profiles) + " |", "|---" * (len(profiles) + 1) + "|"]
        ids = [r.rule.id for r in outcome.results[profiles[0]]]
        by = {p: {r.rule.id: r for r in outcome.results[p]} for p in profiles}
        for rid in ids:
            cells = []
            for p in profiles:
                r = by[p].get(rid)
                cells.append("-" if r is None else f"{_mark(r)}{' (probe)' if r.source == 'probe' else ''}")
            lines.append(f"| {rid} | " + " | ".join(cells) + " |")
        notes = sorted(
            {
                f"- {p}: {r.rule.id}: {_mark(r).strip('*')}: {r.detail}"
                for p in profiles
                for r in outcome.results[p]
                if r.status in (rules.FAIL, rules.UNKNOWN)
            }
        )
        if notes:
            lines += ["", *notes]
    lines += ["", "## Overrides to review", ""]
    lines += [f"- {o}" for o in override_lines] or [
        "None of the resolution's overrides replaces a declaration of what moved."
    ]
    lines += ["", "## Image layers that rebuild", ""]
    changes = layer_changes(old_plans, outcome.plans, outcome.previous, outcome.doc)
    lines += ["| profile | rebuilds | kept from cache | first change |", "|---|---|---|---|"]
    for lc in changes:
        lines.append(
            f"| {lc.profile} | {', '.join(lc.rebuilt) or 'nothing'} | {', '.join(lc.kept) or '-'} | "
            f"{'; '.join(lc.why) or '-'} |"
        )
    lines.append("")
    return "\n".join(lines)


def _mark(r) -> str:
    """A verdict as the table shows it: an error rule that fails stops the build (FAIL); a
    warning rule that fails is a warning (it is what the profile chose, e.g. mode full)."""
    if r.status == rules.FAIL:
        return "**FAIL**" if r.rule.severity == "error" else "warning"
    return {rules.PASS: "pass", rules.UNKNOWN: "unknown", rules.NA: "n/a"}.get(r.status, r.status)
