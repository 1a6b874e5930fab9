"""`wheels`: the extension wheel cache (wheelcache.py) and its registry copies (wheelshare.py).

  python build.py wheels list [--verify [--manifests DIR]] [--json]
  python build.py wheels push --registry HOST[:PORT]/NAMESPACE [KEY ...] [--json]   (all when none)
  python build.py wheels pull --registry HOST[:PORT]/NAMESPACE KEY ... [--json]
  python build.py wheels remove KEY ...
  python build.py wheels add --profile P --package NAME --sha256 HEX FILE.whl
  python build.py wheels pin --profile P [--package NAME]
  python build.py wheels verify KEY [--profile P]
  python build.py wheels build --profile P [--package NAME ...] [--set builds.cuda_archs=90,100]
  python build.py wheels archs [KEY ...] [--cuobjdump PATH] [--json]
Wheels are checked against their pins in manifests/wheels.lock.yaml (ext/wheelpins.py): `add`
and `pin` write them, `pull` and `push` refuse any other bytes, `list --verify --manifests M`
names them, `verify` rebuilds a key and compares.
KEY may be a unique prefix (8+ hex digits) of a key, as `list` prints it. The registry
repository is NAMESPACE/ext-wheels, one tag per key.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mtpimage.assembly.pipeline import BuildOptions, extension_builder
from mtpimage.commands.image import add_registry_mirror
from mtpimage.commands.load import load_for, plan_for, substitutions_of
from mtpimage.errors import EXIT_ENV, EXIT_INPUT, EXIT_RULES, EnvironmentProblem, InputError
from mtpimage.ext import wheelpins
from mtpimage.ext.wheelcache import KEY_RE, WheelCache
from mtpimage.ext.wheelshare import pull, push, repository_for
from mtpimage.imageref import ImageRef, Registry
from mtpimage.locations import DEFAULT_MANIFESTS
from mtpimage.mirrors import Mirrors
from mtpimage.publish.registryclient import RegistryClient

KEY_WIDTH = 12  # what `list` prints of a key; `resolve` accepts it back


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "wheels",
        help="the extension wheel cache: list, push to / pull from a registry, remove",
        description="Compiled extension wheels (TransformerEngine, flash-attn, apex), one per key "
        "(the sha256 of everything that changes their bytes), kept in $MTP_CACHE_DIR/ext-wheels "
        "outside BuildKit, shared through a registry as OCI artifacts (REGISTRY/ext-wheels:KEY).",
    )
    subs = p.add_subparsers(dest="wheels_command", metavar="ACTION", required=True, parser_class=type(p))

    sp = subs.add_parser("list", help="one line per cached wheel")
    sp.add_argument(
        "--verify",
        action="store_true",
        help="re-hash every wheel (default: sizes only); with --manifests, also against wheels.lock.yaml",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    _manifests_argument(sp, "the pins --verify checks against (default: none, meta.json only)")
    sp.set_defaults(func=cmd_list)

    for name, helptext in (
        ("push", "push cached wheels (all, or the KEYs given) to REGISTRY/ext-wheels"),
        ("pull", "pull the KEYs from REGISTRY/ext-wheels into the cache, verified"),
    ):
        sp = subs.add_parser(name, help=helptext)
        sp.add_argument("--registry", required=True, metavar="HOST[:PORT]/NAMESPACE")
        sp.add_argument("keys", nargs="*" if name == "push" else "+", metavar="KEY")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        # the pins both check against live with the manifests
        _manifests_argument(sp, "its wheels.lock.yaml; default: the checkout's manifests/")
        sp.set_defaults(func=cmd_push if name == "push" else cmd_pull)

    sp = subs.add_parser(
        "pin",
        help="pin the sha256 of the profile's cached extension wheels in manifests/wheels.lock.yaml",
        description="After a first build (or `wheels pull`) and its review: record each cached wheel of "
        "the profile's keys in wheels.lock.yaml, so builds, pulls and shares refuse any other bytes.",
    )
    add_common(sp)
    sp.add_argument("--profile", required=True, metavar="P")
    sp.add_argument("--package", metavar="NAME", help="only this compiled package")
    sp.set_defaults(func=cmd_pin)

    sp = subs.add_parser(
        "verify",
        help="rebuild a key's wheel (no cache) and compare it with its pin and its cache entry",
    )
    add_common(sp)
    sp.add_argument("key", metavar="KEY")
    sp.add_argument("--profile", metavar="P", help="the profile whose plan has KEY (default: look in all)")
    sp.add_argument("--ca-bundle", type=Path, metavar="PATH", help="CA bundle for HTTPS inside the build")
    sp.add_argument("--netrc", type=Path, metavar="PATH", help="netrc with index tokens for the build")
    add_registry_mirror(sp)
    sp.set_defaults(func=cmd_verify)

    _register_build_add_archs(subs, add_common)

    sp = subs.add_parser("remove", help="remove cache entries (a corrupt one, or to rebuild it)")
    sp.add_argument("keys", nargs="+", metavar="KEY")
    sp.set_defaults(func=cmd_remove)


def _register_build_add_archs(subs, add_common) -> None:
    """`wheels build`, `add` and `archs` (issue 49): kept apart so register stays short."""
    sp = subs.add_parser(
        "build",
        help="compile the profile's extension wheels missing from the cache (no image)",
        description="The main job's extension step alone: each of the profile's compiled extensions "
        "(or the --package ones) from the wheel cache, the share (MTP_WHEEL_CACHE_REPO) or its builder "
        "stage, resumable from the compile cache; no image is built. The plan's rules are checked "
        "first (an arch an extension cannot target stops here, not hours into a compile).",
    )
    add_common(sp)
    sp.add_argument("--profile", required=True, metavar="P")
    sp.add_argument(
        "--package", action="append", metavar="NAME", help="only this compiled package (repeatable)"
    )
    sp.add_argument("--ca-bundle", type=Path, metavar="PATH", help="CA bundle for HTTPS inside the build")
    sp.add_argument("--netrc", type=Path, metavar="PATH", help="netrc with index tokens for the build")
    add_registry_mirror(sp)
    sp.set_defaults(func=cmd_build)

    sp = subs.add_parser(
        "add",
        help="take a wheel a site built into the cache, by sha256, under the plan's key",
        description="Check FILE.whl (its sha256 is HEX; it is PACKAGE at the plan's version, for its "
        "Python, with every compiled module the package produces) and file it under the key the "
        "profile's build looks up, so the next build installs it instead of compiling.",
    )
    add_common(sp)
    sp.add_argument("--profile", required=True, metavar="P")
    sp.add_argument("--package", required=True, metavar="NAME", help="a package the profile compiles")
    sp.add_argument(
        "--sha256", required=True, metavar="HEX", help="the wheel's sha256, as the site pinned it"
    )
    sp.add_argument("wheel", type=Path, metavar="FILE.whl")
    sp.set_defaults(func=cmd_add)

    sp = subs.add_parser(
        "archs",
        help="the GPU code in each cached wheel's modules (cuobjdump) against its key's cuda_archs",
        description="List the SASS and PTX architectures of every compiled module of the cached wheels "
        "(all, or the KEYs given) with cuobjdump, and fail (exit 3) where a module with device code "
        "lacks SASS for one of its key's archs: the image's preflight trusts those archs.",
    )
    sp.add_argument("keys", nargs="*", metavar="KEY")
    sp.add_argument(
        "--cuobjdump",
        type=Path,
        metavar="PATH",
        help="the cuobjdump to run (default: PATH's, else /usr/local/cuda/bin/cuobjdump)",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_archs)


def _manifests_argument(sp, what: str) -> None:
    sp.add_argument(
        "--manifests",
        type=Path,
        default=argparse.SUPPRESS,  # else it would hide a --manifests given before `wheels`
        help=f"manifests directory ({what})",
    )


def _pins(args, default):
    """{key: Pin} of the manifests given (or `default`'s), {} when there are none."""
    return wheelpins.load(getattr(args, "manifests", None) or default)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _row(entry) -> dict:
    inputs = entry.meta.get("inputs") or {}
    parts = entry.filename.split("-")
    return {
        "key": entry.key,
        "name": inputs.get("name") or parts[0],
        "version": inputs.get("version") or parts[1],
        "filename": entry.filename,
        "sha256": entry.sha256,
        "size": entry.size,
        "built_by": entry.meta.get("built_by")
        or entry.meta.get("pulled_from")
        or (
            f"site ({entry.meta.get('original_filename')})"
            if entry.meta.get("provided_by") == "site"
            else "?"
        ),
        "path": str(entry.path),
    }


def cmd_list(args) -> int:
    cache = WheelCache()
    good, bad = cache.scan(verify=args.verify)
    if args.verify:  # against the committed pins too, when the manifests are given
        pins = _pins(args, None)
        for entry in good:
            try:
                wheelpins.check(
                    pins,
                    entry.key,
                    entry.sha256,
                    f"wheel cache entry {entry.path.parent}",
                    f"`build.py wheels remove {entry.key[:KEY_WIDTH]}`, then pull or build it again",
                )
            except wheelpins.PinMismatch as exc:
                bad.append(exc)
        good = [e for e in good if not (e.key in pins and pins[e.key].sha256 != e.sha256)]
    rows = [_row(e) for e in good]
    if args.json:
        print(
            json.dumps(
                {"root": str(cache.root), "wheels": rows, "corrupt": [b.one_line() for b in bad]}, indent=2
            )
        )
    elif not rows and not bad:
        print(f"no wheels in {cache.root}")
    else:
        table = [["KEY", "NAME", "VERSION", "SHA256", "SIZE", "BUILT BY"]] + [
            [
                r["key"][:KEY_WIDTH],
                r["name"],
                r["version"],
                r["sha256"][:KEY_WIDTH],
                _size(r["size"]),
                r["built_by"],
            ]
            for r in rows
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        for line in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    for problem in bad:
        print(f"error: {problem.one_line()}", file=sys.stderr)
    return EXIT_ENV if bad else 0


def cmd_push(args) -> int:
    repository = repository_for(args.registry)
    cache = WheelCache()
    pins = _pins(args, DEFAULT_MANIFESTS)
    keys = [cache.resolve(k) for k in args.keys] if args.keys else cache.keys()
    if not keys:
        raise InputError(
            "wheels push", None, f"the wheel cache {cache.root} is empty", "build an extension first"
        )
    out = []
    for key in keys:
        ref = push(cache, key, repository, say=lambda line: print(line, file=sys.stderr), pin=pins.get(key))
        out.append({"key": key, "reference": ref})
        if not args.json:
            print(f"pushed {key[:KEY_WIDTH]}  {ref}")
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def _remote_key(prefix: str, repository: str, tags: list[str] | None) -> tuple[str, list[str] | None]:
    """A full key as given, or the one tag of the repository that starts with `prefix`."""
    if KEY_RE.match(prefix):
        return prefix, tags
    if not re.fullmatch(r"[0-9a-f]{8,63}", prefix):
        raise InputError("wheel key", prefix, "expected a key or 8+ hex digits of one", "see `wheels list`")
    if tags is None:
        ref = ImageRef.parse(repository)
        tags = RegistryClient(Registry(ref.host, "")).tags(ref.path)
    matches = [t for t in tags if KEY_RE.match(t) and t.startswith(prefix)]
    if len(matches) != 1:
        raise InputError(
            "wheel key",
            prefix,
            f"matches {len(matches)} tags of {repository}",
            "give more hex digits, or the full key",
        )
    return matches[0], tags


def cmd_pull(args) -> int:
    repository = repository_for(args.registry)
    cache = WheelCache()
    pins = _pins(args, DEFAULT_MANIFESTS)
    out, missing, tags = [], [], None
    keys = []
    for given in args.keys:  # every key resolved before anything is pulled
        key, tags = _remote_key(given, repository, tags)
        keys.append(key)
    for key in keys:
        entry = pull(cache, key, repository, pin=pins.get(key))
        if entry is None:
            missing.append(key)
            continue
        out.append({"key": key, **_row(entry), "pinned": key in pins})
        if not args.json:
            print(
                f"pulled {key[:KEY_WIDTH]}  {entry.filename}  sha256 {entry.sha256[:KEY_WIDTH]}  {entry.path}"
                + ("" if key in pins else f"  (not pinned in {wheelpins.PINS_NAME})")
            )
    if args.json:
        print(json.dumps({"pulled": out, "missing": missing}, indent=2))
    if missing:
        print(
            f"error: wheels pull: {repository} has no artifact for {', '.join(missing)} (fix: push it from "
            "a machine whose cache holds it, `build.py wheels push`, or build it)",
            file=sys.stderr,
        )
        return EXIT_INPUT
    return 0


def cmd_remove(args) -> int:
    cache = WheelCache()
    for key in [cache.resolve(k) for k in args.keys]:
        cache.remove(key)
        print(f"removed {key}")
    return 0


def cmd_add(args) -> int:
    # deferred: import cost: loaded only when `wheels add` runs, not to build the parser
    from mtpimage.assembly.sitewheel import add

    m = load_for(args)
    # the same plan a build of this profile makes (substitutions included): the same key
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    entry, added = add(m, plan, args.package, args.wheel, args.sha256)
    if getattr(args, "json", False):
        print(json.dumps({"added": added, **_row(entry)}, indent=2))
    elif added:
        print(
            f"added {entry.key[:KEY_WIDTH]}  {entry.filename}  sha256 {entry.sha256[:KEY_WIDTH]}: "
            f"builds of {plan.profile} install it instead of compiling {args.package}"
        )
    else:
        print(f"already there {entry.key[:KEY_WIDTH]}  {entry.filename}  sha256 {entry.sha256[:KEY_WIDTH]}")
    return 0


def cmd_pin(args) -> int:
    # deferred: import cost: loaded only when `wheels pin` runs, not to build the parser
    from mtpimage.assembly import wheelcheck

    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    done, path = wheelcheck.pin(m, plan, WheelCache(), args.package)
    for p in done:
        state = "pinned       " if p.added else "already there"
        print(f"{state} {p.key[:KEY_WIDTH]}  {p.pin.name}  {p.pin.filename}  sha256 {p.pin.sha256}")
    if any(p.added for p in done):
        print(f"wrote {path}: review and commit it with the manifests")
    return 0


def cmd_verify(args) -> int:
    # deferred: import cost: loaded only when `wheels verify` runs, not to build the parser
    from mtpimage.assembly import extbuild, wheelcheck

    m = load_for(args)
    subs = substitutions_of(args)

    def plan_of(manifests, name):
        return plan_for(manifests, name, getattr(args, "sets", None), **subs)

    profiles = [args.profile] if args.profile else m.names()
    rendered, pkg, key = wheelcheck.locate(m, args.key, profiles, plan_of)
    wheelcheck.something_to_compare(m.root, key, WheelCache())

    def progress(msg: str) -> None:  # the build's own progress goes to stderr
        print(msg, file=sys.stderr, flush=True)

    options = BuildOptions(
        ca_bundle=args.ca_bundle,
        netrc=args.netrc,
        no_cache=True,
        mirrors=Mirrors.configured(args.registry_mirror),
    )
    progress(
        f"compile {pkg.name} {pkg.version} for key {key[:KEY_WIDTH]} ({rendered.plan.profile}), no cache"
    )
    builder = extension_builder(rendered, options, progress)
    verdict = wheelcheck.rebuild(
        rendered, pkg, key, builder, extbuild.max_jobs(rendered.plan.ext_max_jobs), WheelCache()
    )
    for line in verdict.lines():
        print(line)
    problem = verdict.problem()
    if problem:
        raise wheelcheck.WheelNotReproduced(problem)
    print(
        f"identical: the {pkg.name} wheel of key {key[:KEY_WIDTH]} rebuilds to its "
        + (
            "pin"
            if verdict.pin
            else "cache entry (not pinned yet: `wheels pin`)"
            if verdict.cached
            else "own bytes (nothing to compare with: not pinned, not cached)"
        )
    )
    return 0


def cmd_build(args) -> int:
    # deferred: import cost: loaded only when `wheels build` runs, not to build the parser
    from mtpimage.assembly import extbuild
    from mtpimage.assembly.render import render  # deferred: as above
    from mtpimage.ext import extensions  # deferred: as above
    from mtpimage.lock.lockfile import locked_probes  # deferred: as above
    from mtpimage.plan import rules  # deferred: as above

    m = load_for(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None), **substitutions_of(args))
    built = [p.name for p in extensions.built(plan)]
    for name in args.package or ():
        if name not in built:
            raise InputError(
                "--package",
                name,
                f"is not compiled by profile {plan.profile} (it compiles: {', '.join(built) or 'nothing'})",
                "name one of those, or leave --package out for all of them",
            )
    # the same rules as the main job: an architecture an extension cannot target stops here
    failed = rules.errors(rules.evaluate(plan, locked_probes(m, plan), "lock", rules.facts_for(m.root)))
    for r in failed:
        print(f"ERROR {r.rule.id}: {r.detail} (fix: {r.rule.fix})", file=sys.stderr)
    if failed:
        return EXIT_RULES
    rendered = render(plan, m.root)
    options = BuildOptions(
        ca_bundle=args.ca_bundle,
        netrc=args.netrc,
        mirrors=Mirrors.configured(args.registry_mirror),
    )

    def progress(msg: str) -> None:
        print(msg, flush=True)

    wheels = extbuild.ensure_wheels(
        rendered,
        *extension_builder(rendered, options, progress),
        progress,
        jobs=extbuild.max_jobs(plan.ext_max_jobs),
        only=frozenset(args.package) if args.package else None,
    )
    for name, w in wheels.items():
        stage = rendered.recipe.builder(name)
        print(f"built   {name:<24} {w.path}  sha256 {w.sha256}  key {stage.key[:KEY_WIDTH]}")
    return 0


class ArchsMissing(EnvironmentProblem):
    """A cached wheel without the GPU code its key promises (exit 3, as a pin mismatch)."""


def cmd_archs(args) -> int:
    from mtpimage.ext import devicecode  # deferred: import cost: cuobjdump parsing only for `wheels archs`

    cuobjdump = devicecode.find_cuobjdump(args.cuobjdump)
    cache = WheelCache()
    keys = [cache.resolve(k) for k in args.keys] if args.keys else cache.keys()
    report, problems = [], []
    for key in keys:
        entry = cache.get(key)
        if entry is None:
            raise InputError("wheel key", key, "is not in the wheel cache", "`wheels list` names the keys")
        wanted = list((entry.meta.get("inputs") or {}).get("archs") or [])
        code = devicecode.read_wheel(entry.path, cuobjdump)
        missing = code.missing(wanted)
        report.append({"key": key, "archs": wanted, **code.to_dict(), "missing": [list(m) for m in missing]})
        if args.json:
            continue
        print(f"{key[:KEY_WIDTH]}  {entry.filename}  key archs: {', '.join(wanted) or '-'}")
        for m in code.modules:
            sass = ", ".join(f"sm_{a}" for a in m.code.sass) or "none"
            ptx = ", ".join(f"compute_{a}" for a in m.code.ptx) or "none"
            print(f"  {m.name:<56} {_size(m.size):>9}  SASS {sass}; PTX {ptx}")
        for name, arch in code.extra(wanted):
            print(f"  note: {name} also carries sm_{arch}, which the key did not ask for")
        problems += [
            f"{key[:KEY_WIDTH]} {entry.filename}: {name} has no sm_{arch} code, though its key's "
            f"cuda_archs name it"
            for name, arch in missing
        ]
    if args.json:
        print(json.dumps({"wheels": report, "ok": not problems}, indent=2))
    if problems:
        raise ArchsMissing(
            "; ".join(problems)
            + " (fix: the extension's build ignored an arch (rules.yaml gpu_archs says what it targets): "
            "`wheels remove` the key and rebuild, or correct the fact)"
        )
    return 0
