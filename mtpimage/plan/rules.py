"""Compatibility rules: data (mtpimage/data/rules.yaml) plus small predicates.

A predicate looks at the Plan and the facts and returns a Verdict:
  fail     the combination is known to break (error rules stop the build)
  pass     known good
  n/a      the rule does not apply to this plan
  unknown  it applies, but the known-commit lists cannot decide; a source probe
           (`check --probe-sources`, the lock) can. Reported, never silently passed.
A probe's verdict, when given, overrides the known-commit lists.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.utils import canonicalize_name as canonical
from packaging.version import InvalidVersion, Version

from mtpimage import invocation
from mtpimage.manifests import modes, schema, sitefacts
from mtpimage.plan import mtponly, platforms
from mtpimage.plan.facts import rules_data
from mtpimage.plan.model import COMPONENTS, Plan

PASS, FAIL, NA, UNKNOWN = "pass", "fail", "n/a", "unknown"


@dataclass(frozen=True)
class Verdict:
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    predicate: str
    message: str
    fix: str


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    status: str
    detail: str
    source: str  # "known-pins" | "probe" | "manifest"

    @property
    def violated(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict:
        return {
            "id": self.rule.id,
            "severity": self.rule.severity,
            "status": self.status,
            "detail": self.detail,
            "message": self.rule.message,
            "fix": self.rule.fix,
            "evidence": self.source,
        }


def _data() -> dict:
    return rules_data()


def facts() -> dict:
    return _data()["facts"]


def facts_for(manifests_root) -> dict:
    """The tool's facts with the site's (manifests/facts.yaml, sitefacts.py) merged in."""
    return sitefacts.load(manifests_root, facts()).facts


def rules() -> list[Rule]:
    return [
        Rule(
            r["id"], r["severity"], r["predicate"], " ".join(r["message"].split()), " ".join(r["fix"].split())
        )
        for r in _data()["rules"]
    ]


PREDICATES: dict[str, Callable[[Plan, dict], Verdict]] = {}


def predicate(fn: Callable[[Plan, dict], Verdict]) -> Callable[[Plan, dict], Verdict]:
    PREDICATES[fn.__name__] = fn
    return fn


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _base(v: Version) -> Version:
    """0.19.0rc1 / 2.11.0+cu130 -> the release it belongs to, for range checks."""
    return Version(v.base_version)


def megatron_version(plan: Plan, f: dict) -> Version | None:
    mc = plan.component("megatron-lm")
    if mc is None:
        return None
    if mc.source == "git" and mc.commit in f["megatron"]["commits"]:
        known = f["megatron"]["commits"][mc.commit].get("version")
        if known:
            return _version(str(known))
    return _version(mc.version)


def _trains_mtp(plan: Plan, f: dict) -> bool:
    return modes.get(plan.mode).trains_mtp


@predicate
def recompute_padding_mask(plan: Plan, f: dict) -> Verdict:
    rc = plan.recompute
    if not rc or rc.get("granularity") != "full":
        return Verdict(NA, "no full activation recompute")
    if not _trains_mtp(plan, f):
        return Verdict(NA, f"mode {plan.mode} does not train MTP")
    mc = plan.component("megatron-lm")
    if mc is None:
        return Verdict(UNKNOWN, "no megatron-lm component in the stack")
    facts_m = f["megatron"]
    if mc.source == "git":
        known = facts_m["commits"].get(mc.commit)
        if known is not None:
            status = FAIL if known["padding_mask_bug"] else PASS
            return Verdict(
                status,
                f"megatron-lm {mc.commit[:10]} ({known['ref']})"
                + (" lacks the fix" if status == FAIL else " is known good"),
            )
        return Verdict(
            UNKNOWN,
            f"megatron-lm {mc.commit[:10]} is in no known list; "
            "run `check --probe-sources` to inspect its source",
        )
    v = _version(mc.version)
    if v is None:
        return Verdict(UNKNOWN, f"megatron-core version {mc.version!r} not understood")
    if str(v) in facts_m["pypi_bad_versions"]:
        return Verdict(FAIL, f"megatron-core {v} lacks the fix")
    if _base(v) >= Version(facts_m["pypi_fixed_from"]):
        return Verdict(PASS, f"megatron-core {v} has the fix")
    if _base(v) < Version(facts_m["pypi_good_before"]):
        return Verdict(PASS, f"megatron-core {v} predates the padding_mask keyword")
    return Verdict(UNKNOWN, f"megatron-core {v} is in no known list")


@predicate
def mtp_needs_megatron_engine(plan: Plan, f: dict) -> Verdict:
    name = plan.training_engine_dict()["name"]
    if name != "megatron":
        return Verdict(FAIL, f"engine is {name}")
    return Verdict(PASS, "engine is megatron")


@predicate
def sglang_rollout_fix(plan: Plan, f: dict) -> Verdict:
    if not modes.get(plan.mode).rollout:
        return Verdict(NA, "MTP rollout not enabled")
    if plan.rollout_engine != "sglang":
        return Verdict(NA, f"rollout engine is {plan.rollout_engine}")
    sg = plan.component("sglang")
    if sg is None:
        return Verdict(FAIL, "no sglang component in the stack")
    fs = f["sglang"]
    v = _version(sg.version)
    if v is not None and _base(v) < Version(fs["min_version"]):
        return Verdict(FAIL, f"sglang {v} < {fs['min_version']}")
    if fs["fix_patch_provides"] in sg.provides():
        return Verdict(PASS, "the IPC-unwrap fix is applied as a patch")
    if sg.source == "git" and sg.commit in fs["fixed_commits"]:
        return Verdict(PASS, f"sglang {sg.commit[:10]} ({fs['fixed_commits'][sg.commit]})")
    if sg.source == "git":
        return Verdict(UNKNOWN, f"sglang {sg.commit[:10]} is in no known list; run `check --probe-sources`")
    return Verdict(FAIL, f"sglang {sg.version} from PyPI without the fix patch")


@predicate
def patches_apply(plan: Plan, f: dict) -> Verdict:
    """Offline, from the known facts alone: each patch's sha256 and where it is known to fit.
    lock.yaml's record (evidence: lock) and --probe-sources (applied) decide over this."""
    fits = f.get("patches") or {}
    fail, unknown, ok = [], [], []
    for c in plan.components:
        pinned = c.version if c.source == "pypi" else c.commit
        shown = c.pinned_artifact()
        for p in c.patches:
            known = fits.get(p.sha256)
            if known is None:
                unknown.append(f"{c.name}: patch sha256 {p.sha256[:12]} on {shown} is in no known list")
            elif pinned in [str(v) for v in known["fits"]]:
                ok.append(f"{c.name}: patch {p.sha256[:12]} fits {shown} ({known.get('ref', '')})")
            else:
                fail.append(
                    f"{c.name}: patch {p.sha256[:12]} fits {', '.join(map(str, known['fits']))} only, "
                    f"not {shown} ({known.get('ref', '')})"
                )
    if fail:
        return Verdict(FAIL, "; ".join(fail))
    if unknown:
        return Verdict(
            UNKNOWN,
            "; ".join(unknown) + "; run `lock` or `check --probe-sources` to apply it to the pinned source",
        )
    return Verdict(PASS, "; ".join(ok)) if ok else Verdict(NA, "no component is patched")


@predicate
def mimo_needs_bridge_2387(plan: Plan, f: dict) -> Verdict:
    if "mimo" not in plan.models:
        return Verdict(NA, "no MiMo model in this profile")
    if plan.training_engine_dict().get("bridge") != "megatron-bridge":
        return Verdict(NA, "vanilla mbridge selected")
    br = plan.component("megatron-bridge")
    if br is None:
        return Verdict(FAIL, "no megatron-bridge component in the stack")
    fb = f["megatron_bridge"]
    if br.source == "git":
        if br.commit in fb["commits_with_2387"]:
            return Verdict(PASS, f"megatron-bridge {br.commit[:10]} ({fb['commits_with_2387'][br.commit]})")
        return Verdict(
            UNKNOWN, f"megatron-bridge {br.commit[:10]} is in no known list; run `check --probe-sources`"
        )
    v = _version(br.version)
    if v is not None and _base(v) >= Version(fb["pypi_with_2387_from"]):
        return Verdict(PASS, f"megatron-bridge {v}")
    return Verdict(FAIL, f"megatron-bridge {br.version} predates PR #2387")


@predicate
def mbridge_mcore_017(plan: Plan, f: dict) -> Verdict:
    mb = plan.component("mbridge")
    if mb is None:
        return Verdict(NA, "no mbridge in the stack")
    fm = f["mbridge"]["broken_with_mcore_017"]
    if mb.source == "git":
        broken = mb.commit in fm["commits"]
        what = f"mbridge {mb.commit[:10]}"
        good = f["mbridge"].get("good_commits") or {}
        if mb.commit in good:
            return Verdict(PASS, f"{what} ({good[mb.commit]}) does not use ModelType.encoder_and_decoder")
        if not broken:
            mv = megatron_version(plan, f)
            if mv is not None and _base(mv) < Version(f["mbridge"]["mcore_min_version"]):
                return Verdict(PASS, f"{what} with megatron-core {mv}: ModelType.encoder_and_decoder exists")
            # an unknown commit may use it (d10f3c6b does): only its source can tell
            return Verdict(UNKNOWN, f"{what} is in no known list; `lock` or `check --probe-sources` decides")
    else:
        broken = mb.version in fm["pypi_versions"]
        what = f"PyPI mbridge {mb.version}"
    if not broken:
        return Verdict(PASS, f"{what} is not known to use ModelType.encoder_and_decoder")
    mv = megatron_version(plan, f)
    if mv is None:
        return Verdict(
            UNKNOWN, f"{what} needs megatron-core < 0.17; the pinned Megatron's version is unknown"
        )
    if _base(mv) >= Version(f["mbridge"]["mcore_min_version"]):
        return Verdict(FAIL, f"{what} with megatron-core {mv}")
    return Verdict(PASS, f"{what} with megatron-core {mv} (< 0.17)")


@predicate
def mtp_context_parallel(plan: Plan, f: dict) -> Verdict:
    cp = int(plan.training_engine_dict().get("context_parallel_size") or 1)
    if cp <= 1:
        return Verdict(NA, "no context parallelism")
    if plan.component("megatron-lm") is None:
        return Verdict(NA, "no megatron-lm in the stack")
    mv = megatron_version(plan, f)
    first = Version(f["megatron"]["mtp_cp_from"])
    if mv is None:
        return Verdict(UNKNOWN, f"the pinned Megatron's version is unknown; its source decides (CP {cp})")
    if mv < first:  # a pre-release of 0.14.0 still asserts CP == 1
        return Verdict(
            FAIL, f"megatron-core {mv} with context_parallel_size {cp}: MTP needs CP == 1 before {first}"
        )
    return Verdict(PASS, f"megatron-core {mv} supports MTP with context_parallel_size {cp}")


@predicate
def python_312(plan: Plan, f: dict) -> Verdict:
    want = f["python"]["required"]
    if plan.python != want:
        return Verdict(FAIL, f"platform.python is {plan.python}")
    return Verdict(PASS, f"Python {plan.python}")


def _cuda_tag(version: str) -> str | None:
    m = re.search(r"\+cu(\d+)$", version)
    return m.group(1) if m else None


def _locked_cuda_lines(plan: Plan, f: dict) -> dict[str, str]:
    """The CUDA line (major+minor, "130") of each CUDA runtime distribution the lock resolved:
    what PyPI's torch wheel itself requires (torch 2.11.0: cuda-toolkit==13.0.2; 2.10.0:
    nvidia-cuda-runtime-cu12==12.8.90), read from its metadata by the resolver. Empty when
    the plan carries no lock (then the table pypi_torch_cuda decides)."""
    names = {canonical(n) for n in f.get("cuda_line_packages") or ()}
    out = {}
    for row in plan.locked:
        name, version = canonical(row.name), row.version
        if name in names:
            parts = version.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                out[f"{name}=={version}"] = f"{parts[0]}{parts[1]}"
    return out


def _line(tag: str) -> str:
    return f"{tag[:-1]}.{tag[-1]}"


@predicate
def torch_cuda_match(plan: Plan, f: dict) -> Verdict:
    torch = plan.package("torch")
    if torch is None:
        return Verdict(NA, "torch not pinned in this stack")
    tag = _cuda_tag(torch.version)
    major, minor = plan.cuda.split(".")[:2]
    want = f"{major}{minor}"
    how = f"its +cu{tag} tag"
    if tag is None and torch.index == "pypi" and "+" not in torch.version:
        # PyPI carries one CUDA build per torch release, without a local version tag: its
        # line is what the wheel requires (the lock resolved it), else the known table
        lines = _locked_cuda_lines(plan, f)
        if len(set(lines.values())) > 1:
            return Verdict(
                FAIL,
                "the locked set mixes CUDA lines: "
                + ", ".join(f"{k} (CUDA {_line(v)})" for k, v in sorted(lines.items())),
            )
        if lines:
            [(what, tag)] = list(lines.items())[:1]
            how = f"the locked {what} its wheel requires"
        else:
            tag = (f.get("pypi_torch_cuda") or {}).get(torch.version)
            how = "pypi_torch_cuda in mtpimage/data/rules.yaml"
            if tag is None:
                return Verdict(
                    UNKNOWN,
                    f"torch {torch.version} from PyPI: its CUDA line is read from the wheel's "
                    f"requirements (cuda-toolkit / nvidia-cuda-runtime) once `{invocation.command()} lock` "
                    f'resolved it; or add `{torch.version}: "NNN"` to pypi_torch_cuda in '
                    "mtpimage/data/rules.yaml",
                )
    if tag is None:
        return Verdict(
            FAIL,
            f"torch {torch.version} from index {torch.index} has no +cuXYZ build tag "
            "(a CPU or default build)",
        )
    if tag != want:
        return Verdict(
            FAIL,
            f"torch {torch.version} is built for CUDA {_line(tag)} ({how}), "
            f"the base image has CUDA {plan.cuda}",
        )
    image_tag = plan.base_image.split("@")[0].rsplit(":", 1)[-1]
    if not image_tag.startswith(plan.cuda):
        return Verdict(FAIL, f"base image tag {image_tag} does not match platform.cuda {plan.cuda}")
    return Verdict(PASS, f"torch {torch.version}: CUDA {_line(tag)} ({how}) on CUDA {plan.cuda}")


_EXACT = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")


@predicate
def unpinned_ref(plan: Plan, f: dict) -> Verdict:
    floating = []
    if not plan.base_digest:
        floating.append(f"base image {plan.base_image} has no digest")
    for p in plan.packages:
        if not _EXACT.match(p.version) or "*" in p.version:
            floating.append(f"package {p.name} version {p.version!r} is not exact")
    for c in plan.components:
        if c.source == "git" and not (c.commit and re.fullmatch(r"[0-9a-f]{40}", c.commit)):
            floating.append(f"{c.name} has no 40-hex commit")
        if c.source == "pypi" and not (c.version and _EXACT.match(c.version)):
            floating.append(f"{c.name} has no exact version")
    if floating:
        return Verdict(FAIL, "; ".join(floating))
    return Verdict(PASS, "every input pinned")


@predicate
def hash_pinned(plan: Plan, f: dict) -> Verdict:
    """Every locked row has a sha256, or is compiled here from a source pinned by hash."""
    if not plan.locked:
        return Verdict(
            NA, f"no lock for this plan: `--frozen` builds refuse it; run `{invocation.command()} lock`"
        )
    built = {canonical(p.name) for p in plan.packages if p.build is not None}
    loose = [
        f"{r.name}=={r.version} (index {r.index})"
        for r in plan.locked
        if not r.sha256 and canonical(r.name) not in built
    ]
    unpinned = [
        p.name
        for p in plan.packages
        if p.build is not None and not (p.build.sha256 or (p.build.commit and len(p.build.commit) == 40))
    ]
    if loose or unpinned:
        return Verdict(
            FAIL,
            "; ".join([f"{x}: no sha256" for x in loose] + [f"{x}: source not pinned" for x in unpinned]),
        )
    return Verdict(PASS, f"{len(plan.locked)} locked files by sha256, {len(built)} built from hashed sources")


@predicate
def decided_in_image(plan: Plan, f: dict) -> Verdict:
    """Rules whose evidence is the built image (a GPU run), reported by the image tests."""
    return Verdict(NA, "decided by the in-image GPU check")


@predicate
def sglang_distributed_draft_sync(plan: Plan, f: dict) -> Verdict:
    if not modes.get(plan.mode).rollout or plan.rollout_engine != "sglang":
        return Verdict(NA, "no MTP rollout on sglang")
    sg = plan.component("sglang")
    v = _version(sg.version) if sg is not None else None
    if v is None:
        return Verdict(NA, "the sglang version is not recorded (a git source without `version`)")
    bug = f["sglang"]["distributed_draft_sync_bug"]
    if Version(bug["first"]) <= _base(v) <= Version(bug["last"]):
        return Verdict(
            FAIL,
            f"sglang {v}: update_weights_from_distributed leaves the MTP draft weights stale ({bug['link']})",
        )
    return Verdict(PASS, f"sglang {v} is outside {bug['first']}..{bug['last']}")


@predicate
def mtp_only_recipe(plan: Plan, f: dict) -> Verdict:
    """The known facts chose the plan's recipe; a source probe (probes.py) checks its needs."""
    choice = mtponly.choose(plan.mode, plan.components, f)
    if choice is None:
        return Verdict(NA, f"mode {plan.mode} has no mtp-only semantics")
    if choice.recipe.id != plan.mtp_recipe:
        # the plan was built with other facts (a site's facts.yaml the check does not see)
        return Verdict(
            FAIL,
            f"the plan's overrides follow recipe {plan.mtp_recipe!r}, these facts choose {choice.recipe.id!r}",
        )
    held = [mtponly.NEEDS[n](plan.components, f).detail for n in choice.recipe.needs]
    return Verdict(PASS, f"recipe {choice.recipe.id}: " + ("; ".join(held) if held else "needs nothing"))


@predicate
def mtp_only_exact(plan: Plan, f: dict) -> Verdict:
    choice = mtponly.choose(plan.mode, plan.components, f)
    if choice is None:
        return Verdict(NA, f"mode {plan.mode} has no mtp-only semantics")
    r = choice.recipe
    if r.exact:
        return Verdict(PASS, f"recipe {r.id} keeps it exactly")
    passed = "; ".join(dict.fromkeys(v.detail for _, v in choice.passed_over))
    if choice.undecided:  # a warning all the same: the fallback is what the plan takes
        return Verdict(
            FAIL,
            f"recipe {r.id} taken, NOT exact: {r.loses}; not decided from the known facts: {passed}; "
            "`check --probe-sources` reads the source",
        )
    return Verdict(FAIL, f"recipe {r.id} taken, NOT exact: {r.loses} ({passed})")


def _trains_with_cp(plan: Plan) -> int:
    cp = int(plan.training_engine_dict().get("context_parallel_size") or 1)
    return cp if modes.get(plan.mode).trains_mtp and plan.component("megatron-lm") is not None else 1


@predicate
def mtp_cp_roll_group(plan: Plan, f: dict) -> Verdict:
    cp = _trains_with_cp(plan)
    if cp <= 1:
        return Verdict(NA, "MTP is not trained with context parallelism")
    fix = f["megatron"]["cp_roll_group_fix"]
    mc = plan.component("megatron-lm")
    if mc.source == "git":
        if mc.commit in (fix.get("fixed_commits") or {}):
            return Verdict(PASS, f"megatron-lm {mc.commit[:10]} rolls on the CP group ({fix['link']})")
        if mc.commit in f["megatron"]["commits"]:
            ref = f["megatron"]["commits"][mc.commit].get("ref", "")
            return Verdict(
                FAIL,
                f"megatron-lm {mc.commit[:10]} ({ref}) predates {fix['commit'][:8]}, CP {cp} ({fix['link']})",
            )
        return Verdict(
            FAIL,
            f"megatron-lm {mc.commit[:10]} is in no known list, so not known to contain PR #6746; "
            "`check --probe-sources` reads its roll_tensor",
        )
    v = _version(mc.version)
    since = _version(fix.get("pypi_fixed_from"))
    if v is not None and since is not None and _base(v) >= since:
        return Verdict(PASS, f"megatron-core {v} has PR #6746")
    return Verdict(FAIL, f"megatron-core {mc.version}: no release is known to contain PR #6746, CP {cp}")


@predicate
def mtp_cp_loss_normalization(plan: Plan, f: dict) -> Verdict:
    cp = _trains_with_cp(plan)
    if cp <= 1:
        return Verdict(NA, "MTP is not trained with context parallelism")
    return Verdict(FAIL, f"MTP trained at context_parallel_size {cp}; Megatron-LM#7498 is open")


@predicate
def mtp_loss_over_padding(plan: Plan, f: dict) -> Verdict:
    if not modes.get(plan.mode).trains_mtp:
        return Verdict(NA, f"mode {plan.mode} does not train MTP")
    vc = plan.component("verl")
    known = f["verl"]["mtp_loss_mask"]
    if vc is None:
        return Verdict(FAIL, "no verl in the stack: the training loop's loss_mask is not known")
    pin = vc.commit if vc.source == "git" else vc.version
    if (known["commits"] or {}).get(pin):
        return Verdict(PASS, f"verl {pin[:10]} passes its loss_mask to the model ({known['link']})")
    return Verdict(FAIL, f"verl {pin[:10]} is in no known list: not known to pass its loss_mask to the model")


@predicate
def mtp_detach_heads_clipping(plan: Plan, f: dict) -> Verdict:
    if not plan.mtp_recipe:
        return Verdict(NA, f"mode {plan.mode} has no mtp-only recipe")
    keys = {t.key for t in mtponly.by_id(plan.mtp_recipe).transformer}
    if "mtp_detach_heads" not in keys:
        return Verdict(NA, f"recipe {plan.mtp_recipe} leaves mtp_detach_heads off")
    return Verdict(
        FAIL, f"recipe {plan.mtp_recipe} sets mtp_detach_heads: MTP gradients are clipped as their own group"
    )


@predicate
def rollout_throughput(plan: Plan, f: dict) -> Verdict:
    if modes.get(plan.mode).rollout and plan.rollout_engine == "sglang":
        return Verdict(FAIL, "MTP speculative rollout on SGLang")
    return Verdict(NA, "no MTP rollout")


@predicate
def full_mode_changes_training(plan: Plan, f: dict) -> Verdict:
    if modes.get(plan.mode).loss_reaches_trunk:
        return Verdict(FAIL, f"mode {plan.mode}: the MTP loss reaches trunk parameters")
    return Verdict(NA, f"mode {plan.mode}")


def extension_pin(p) -> str:
    """The pin a compiled extension's arch facts are keyed by: its git commit, else its version."""
    return p.build.commit if p.build.source == "git" else p.version


@predicate
def extension_cuda_archs(plan: Plan, f: dict) -> Verdict:
    """builds.cuda_archs against what nvcc of the CUDA line and each compiled extension, at its
    pin, can target (facts gpu_archs, read in the pinned build scripts)."""
    built = [p for p in plan.packages if p.build is not None]
    if not built or not plan.cuda_archs:
        return Verdict(NA, "no compiled extensions")
    archs = list(plan.cuda_archs)
    shown = ", ".join(f"sm_{a}" for a in archs)
    facts_g = f["gpu_archs"]
    line = ".".join(plan.cuda.split(".")[:2])
    fail, unknown, ok = [], [], []
    nvcc = (facts_g["nvcc"] or {}).get(line)
    if nvcc is None:
        unknown.append(f"no record of what nvcc of CUDA {line} compiles for")
    else:
        fail += [f"nvcc of CUDA {line} cannot compile sm_{a}" for a in archs if a not in nvcc["archs"]]
    for p in built:
        pin = extension_pin(p)
        shown_pin = pin[:8] if p.build.source == "git" else pin
        known = (facts_g["extensions"].get(p.name) or {}).get(pin)
        if known is None:
            unknown.append(f"{p.name} {shown_pin}: no record of the architectures its build targets")
            continue
        targets = known["archs"]
        how = "SASS and PTX" if known["ptx"] else "SASS only"
        if targets == "none":
            ok.append(f"{p.name} {shown_pin} (no device code)")
        elif targets == "torch":
            ok.append(f"{p.name} {shown_pin} (through TORCH_CUDA_ARCH_LIST, {how})")
        else:
            missing = [a for a in archs if a not in targets]
            if missing:
                fail.append(
                    f"{p.name} {shown_pin} targets {', '.join(f'sm_{a}' for a in targets)} only, "
                    f"not {', '.join(f'sm_{a}' for a in missing)}"
                )
            else:
                ok.append(f"{p.name} {shown_pin} ({how})")
    if fail:
        return Verdict(FAIL, f"builds.cuda_archs {shown}: " + "; ".join(fail))
    if unknown:
        return Verdict(
            UNKNOWN,
            f"builds.cuda_archs {shown}: "
            + "; ".join(unknown)
            + "; read its build script and record gpu_archs in manifests/facts.yaml",
        )
    return Verdict(PASS, f"{shown}: " + ", ".join(ok))


@predicate
def platform_wheels(plan: Plan, f: dict) -> Verdict:
    """A plan for another platform than the lock's own (builds.platform, issue 49): it installs
    lock.yaml's set for that platform (builds.lock_platforms), so it passes only where the lock
    has a file by sha256 for every pin there; a pin with no wheel for it is named with what it
    blocks (its layer and that layer's components, or the build it is a backend of)."""
    if plan.platform == schema.default(COMPONENTS, "builds", "platform"):
        return Verdict(NA, f"{plan.platform}: the platform lock.yaml is made for")
    known = platforms.known().get(plan.platform)
    if known is None:  # the schema's enum and platforms.yaml disagree: said, never passed
        return Verdict(FAIL, f"{plan.platform}: not in mtpimage/data/platforms.yaml")
    wheel = f"manylinux {known.arch}"
    members = {layer.name: ", ".join(layer.items) for layer in plan.layers}
    said = []
    for row in plan.platform_gaps:
        needs = (
            f"the build of {row.builds}"
            if row.is_build_backend
            else f"layer {row.layer} ({members.get(row.layer, 'not a layer of this plan')})"
        )
        page = platforms.SOURCE.format(name=row.name) if row.index == "pypi" else f"index {row.index}"
        said.append(
            f"{row.name} {row.version} has no {wheel} wheel for CPython {plan.python} ({page}), "
            f"needed by {needs}: it blocks profile {plan.profile} (targets {', '.join(plan.targets)})"
        )
    if said:
        return Verdict(FAIL, f"{plan.platform}: " + "; ".join(said))
    if not plan.locked and not plan.packages:
        # a plan that pins no package (the stand-in test profiles) has no file that could be
        # another platform's: nothing to lock per platform
        return Verdict(PASS, f"{plan.platform}: no pin of this plan has a platform-specific file")
    if not plan.locked:
        return Verdict(
            FAIL,
            f"{plan.platform}: lock.yaml holds no {plan.platform} set for profile {plan.profile} "
            f"(its files are chosen for {schema.default(COMPONENTS, 'builds', 'platform')}); "
            f"list {plan.platform} in components.yaml builds.lock_platforms and run lock",
        )
    unhashed = [r for r in plan.locked if r.file and not r.sha256]
    if unhashed:  # hash-pinned says it too; never passed here
        return Verdict(FAIL, f"{plan.platform}: {len(unhashed)} locked row(s) without a sha256")
    files = sum(1 for r in plan.locked if r.file)
    return Verdict(
        PASS,
        f"{plan.platform}: every pin locked for it by sha256 ({files} files of lock.yaml's {known.arch} set)",
    )


def evaluate(
    plan: Plan, probes: dict[str, Verdict] | None = None, evidence: str = "probe", f: dict | None = None
) -> list[RuleResult]:
    """Every rule's result; `probes` (a source probe's verdicts, or those lock.yaml recorded:
    evidence "lock") decide the rules they cover, unless inconclusive where the known lists decide."""
    f = f if f is not None else facts()
    results = []
    for rule in rules():
        known = PREDICATES[rule.predicate](plan, f)
        verdict, source = known, "known-pins"
        if probes and rule.id in probes:
            probed = probes[rule.id]
            if probed.status != UNKNOWN or known.status not in (PASS, FAIL):
                verdict, source = probed, evidence
            elif known.status == PASS and evidence == "probe":
                # asked to probe, and nothing was probed: a check that checked nothing never
                # says pass (the known list's word is kept in the detail)
                verdict, source = (
                    Verdict(UNKNOWN, f"{probed.detail}; the known pins say: {known.detail}"),
                    evidence,
                )
            else:  # an inconclusive probe never hides a known verdict (a known FAIL still refuses)
                verdict = Verdict(
                    known.status, f"{known.detail} (the source probe was inconclusive: {probed.detail})"
                )
        results.append(RuleResult(rule, verdict.status, verdict.detail, source))
    return results


def errors(results: list[RuleResult]) -> list[RuleResult]:
    return [r for r in results if r.violated and r.rule.severity == "error"]


def warnings(results: list[RuleResult]) -> list[RuleResult]:
    return [r for r in results if (r.violated and r.rule.severity == "warning") or r.status == UNKNOWN]
