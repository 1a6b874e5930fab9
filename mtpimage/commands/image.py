"""Render, build, test and publish images (issue 4).

  python build.py render --profile NAME [--out DIR]
  python build.py test --profile NAME [--image REF] [--gpu]
  python build.py --profile NAME [--push --registry HOST[:PORT]/NS] [--ca-bundle PATH] ...

The main job: render -> (up to date? stop) -> fetch sources -> BuildKit build (untagged)
-> in-image checks -> local tags -> [push content tag -> move the profile tag].
Nothing is tagged before the checks passed; a failed push rolls back what this run tagged.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from .. import engine, imagetest, publish, sizes, sources
from ..errors import EXIT_RULES, BuilderError, EnvironmentProblem
from ..plan import IMAGE_REPOSITORY, Plan
from ..render import Rendered, render
from ..versionvector import identity_labels


class TestsFailed(BuilderError):
    exit_code = EXIT_RULES


def _say(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------- helpers
def _rendered(args, manifests, plan: Plan) -> Rendered:
    return render(plan, manifests.root)


def _local_id(ref: str) -> str | None:
    proc = engine.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _registry_of(image: str) -> str:
    first = image.split("/")[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return "registry-1.docker.io" if first == "docker.io" else first
    return "registry-1.docker.io"


def base_preflight(plan: Plan) -> None:
    """The base must be present locally or its registry reachable; say which, clearly."""
    import requests  # lazy: ~60 ms, only needed when a registry is involved
    base = plan.base_image
    if _local_id(base) is not None:
        return
    host = _registry_of(base)
    scheme = "http" if host.split(":")[0].startswith("127.") or host.startswith("localhost") else "https"
    try:
        requests.get(f"{scheme}://{host}/v2/", timeout=5)
    except requests.RequestException as exc:
        raise EnvironmentProblem(
            f"base image {base} is not present locally and its registry {host} cannot be reached "
            f"({publish.network_reason(exc)}) (fix: `docker pull` or `docker load` it on this machine, or "
            "build where the registry is reachable; real profiles need their real CUDA base)")


def build_image(args, plan: Plan, rendered: Rendered) -> str:
    from ..buildctx import build_context

    base_preflight(plan)
    t0 = time.monotonic()
    context = build_context(rendered, progress=_say)
    kit = engine.detect()
    _say(f"build   {rendered.identity} with {kit.describe()}")
    progress = getattr(args, "progress", None) or ("tty" if sys.stderr.isatty() else "plain")
    req = engine.BuildRequest(
        context_tar=context, labels=identity_labels(rendered.identity),
        ca_bundle=getattr(args, "ca_bundle", None), netrc=getattr(args, "netrc", None),
        builder=getattr(args, "builder", None), progress=progress,
        no_cache=getattr(args, "no_cache", False),
        cache_from=tuple(getattr(args, "cache_from", None) or ()),
        cache_to=tuple(getattr(args, "cache_to", None) or ()))
    image_id = engine.build(req)
    _say(f"built   {image_id[:19]} in {time.monotonic() - t0:.1f}s (untagged until its checks pass)")
    sizes.after_build(plan, image_id, _say)   # per-layer sizes; a size budget fails before any tag
    return image_id


def run_tests(image: str, gpu: bool) -> imagetest.TestReport:
    _say(f"test    in-image checks on {image[:40]}")
    report = imagetest.run_checks(image, gpu=gpu)
    _say(report.table())
    return report


def _tag(src: str, ref: str) -> None:
    engine.docker("tag", src, ref)


def _untag(ref: str) -> None:
    engine.docker("image", "rm", "--no-prune", ref, check=False)


# docker push retries blob uploads itself but not the manifest PUT that ends a push; the
# tool re-runs the whole push (blobs already there are skipped) on anything but these.
PUSH_PERMANENT = ("denied", "unauthorized", "authentication required", "forbidden",
                  "name unknown", "name invalid", "manifest invalid", "tag invalid",
                  "no such image", "does not exist", "an image does not exist locally")


class PushFailed(EnvironmentProblem):
    def __init__(self, ref: str, stderr: str):
        self.stderr = stderr.strip()[-300:]
        self.transient = not any(p in stderr.lower() for p in PUSH_PERMANENT)
        host = ref.split("/")[0]
        fix = (f"check that registry {host} runs and answers, then run again" if self.transient
               else f"docker login {host} with a user that may push there, or use another --registry")
        super().__init__(f"docker push {ref} failed: {' '.join(self.stderr.split())} (fix: {fix}; "
                         "no tag was moved)")


def _push(ref: str) -> None:
    _say(f"push    {ref}")
    attempts = sources._attempts()

    def once() -> None:
        proc = engine.docker("push", ref, check=False, timeout=3600)
        if proc.returncode != 0:
            raise PushFailed(ref, proc.stderr.decode(errors="replace"))

    def before_sleep(state) -> None:
        err = state.outcome.exception()
        _say(f"retry   {ref}: attempt {state.attempt_number}/{attempts} failed "
             f"({' '.join(err.stderr.split())[-160:]}); pushing again in {state.next_action.sleep:.1f} s")

    Retrying(stop=stop_after_attempt(attempts),
             wait=wait_exponential(multiplier=0.5, max=sources._wait_max()),
             retry=retry_if_exception(lambda e: isinstance(e, PushFailed) and e.transient),
             before_sleep=before_sleep, reraise=True)(once)


def print_pulls(reg: publish.Registry, digest: str, as_json: bool = False) -> None:
    pulls = publish.pull_strings(reg, IMAGE_REPOSITORY, digest)
    _say(f"digest  {digest}")
    for key in ("docker", "pyxis", "enroot", "apptainer"):
        _say(f"{key:<9} {pulls[key]}")


# ----------------------------------------------------------------------------- publish
def publish_image(args, plan: Plan, rendered: Rendered, reg: publish.Registry) -> str:
    import requests  # lazy: ~60 ms, only needed when a registry is involved
    content = reg.ref(IMAGE_REPOSITORY, rendered.identity)
    human = reg.ref(IMAGE_REPOSITORY, plan.profile)
    local = f"{IMAGE_REPOSITORY}:{rendered.identity}"
    had_content = reg.manifest_digest(IMAGE_REPOSITORY, rendered.identity)
    prev_local = {ref: _local_id(ref) for ref in (content, human)}
    try:
        _tag(local, content)
        if had_content is None:
            _push(content)
        digest = reg.manifest_digest(IMAGE_REPOSITORY, rendered.identity)
        if digest is None:
            raise EnvironmentProblem(f"pushed {content} but the registry does not list it")
        if reg.manifest_digest(IMAGE_REPOSITORY, plan.profile) != digest:
            _tag(local, human)
            _push(human)
            if reg.manifest_digest(IMAGE_REPOSITORY, plan.profile) != digest:
                raise EnvironmentProblem(f"{human} does not point at {digest} after the push")
        return digest
    except BaseException:
        # Roll back what this run tagged: local registry-prefixed tags, and a content tag
        # this run created in the registry (its manifest, by digest).
        for ref, prev in prev_local.items():
            if prev is None:
                _untag(ref)
            else:
                _tag(prev, ref)
        if had_content is None:
            digest = None
            try:
                digest = reg.manifest_digest(IMAGE_REPOSITORY, rendered.identity)
                if digest:
                    requests.delete(f"{reg.base_url}/v2/{reg.repo_path(IMAGE_REPOSITORY)}/manifests/{digest}",
                                    timeout=20)
            except Exception:  # noqa: BLE001 - best effort; the original error matters
                pass
        raise


# ----------------------------------------------------------------------------- commands
def cmd_render(args) -> int:
    from ..cli import plan_for

    m = _manifests(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None))
    rendered = render(plan, m.root)
    out = Path(args.out) if args.out else Path("out") / plan.profile
    rendered.write(out)
    if getattr(args, "json", False):
        print(json.dumps({"profile": plan.profile, "identity": rendered.identity,
                          "image": rendered.image(), "context_digest": rendered.context_digest,
                          "out": str(out), "files": sorted(rendered.files)}, indent=2))
    else:
        _say(f"rendered {plan.profile} -> {out}/Dockerfile ({len(rendered.files)} files)")
        _say(f"identity {rendered.image()}   context sha256:{rendered.context_digest}")
    return 0


def _manifests(args):
    from .. import manifest

    return manifest.load(getattr(args, "manifests", None))


def cmd_test(args) -> int:
    from ..cli import plan_for

    m = _manifests(args)
    plan = plan_for(m, args.profile, getattr(args, "sets", None))
    image = args.image
    if image is None:
        rendered = render(plan, m.root)
        image = f"{IMAGE_REPOSITORY}:{rendered.identity}"
        if _local_id(image) is None:
            _say(f"{image} is not built yet: building it (untagged) to test it")
            image = build_image(args, plan, rendered)
    report = run_tests(image, args.gpu)
    if not report.ok:
        raise TestsFailed(f"in-image checks failed for {image}: "
                          + "; ".join(f"{r['id']}: {r['detail']}" for r in report.results
                                      if r["status"] == "fail")[:1500])
    return 0


def run_main(args, manifests, plan: Plan, results) -> int:
    summary = {"profile": plan.profile, "image": None, "pushed": False, "references": [],
               "digest": None, "up_to_date": False}
    try:
        return _run_main(args, manifests, plan, summary)
    finally:
        if getattr(args, "summary_file", None):
            # Written on failure too, so CI's job summary can say how far the run got.
            path = Path(args.summary_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _run_main(args, manifests, plan: Plan, summary: dict) -> int:
    rendered = render(plan, manifests.root)
    local = f"{IMAGE_REPOSITORY}:{rendered.identity}"
    human_local = f"{IMAGE_REPOSITORY}:{plan.profile}"
    reg = None
    if args.push or args.registry:
        if not (args.push and args.registry):
            from ..errors import InputError
            raise InputError("--push", None, "--push and --registry go together",
                             "use --push --registry HOST[:PORT]/NAMESPACE")
        reg = publish.Registry.parse(args.registry)
    _say(f"image   {local}")
    summary["image"] = local
    local_id = _local_id(local)
    remote = reg.manifest_digest(IMAGE_REPOSITORY, rendered.identity) if reg else None
    if reg is None:
        return _build_or_find(args, plan, rendered, reg, local_id, remote, summary)
    # With a registry, a failed push must leave no new tag anywhere: the local tags this run
    # sets or moves are put back as they were (README, "Publish only after the tests pass").
    before = {local: local_id, human_local: _local_id(human_local)}
    try:
        return _build_or_find(args, plan, rendered, reg, local_id, remote, summary)
    except BaseException:
        notes = _restore_local_tags(before)
        if notes:
            _say("rolled back " + "; ".join(notes))
        raise


def _restore_local_tags(before: dict[str, str | None]) -> list[str]:
    notes = []
    for ref, prev in before.items():
        try:
            if _local_id(ref) == prev:
                continue
            if prev is None:
                _untag(ref)
                notes.append(f"removed the new local tag {ref}")
            else:
                _tag(prev, ref)
                notes.append(f"{ref} points at {prev[:19]} again")
        except Exception:  # noqa: BLE001 - best effort; the original error matters
            notes.append(f"could not restore {ref}")
    return notes


def _build_or_find(args, plan: Plan, rendered: Rendered, reg, local_id, remote, summary: dict) -> int:
    local = f"{IMAGE_REPOSITORY}:{rendered.identity}"
    human_local = f"{IMAGE_REPOSITORY}:{plan.profile}"
    if local_id is not None or remote is not None:
        human_ok = reg is None or (remote is not None and
                                   reg.manifest_digest(IMAGE_REPOSITORY, plan.profile) == remote)
        if local_id is not None and _local_id(human_local) != local_id:
            _tag(local_id, human_local)
        if human_ok:
            where = "locally" if reg is None else f"locally and in {reg.host}" if local_id else f"in {reg.host}"
            _say(f"up to date: {local} exists {where}; nothing to build")
            summary["up_to_date"] = True
            if reg is not None:
                summary.update(digest=remote, references=[reg.ref(IMAGE_REPOSITORY, rendered.identity),
                                                          reg.ref(IMAGE_REPOSITORY, plan.profile)])
                print_pulls(reg, remote)
            return 0
        if local_id is None:
            raise EnvironmentProblem(f"{reg.ref(IMAGE_REPOSITORY, rendered.identity)} exists but "
                                     f"{reg.ref(IMAGE_REPOSITORY, plan.profile)} does not point at it "
                                     f"(fix: docker pull it, then run again to move the tag)")
        _say(f"up to date: {local} exists locally; publishing it")
    else:
        image_id = build_image(args, plan, rendered)
        report = run_tests(image_id, getattr(args, "gpu", False))
        if not report.ok:
            raise TestsFailed(f"in-image checks failed; no tag was set or moved "
                              f"(image {image_id[:19]} left untagged)")
        _tag(image_id, local)
        _tag(image_id, human_local)
        _say(f"tagged  {local} and {human_local}")
    if reg is not None:
        digest = publish_image(args, plan, rendered, reg)
        _say(f"pushed  {reg.ref(IMAGE_REPOSITORY, rendered.identity)} and moved "
             f"{reg.ref(IMAGE_REPOSITORY, plan.profile)}")
        summary.update(pushed=True, digest=digest,
                       references=[reg.ref(IMAGE_REPOSITORY, rendered.identity),
                                   reg.ref(IMAGE_REPOSITORY, plan.profile)])
        print_pulls(reg, digest)
    return 0


# ----------------------------------------------------------------------------- plug-in
def _build_options(p: argparse.ArgumentParser, main: bool) -> None:
    d = argparse.SUPPRESS if not main else None
    p.add_argument("--ca-bundle", type=Path, default=d, metavar="PATH",
                   help="CA bundle for HTTPS inside the build (a BuildKit secret: in no layer, label or log)")
    p.add_argument("--netrc", type=Path, default=d, metavar="PATH",
                   help="netrc with index tokens for pip inside the build (a BuildKit secret)")
    p.add_argument("--builder", default=d, metavar="NAME", help="buildx builder (remote BuildKit) to build on")
    p.add_argument("--progress", default=d, choices=["auto", "plain", "tty"],
                   help="BuildKit progress output (default: tty on a terminal, else plain)")
    p.add_argument("--no-cache", action="store_true", default=d if not main else False,
                   help="build without the BuildKit cache")
    p.add_argument("--gpu", action="store_true", default=d if not main else False,
                   help="also run the GPU check in the test container (needs a GPU)")


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser("render", help="write the Dockerfile and build context of a profile")
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--out", type=Path, help="output directory (default: out/<profile>)")
    p.set_defaults(func=cmd_render)

    p = subparsers.add_parser("test", help="run the in-image checks of a profile's image in a container")
    add_common(p)
    p.add_argument("--profile", required=True)
    p.add_argument("--image", help="image to test (default: the profile's identity tag; built if missing)")
    _build_options(p, main=False)
    p.set_defaults(func=cmd_test, gpu=False, ca_bundle=None, netrc=None, builder=None,
                   progress=None, no_cache=False)


def add_main_options(parser) -> None:
    parser.add_argument("--cache-from", action="append", metavar="SPEC",
                        help="BuildKit cache source, e.g. type=registry,ref=REG/mtp-verl:buildcache (repeatable)")
    parser.add_argument("--cache-to", action="append", metavar="SPEC",
                        help="BuildKit cache export (buildx only), e.g. type=registry,ref=...,mode=max")
    parser.add_argument("--summary-file", type=Path, metavar="PATH",
                        help="write a JSON summary (profile, image, pushed, references, digest) for CI")
    parser.add_argument("--push", action="store_true", help="push after the tests pass (needs --registry)")
    parser.add_argument("--registry", metavar="HOST[:PORT]/NAMESPACE", help="registry to publish to")
    _build_options(parser, main=True)
