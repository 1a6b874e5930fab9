"""How "the MTP loss acts on MTP parameters only" is configured on the pinned stack.

A mode whose MtpConfig sets detach_encoder=True (mtp-only, rollout) promises that the MTP loss
reaches MTP parameters only. On megatron-core 0.19.1 + verl 7bc80c00 upstream's switch does
not keep that promise as written: verl's detach leaves the output layer in the MTP loss's reach,
and with Megatron's mtp_detach_heads added it stops MTP training under full recompute
(docs/mtp-only.md). The recipes that do keep it, and what each needs of the pins, are data:
verl.yaml `mtp_only_recipes`. This module decides, from the facts about the pinned commits
(rules.yaml `facts`, with a site's manifests/facts.yaml merged in), which recipe a plan takes:
the first whose needs all hold. A need the known facts cannot decide counts as not met here
(the recipe is passed over, never assumed); the rule `mtp-only-exact` then says so, and a
source probe (`check --probe-sources`, `lock`) decides it from the code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

from packaging.version import InvalidVersion, Version

from mtpimage.manifests import modes
from mtpimage.plan.facts import tool_facts

MEGATRON = "megatron-lm"
VERL = "verl"


@dataclass(frozen=True)
class TransformerSetting:
    """A Megatron TransformerConfig field set through verl's override_transformer_config."""

    key: str
    value: str
    new_key: bool  # not in verl's struct: Hydra needs `+`


@dataclass(frozen=True)
class Recipe:
    id: str
    detach_encoder: str  # the MtpConfig value the recipe sets ("True" / "False")
    transformer: tuple[TransformerSetting, ...]
    needs: tuple[str, ...]  # facts about the pins (NEEDS) that must hold
    exact: bool  # the MTP loss reaches MTP parameters only, output layer included, recompute or not
    why: str
    loses: str = ""  # what an inexact recipe gives up, in words
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class NeedVerdict:
    need: str
    met: bool | None  # None: the known facts cannot tell (a source probe can)
    detail: str


@dataclass(frozen=True)
class Choice:
    """The recipe taken, and each better recipe passed over with the need that did not hold."""

    recipe: Recipe
    passed_over: tuple[tuple[Recipe, NeedVerdict], ...] = ()

    @property
    def undecided(self) -> tuple[NeedVerdict, ...]:
        return tuple(v for _, v in self.passed_over if v.met is None)


def _flat(text: str) -> str:
    return " ".join(str(text).split())


@cache
def recipes() -> tuple[Recipe, ...]:
    return tuple(
        Recipe(
            id=r["id"],
            detach_encoder=str(r["detach_encoder"]),
            transformer=tuple(
                TransformerSetting(t["key"], str(t["value"]), bool(t.get("new_key")))
                for t in r["transformer"]
            ),
            needs=tuple(r["needs"]),
            exact=bool(r["exact"]),
            why=_flat(r["why"]),
            loses=_flat(r.get("loses", "")),
            links=tuple(r.get("links", ())),
        )
        for r in modes.verl_facts()["mtp_only_recipes"]
    )


def guarantee() -> str:
    """What an exact recipe promises (explain's `# guarantees:`)."""
    return _flat(modes.verl_facts()["mtp_only_guarantee"])


def applies(mode: str) -> bool:
    """The mode trains MTP with upstream's detach (mtp-only semantics)."""
    m = modes.get(mode)
    return m.trains_mtp and dict(m.mtp_config).get("detach_encoder") == "True"


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _component(components: Iterable, name: str):
    return next((c for c in components if c.name == name), None)


def megatron_detach_heads(components: Iterable, f: dict) -> NeedVerdict:
    """Megatron-LM has TransformerConfig.mtp_detach_heads and the checkpoint guard in
    MultiTokenPredictionLayer._get_embeddings (Megatron-LM#3456)."""
    need = "megatron-detach-heads"
    mc = _component(components, MEGATRON)
    since = f["megatron"]["detach_heads_from"]
    if mc is None:
        return NeedVerdict(need, False, "no megatron-lm in the stack")
    if mc.source == "git":
        known = (f["megatron"].get("detach_heads_commits") or {}).get(mc.commit)
        if known is None:
            return NeedVerdict(
                need,
                None,
                f"megatron-lm {mc.commit[:10]} is in no known list: whether it contains "
                f"{since['commit'][:8]} (mtp_detach_heads and its checkpoint guard) is unknown",
            )
        ref = (f["megatron"]["commits"].get(mc.commit) or {}).get("ref", "")
        return NeedVerdict(
            need,
            bool(known),
            f"megatron-lm {mc.commit[:10]} ({ref}) "
            + ("has" if known else "lacks")
            + f" mtp_detach_heads with its checkpoint guard ({since['link']})",
        )
    v = _version(mc.version)
    if v is None:
        return NeedVerdict(need, None, f"megatron-core version {mc.version!r} not understood")
    met = Version(v.base_version) >= Version(since["pypi_from"])
    return NeedVerdict(
        need,
        met,
        f"megatron-core {v} {'has' if met else 'lacks'} mtp_detach_heads with its checkpoint guard "
        f"(first in {since['pypi_from']})",
    )


def verl_detach_guard(components: Iterable, f: dict) -> NeedVerdict:
    """verl's detach_encoder copy of _get_embeddings keeps Megatron's checkpoint guard."""
    need = "verl-detach-guard"
    vc = _component(components, VERL)
    facts_v = f["verl"]["detach_guard"]
    if vc is None:
        return NeedVerdict(need, False, "no verl in the stack")
    pin = vc.commit if vc.source == "git" else vc.version
    known = (facts_v["commits"] or {}).get(pin)
    shown = f"verl {pin[:10]}" if vc.source == "git" else f"verl {pin}"
    if known is None:
        return NeedVerdict(
            need,
            None,
            f"{shown} is in no known list: whether its detach keeps the checkpoint guard is unknown",
        )
    return NeedVerdict(
        need,
        bool(known),
        f"{shown}'s _patched_get_embeddings_for_detach "
        + ("keeps" if known else "lacks")
        + f" Megatron's checkpoint guard ({facts_v['link']})",
    )


NEEDS: dict[str, Callable[[Iterable, dict], NeedVerdict]] = {
    "megatron-detach-heads": megatron_detach_heads,
    "verl-detach-guard": verl_detach_guard,
}


def choose(mode: str, components: Iterable, f: dict | None = None) -> Choice | None:
    """The recipe a plan of `mode` takes on these components; None where the mode has no
    mtp-only semantics. A need the facts cannot decide passes the recipe over."""
    if not applies(mode):
        return None
    f = f if f is not None else tool_facts()
    components = tuple(components)
    passed = []
    for recipe in recipes():
        failed = next(
            (v for v in (NEEDS[n](components, f) for n in recipe.needs) if v.met is not True),
            None,
        )
        if failed is None:
            return Choice(recipe, tuple(passed))
        passed.append((recipe, failed))
    raise ValueError("verl.yaml mtp_only_recipes: the last recipe must need nothing")  # schema-held


def by_id(recipe_id: str) -> Recipe:
    return next(r for r in recipes() if r.id == recipe_id)


@dataclass(frozen=True)
class RecipeReport:
    """What `explain` says of the recipe a plan takes: its settings, why, links, and each better
    recipe passed over with the need that did not hold."""

    recipe: Recipe
    passed_over: tuple[tuple[Recipe, NeedVerdict], ...]

    def settings(self) -> list[str]:
        return [f"detach_encoder={self.recipe.detach_encoder}"] + [
            f"{'+' if t.new_key else ''}{t.key}={t.value}" for t in self.recipe.transformer
        ]

    def lines(self) -> list[str]:
        r = self.recipe
        out = [
            f"mtp-only recipe {r.id} ({'exact' if r.exact else 'NOT exact'}): {', '.join(self.settings())}: "
            f"{r.why}" + (f" ({' '.join(r.links)})" if r.links else "")
        ]
        out += [
            f"mtp-only recipe {skipped.id} not taken: {why.detail}"
            + (" (not decided: `check --probe-sources` reads the source)" if why.met is None else "")
            for skipped, why in self.passed_over
        ]
        return out

    def to_dict(self) -> dict:
        r = self.recipe
        return {
            "id": r.id,
            "exact": r.exact,
            "settings": self.settings(),
            "why": r.why,
            "loses": r.loses,
            "links": list(r.links),
            "passed_over": [
                {"id": s.id, "need": v.need, "met": v.met, "detail": v.detail} for s, v in self.passed_over
            ],
        }


def report(mode: str, components: Iterable, f: dict | None = None) -> RecipeReport | None:
    choice = choose(mode, components, f)
    return None if choice is None else RecipeReport(choice.recipe, choice.passed_over)
