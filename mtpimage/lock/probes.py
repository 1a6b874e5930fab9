"""Source probes: decide rules from the pinned sources' code (Python `ast`, never import).

`probe_plan(plan)` fetches what each applicable rule needs (gitfetch.py cache) and returns
{rule_id: Verdict}; rules.evaluate() lets these verdicts override the known-commit lists.
A rule that does not apply to the plan (its predicate says n/a) is not probed.

What each probe reads (file, symbol) and expects is described once, in
mtpimage/data/probes.yaml (mtpimage/lock/probetable.py); the functions below are how it is read
with `ast` on a source tree. With patches (by reference: the diff of their commits, see
patches.py), the sglang source (a wheel or the repository root) is copied and the patches
applied to the copy first.
"""

from __future__ import annotations

import ast
import shutil
import tempfile
from pathlib import Path

from mtpimage import children, gitfetch
from mtpimage.errors import last_words
from mtpimage.lock import lockfile, srcmeta
from mtpimage.lock.probetable import component_of, probe_specs, source_probe_specs
from mtpimage.lock.sources import SourceSet
from mtpimage.manifests import manifest
from mtpimage.manifests import patches as patches_mod
from mtpimage.manifests.manifest import DEFAULT_MANIFESTS
from mtpimage.manifests.patches import PatchUnavailable
from mtpimage.manifests.patches import as_files as patch_files
from mtpimage.plan import mtponly
from mtpimage.plan import rules as rules_mod
from mtpimage.plan.model import Component, Plan
from mtpimage.plan.rules import FAIL, NA, PASS, UNKNOWN, Verdict

_SPECS = probe_specs()
_RECOMPUTE = _SPECS["recompute-padding-mask"]
_MBRIDGE = _SPECS["mbridge-mcore-017"]
_SGLANG = _SPECS["sglang-ipc-unwrap"]
_MIMO = _SPECS["mimo-needs-bridge-2387"]
MTP_FILE = _RECOMPUTE["file"]
ENUMS_FILE = _MBRIDGE["file"]
SGLANG_RUNNER = _SGLANG["file"]
SGLANG_EAGLE = _SGLANG["caller_file"]
MIMO_BRIDGE = _MIMO["file"]

# A probe of the source alone (no in-image counterpart: what it reads is the version the source
# builds, which the in-image `versions` check already compares).
# Each with the component whose source it reads: the Megatron source, as the recompute probe's.
SOURCE_ONLY = {"mtp-context-parallel": _RECOMPUTE["component"]}
SOURCE_ONLY_RULES = tuple(SOURCE_ONLY)
PROBED_RULES = tuple(spec["rule"] for spec in _SPECS.values()) + SOURCE_ONLY_RULES


# ----------------------------------------------------------------------------- pure probes


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except (OSError, SyntaxError):
        return None


def _find(root: Path, rel: str, prefixes=("", "src/", "python/")) -> Path | None:
    for prefix in prefixes:
        p = root / prefix / rel
        if p.is_file():
            return p
    return None


def _class(mod: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(mod) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef, name: str):
    return next(
        (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
        None,
    )


def _params(fn) -> tuple[set[str], bool]:
    a = fn.args
    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    return names, a.kwarg is not None


def recompute_signature(tree: Path) -> Verdict:
    r = _RECOMPUTE
    cls_name, caller, callee, kw = r["class"], r["caller"], r["callee"], r["keyword"]
    path = _find(tree, MTP_FILE, ("",))
    if path is None:
        return Verdict(PASS, f"{MTP_FILE} not found: this Megatron has no MTP recompute path")
    mod = _parse(path)
    if mod is None:
        return Verdict(UNKNOWN, f"{MTP_FILE} does not parse")
    cls = _class(mod, cls_name)
    if cls is None:
        return Verdict(UNKNOWN, f"{MTP_FILE} has no class {cls_name}")
    fwd, ckpt = _method(cls, caller), _method(cls, callee)
    if fwd is None:
        return Verdict(UNKNOWN, f"{cls_name} has no {caller}()")
    fwd_names, _ = _params(fwd)
    if kw not in fwd_names:
        return Verdict(PASS, f"{caller}() takes no {kw} (source probe)")
    if ckpt is None:
        return Verdict(PASS, f"no {callee}() (source probe)")
    names, has_kwargs = _params(ckpt)
    if kw in names:
        return Verdict(PASS, f"{callee}() accepts {kw} (source probe)")
    if has_kwargs:
        return Verdict(PASS, f"{callee}() takes **kwargs (source probe)")
    return Verdict(
        FAIL,
        f"{MTP_FILE}:{ckpt.lineno}: {callee}() declares explicit "
        f"parameters without {kw} while {caller}() passes it (source probe)",
    )


def _uses_attr(mod: ast.Module, owner: str, attr: str) -> int | None:
    for node in ast.walk(mod):
        if isinstance(node, ast.Attribute) and node.attr == attr:
            v = node.value
            name = v.id if isinstance(v, ast.Name) else (v.attr if isinstance(v, ast.Attribute) else None)
            if name == owner:
                return node.lineno
    return None


def package_uses_encoder_and_decoder(tree: Path, package: str) -> str | None:
    """'file:line' of the first use of the probed ModelType member in the package's own code."""
    pkg = package.replace("-", "_")
    roots = [r for r in (tree / pkg, tree / "src" / pkg) if r.is_dir()]
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            mod = _parse(path)
            line = _uses_attr(mod, _MBRIDGE["class"], _MBRIDGE["member"]) if mod else None
            if line:
                return f"{path.relative_to(tree)}:{line}"
    return None


def modeltype_members(tree: Path) -> set[str] | None:
    path = _find(tree, ENUMS_FILE, ("",))
    mod = _parse(path) if path else None
    cls = _class(mod, _MBRIDGE["class"]) if mod else None
    if cls is None:
        return None
    out = set()
    for node in cls.body:
        if isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def mbridge_modeltype(
    mbridge_tree: Path, package: str, megatron_tree: Path | None, megatron_version=None
) -> Verdict:
    cls, member = _MBRIDGE["class"], _MBRIDGE["member"]
    what = f"{cls}.{member}"
    use = package_uses_encoder_and_decoder(mbridge_tree, package)
    if use is None:
        return Verdict(PASS, f"{package}'s package code does not use {what} (source probe)")
    if megatron_tree is not None:
        members = modeltype_members(megatron_tree)
        if members is None:
            return Verdict(UNKNOWN, f"{use} uses {what}; the pinned Megatron has no {cls} in {ENUMS_FILE}")
        if member in members:
            return Verdict(PASS, f"{use} uses {what}, which the pinned Megatron still has (source probe)")
        return Verdict(
            FAIL,
            f"{use} uses {what}; the pinned Megatron's "
            f"{cls} has only {', '.join(sorted(members))} (source probe)",
        )
    if megatron_version is not None:
        if megatron_version.release >= (0, 17):
            return Verdict(FAIL, f"{use} uses {what}; megatron-core {megatron_version} removed it")
        return Verdict(PASS, f"{use} uses {what}; megatron-core {megatron_version} < 0.17 has it")
    return Verdict(UNKNOWN, f"{use} uses {what}; the pinned Megatron is unknown")


def _defines_function(mod: ast.Module, name: str) -> bool:
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(mod)
    )


def _calls(mod: ast.Module, name: str) -> bool:
    for n in ast.walk(mod):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                isinstance(f, ast.Attribute) and f.attr == name
            ):
                return True
    return False


def sglang_fix(tree: Path, how: str = "source probe") -> Verdict:
    runner, eagle = _find(tree, SGLANG_RUNNER), _find(tree, SGLANG_EAGLE)
    if runner is None or eagle is None:
        gone = " and ".join(rel for rel, p in ((SGLANG_RUNNER, runner), (SGLANG_EAGLE, eagle)) if p is None)
        return Verdict(
            UNKNOWN,
            f"{gone} not in this sglang tree (sglang >= 0.5.16 has no eagle_worker.py; its weight "
            "updates moved to model_runner_components/weight_updater.py): the probe cannot decide",
        )
    rmod, emod = _parse(runner), _parse(eagle)
    if rmod is None or emod is None:
        return Verdict(UNKNOWN, "sglang sources do not parse")
    fn = _SGLANG["function"]
    if not _defines_function(rmod, fn):
        return Verdict(
            FAIL, f"{SGLANG_RUNNER} has no {fn}: the IPC handle is opened twice on MTP weight sync ({how})"
        )
    if not _calls(emod, fn):
        return Verdict(FAIL, f"{SGLANG_EAGLE} does not call {fn} ({how})")
    return Verdict(PASS, f"{fn} defined and used by the EAGLE worker ({how})")


def mtp_cp(tree: Path, f: dict) -> Verdict:
    """MTP with context parallelism: the megatron-core version the source itself builds."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(srcmeta.read(tree).version)
    except (srcmeta.MetadataUnreadable, InvalidVersion) as exc:
        return Verdict(UNKNOWN, f"the source's version cannot be read: {exc}")
    first = Version(f["megatron"]["mtp_cp_from"])
    if v < first:  # 0.14.0rc1 still asserts CP == 1
        return Verdict(
            FAIL, f"the source builds megatron-core {v}: MTP needs CP == 1 before {first} (source probe)"
        )
    return Verdict(
        PASS, f"the source builds megatron-core {v}: MTP supports context parallelism (source probe)"
    )


def bridge_mimo(tree: Path) -> Verdict:
    path = _find(tree, MIMO_BRIDGE, ("src/", ""))
    if path is None:
        return Verdict(FAIL, f"no {MIMO_BRIDGE}: the MiMo MTP bridge of PR #2387 is missing (source probe)")
    mod = _parse(path)
    name = _MIMO["class"]
    cls = _class(mod, name) if mod else None
    if cls is None:
        return Verdict(FAIL, f"{path.relative_to(tree)} has no class {name} (source probe)")
    mtp = any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "mtp" in n.value for n in ast.walk(cls)
    )
    if not mtp:
        return Verdict(FAIL, f"{name} maps no MTP parameters (source probe)")
    return Verdict(PASS, f"{path.relative_to(tree)}: {name} with MTP mappings (source probe)")


# ----------------------------------------------------------------------------- mtp-only recipes

_SOURCE = source_probe_specs()


def _first_call(node: ast.AST, attr: str) -> int | None:
    """Line of the first call of `attr` (a method or function of that name) under node."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr == attr) or (
                isinstance(f, ast.Name) and f.id == attr
            ):
                return n.lineno
    return None


def _function(mod: ast.Module, name: str):
    return next(
        (
            n
            for n in ast.walk(mod)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ),
        None,
    )


def _guard_verdict(fn: ast.AST, spec: dict, name: str, kept: str) -> Verdict:
    """PASS where `fn` calls the spec's checkpoint guard (Megatron's own, or verl's copy of it),
    FAIL naming the function's line where it does not: the two guard probes differ only in
    where they look."""
    line = _first_call(fn, spec["guard_call"])
    if line is None:
        return Verdict(
            FAIL, f"{spec['file']}:{fn.lineno}: {name}() lacks the checkpoint guard (source probe)"
        )
    return Verdict(PASS, f"{kept} at {spec['file']}:{line} (source probe)")


def megatron_detach_heads_source(tree: Path) -> Verdict:
    """PASS: the Megatron source has mtp_detach_heads and the checkpoint guard; FAIL: it lacks one."""
    s = _SOURCE["megatron-detach-heads"]
    cfg_path, mtp_path = _find(tree, s["config_file"], ("",)), _find(tree, s["file"], ("",))
    cfg = _parse(cfg_path) if cfg_path else None
    mtp = _parse(mtp_path) if mtp_path else None
    cls = _class(cfg, s["config_class"]) if cfg else None
    if cls is None or mtp is None:
        return Verdict(UNKNOWN, f"{s['config_file']} or {s['file']} not readable in this Megatron source")
    fields = {
        n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    if s["field"] not in fields:
        return Verdict(FAIL, f"{s['config_class']} has no {s['field']} (source probe)")
    layer = _class(mtp, s["class"])
    method = _method(layer, s["method"]) if layer else None
    if method is None:
        return Verdict(UNKNOWN, f"{s['file']} has no {s['class']}.{s['method']}")
    return _guard_verdict(method, s, s["method"], f"{s['field']} and the checkpoint guard")


def verl_detach_guard_source(tree: Path) -> Verdict:
    s = _SOURCE["verl-detach-guard"]
    path = _find(tree, s["file"])
    mod = _parse(path) if path else None
    fn = _function(mod, s["function"]) if mod else None
    if fn is None:
        return Verdict(UNKNOWN, f"{s['file']} has no {s['function']}: this verl's detach is unknown")
    return _guard_verdict(fn, s, s["function"], f"{s['function']}() keeps the checkpoint guard")


SOURCE_NEEDS = {
    "megatron-detach-heads": megatron_detach_heads_source,
    "verl-detach-guard": verl_detach_guard_source,
}
NEED_COMPONENT = {"megatron-detach-heads": mtponly.MEGATRON, "verl-detach-guard": mtponly.VERL}


def mtp_only_recipe_probe(plan: Plan, trees: dict[str, Path | None]) -> Verdict:
    """The plan's recipe against its sources: FAIL where a need it relies on is not in the code
    (its overrides would leak or stop MTP silently); a better recipe the code allows is named."""
    recipe = mtponly.by_id(plan.mtp_recipe)
    seen: dict[str, Verdict] = {}

    def need(n: str) -> Verdict:
        if n not in seen:
            tree = trees.get(NEED_COMPONENT[n])
            seen[n] = (
                SOURCE_NEEDS[n](tree)
                if tree is not None
                else Verdict(UNKNOWN, f"the {NEED_COMPONENT[n]} source was not read")
            )
        return seen[n]

    broken = [f"{n}: {need(n).detail}" for n in recipe.needs if need(n).status == FAIL]
    if broken:
        return Verdict(FAIL, f"recipe {recipe.id} relies on what the source lacks: {'; '.join(broken)}")
    unsure = [f"{n}: {need(n).detail}" for n in recipe.needs if need(n).status != PASS]
    if unsure:
        return Verdict(UNKNOWN, f"recipe {recipe.id}: not decided: {'; '.join(unsure)}")
    better = next(
        (
            r
            for r in mtponly.recipes()[: [r.id for r in mtponly.recipes()].index(recipe.id)]
            if all(need(n).status == PASS for n in r.needs)
        ),
        None,
    )
    held = "; ".join(need(n).detail for n in recipe.needs) or "needs nothing"
    if better is not None:
        return Verdict(
            PASS,
            f"recipe {recipe.id} holds ({held}); the source also allows {better.id}: record the facts in "
            "manifests/facts.yaml to take it",
        )
    return Verdict(PASS, f"recipe {recipe.id}: {held}")


def cp_roll_group_source(tree: Path) -> Verdict:
    s = _SOURCE["mtp-cp-roll-group"]
    path = _find(tree, s["file"], ("",))
    mod = _parse(path) if path else None
    fn = _function(mod, s["function"]) if mod else None
    if fn is None:
        return Verdict(UNKNOWN, f"{s['file']} has no {s['function']}()")
    bare = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            named = {kw.arg for kw in n.keywords}
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else None)
            args = [a.attr if isinstance(a, ast.Attribute) else getattr(a, "id", None) for a in n.args]
            p2p = name in s["calls"] or (name == "P2POp" and any(a in s["calls"] for a in args))
            if p2p and "group" not in named:
                bare.append(n.lineno)
    if bare:
        lines = ", ".join(map(str, bare))
        return Verdict(
            FAIL, f"{s['file']}:{lines}: {s['function']}() sends on the default group (source probe)"
        )
    return Verdict(PASS, f"{s['function']}() sends on the CP group (source probe)")


# ----------------------------------------------------------------------------- patched PyPI trees


def patch_paths(patch: Path, strip: int) -> list[str]:
    out = []
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            p = line[4:].split("\t")[0].strip()
            out.append("/".join(p.split("/")[strip:]))
    return out


def patch_dry_run(tree: Path, patch: Path, strip: int) -> tuple[bool, str]:
    proc = children.run(
        [
            "patch",
            "--dry-run",
            "--batch",
            "--forward",
            f"-p{strip}",
            "-d",
            str(tree),
            "-i",
            str(patch.resolve()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode == 0, last_words(proc.stdout + proc.stderr, 400)


def source_root(tree: Path, c: Component) -> Path:
    """A git source's patches apply at its repository root (the diff's paths), not its subdir."""
    if c.source != "git" or c.subdir in ("", "."):
        return tree
    return tree.parents[len(Path(c.subdir).parts) - 1]


def apply_check(c: Component, tree: Path, patch: Path, strip: int) -> tuple[bool, str, str]:
    """(applies, git's or patch's words, how it was checked) for one patch file against the
    component's fetched source: `git apply --check` at a git source's repository root, `patch
    --dry-run` on a PyPI component's unpacked wheel. `lock` and `check --probe-sources` both ask this."""
    if c.source == "git":
        ok, err = gitfetch.apply_check(source_root(tree, c), patch, strip)
        return ok, err, f"git apply --check -p{strip} at the repository root"
    ok, err = patch_dry_run(tree, patch, strip)
    return ok, err, f"patch --dry-run -p{strip} on the {c.package} {c.version} wheel"


def patches_probe(plan: Plan, manifests_root: Path, ss: SourceSet) -> Verdict | None:
    """patches-apply decided by applying every patch to its component's pinned source (None
    when no component is patched)."""
    patched = [c for c in plan.components if c.patches]
    if not patched:
        return None
    fail, unknown, ok = [], [], []
    for c in patched:
        shown = c.pinned_artifact()
        for p in c.patches:
            where = f"components.{c.name}.patches"
            try:
                # the patch first: where it cannot be made, the artifact is not fetched for nothing
                with patch_files(c.name, (p,), manifests_root, where) as [(path, strip)]:
                    tree = ss.tree(c)
                    if tree is None:
                        why = ss.failed.get(c.name) or ss.unavailable.get(c.name, "not fetched")
                        unknown.append(f"not decided: the {c.name} source could not be fetched ({why})")
                        continue
                    fits, err, how = apply_check(c, tree, path, strip)
            except PatchUnavailable as exc:
                unknown.append(f"not decided: patch {p.describe()} could not be made ({exc.reason})")
                continue
            line = f"{c.name}: patch {p.sha256[:12]} {'applies' if fits else 'does not apply'} to {shown} ({how})"
            (ok if fits else fail).append(line if fits else f"{line}: {err}")
    if fail:
        return Verdict(FAIL, "; ".join(fail))
    if unknown:
        return Verdict(UNKNOWN, "; ".join(unknown))
    return Verdict(PASS, "; ".join(ok))


def patched_copy(tree: Path, patches: list[tuple[Path, int]]) -> Path:
    """A scratch copy of the files the patches touch, with the patches applied."""
    scratch = Path(tempfile.mkdtemp(prefix="mtp-patched-"))
    for patch, strip in patches:
        for rel in patch_paths(patch, strip):
            src = tree / rel
            if src.is_file() and not (scratch / rel).exists():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, scratch / rel)
    for patch, strip in patches:
        proc = children.run(
            ["patch", "--batch", "--forward", f"-p{strip}", "-d", str(scratch), "-i", str(patch.resolve())],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError(last_words(proc.stdout + proc.stderr, 400))
    return scratch


# ----------------------------------------------------------------------------- the plan


def _probe_sglang(plan: Plan, comp: Component, ss: SourceSet, root: Path | None) -> Verdict:
    fix = rules_mod.facts()["sglang"]["fix_patch_provides"]  # what the fix patch provides
    tree = ss.tree(comp)
    if tree is None and comp.name in ss.failed:
        return Verdict(
            UNKNOWN, f"not decided: the sglang source could not be fetched ({ss.failed[comp.name]})"
        )
    if tree is None:
        reason = ss.unavailable.get(comp.name, "not fetched")
        if fix in comp.provides():
            return Verdict(
                PASS, f"trusting the patch's `provides: {fix}`; the sources could not be probed ({reason})"
            )
        return Verdict(UNKNOWN, f"sglang sources not probed: {reason}")
    if not comp.patches:
        return sglang_fix(tree)

    if comp.source == "git" and comp.subdir not in ("", "."):
        tree = tree.parents[len(Path(comp.subdir).parts) - 1]  # patches apply at the repository root
    try:
        with patches_mod.as_files(
            comp.name, comp.patches, root, patches_mod.origin(plan, comp.name, root)
        ) as files:
            scratch = patched_copy(tree, files)
    except patches_mod.PatchUnavailable as exc:
        if exc.offline and fix in comp.provides():
            return Verdict(
                PASS,
                f"trusting the patch's `provides: {fix}`; its commits could not be fetched ({exc.reason})",
            )
        if exc.offline:
            return Verdict(UNKNOWN, f"sglang patch not made: {exc.reason}")
        if not ss.keep_going:
            raise
        ss.failed[f"{comp.name} (patch)"] = exc.reason
        return Verdict(UNKNOWN, f"not decided: the sglang patch could not be made ({exc.reason})")
    except RuntimeError as exc:
        return Verdict(FAIL, f"the sglang patches do not apply to {comp.pin}: {exc}")
    try:
        # Files the patches do not touch come from the unpatched tree.
        for rel in (SGLANG_RUNNER, SGLANG_EAGLE):
            for prefix in ("", "python/"):
                src = tree / prefix / rel
                if src.is_file() and not (scratch / prefix / rel).exists():
                    (scratch / prefix / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, scratch / prefix / rel)
        return sglang_fix(scratch, f"source probe of {comp.pin} with its patches applied")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def probe_plan(
    plan: Plan, manifests_root: Path | None = None, source_set: SourceSet | None = None
) -> dict[str, Verdict]:
    """Probe the pinned sources of `plan` for every source rule that applies to it."""
    root = Path(manifests_root or DEFAULT_MANIFESTS)
    ss = source_set or SourceSet(dict(plan.indexes))
    ss.indexes = ss.indexes or dict(plan.indexes)
    f = rules_mod.facts_for(root)
    by_id = {r.id: r for r in rules_mod.rules()}
    out: dict[str, Verdict] = {}

    def applies(rule_id: str) -> Verdict | None:
        base = rules_mod.PREDICATES[by_id[rule_id].predicate](plan, f)
        return None if base.status == NA else base

    def unavailable(comp: Component, base: Verdict) -> Verdict:
        if comp.name in ss.failed:
            return Verdict(
                UNKNOWN, f"not decided: the {comp.name} source could not be fetched ({ss.failed[comp.name]})"
            )
        return Verdict(
            base.status,
            f"source not probed ({ss.unavailable.get(comp.name, 'not fetched')}); known pins: {base.detail}",
        )

    patches = patches_probe(plan, root, ss)
    if patches is not None:
        out["patches-apply"] = patches

    base = applies("recompute-padding-mask")
    mc = component_of(plan, "recompute-padding-mask")
    if base is not None and mc is not None:
        tree = ss.tree(mc)
        out["recompute-padding-mask"] = (
            recompute_signature(tree) if tree is not None else unavailable(mc, base)
        )

    base = applies("mbridge-mcore-017")
    mb = component_of(plan, "mbridge-mcore-017")
    if base is not None and mb is not None:
        tree = ss.tree(mb)
        if tree is None:
            out["mbridge-mcore-017"] = unavailable(mb, base)
        else:
            used = plan.component(_MBRIDGE["uses_in"])  # the Megatron whose ModelType it uses
            mtree = ss.tree(used) if used is not None else None
            out["mbridge-mcore-017"] = mbridge_modeltype(
                tree, mb.package, mtree, rules_mod.megatron_version(plan, f)
            )

    base = applies("sglang-rollout-fix")
    sg = component_of(plan, "sglang-ipc-unwrap")
    if base is not None and sg is not None:
        out["sglang-rollout-fix"] = _probe_sglang(plan, sg, ss, root)

    base = applies("mtp-context-parallel")
    mcp = plan.component(SOURCE_ONLY["mtp-context-parallel"])
    if base is not None and mcp is not None:
        tree = ss.tree(mcp)
        out["mtp-context-parallel"] = mtp_cp(tree, f) if tree is not None else unavailable(mcp, base)

    base = applies("mtp-only-recipe")
    if base is not None:
        trees = {}
        for name in (mtponly.MEGATRON, mtponly.VERL):
            comp = plan.component(name)
            trees[name] = ss.tree(comp) if comp is not None else None
        out["mtp-only-recipe"] = mtp_only_recipe_probe(plan, trees)

    base = applies("mtp-cp-roll-group")
    mroll = plan.component(mtponly.MEGATRON)
    if base is not None and mroll is not None:
        tree = ss.tree(mroll)
        out["mtp-cp-roll-group"] = (
            cp_roll_group_source(tree) if tree is not None else unavailable(mroll, base)
        )

    base = applies("mimo-needs-bridge-2387")
    br = component_of(plan, "mimo-needs-bridge-2387")
    if base is not None and br is not None:
        tree = ss.tree(br)
        out["mimo-needs-bridge-2387"] = bridge_mimo(tree) if tree is not None else unavailable(br, base)
    return out


def evaluate_plans(plans: list[Plan], manifests_root: Path, probe_sources: bool) -> list[tuple]:
    """(plan, rule results, {component: why its source could not be fetched}) per plan: what
    `check` reports. With probe_sources the rules that read code are decided from each pinned
    source; one source that cannot be fetched does not stop the others from being probed (its
    rules are UNKNOWN with the reason), and a failed (repository, commit) is not fetched twice."""
    fetch = gitfetch.remembering_fetch() if probe_sources else None
    f = rules_mod.facts_for(manifests_root)
    out = []
    m = None if probe_sources else manifest.load(manifests_root, keep_going=True)
    for plan in plans:
        probes, missing, evidence = None, {}, "probe"
        if probe_sources:
            ss = SourceSet(dict(plan.indexes), fetcher=fetch, keep_going=True)
            probes = probe_plan(plan, manifests_root, ss)
            missing = dict(ss.failed)
        else:  # the verdicts lock.yaml recorded for this very plan count
            probes, evidence = lockfile.locked_probes(m, plan), "lock"
        out.append((plan, rules_mod.evaluate(plan, probes, evidence, f), missing))
    return out
