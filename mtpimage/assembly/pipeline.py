"""The main job (`python3 build.py --profile NAME`), as one sequence of steps:

    frozen check -> render -> up to date? -> build (untagged) -> test -> tag -> push

Each step is a function below and `run()` calls them in this order; nothing is tagged
before the checks passed, and with a registry a failed step puts back every local tag the
run set or moved (release.py rolls back the registry). The command line is parsed in
commands/ and handed over as a MainJob; progress goes to `say`; `run()` returns a JobResult
(built or up to date, the reference, the image ID), which is all build.py's fast path
remembers a run by.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage import engine, invocation
from mtpimage.assembly import extbuild, formattags, imagetest, release, sbom, sizes
from mtpimage.assembly.buildctx import build_context, fetch_sources_first
from mtpimage.assembly.render import Rendered, render
from mtpimage.assembly.versionvector import LABEL_NS, identity_labels
from mtpimage.engine import buildlog
from mtpimage.errors import EXIT_RULES, BuilderError, EnvironmentProblem
from mtpimage.ext import extensions
from mtpimage.imageref import ImageRef, Registry
from mtpimage.lock import lockfile
from mtpimage.lock.pydeps import probe_index
from mtpimage.manifests.manifest import Manifests
from mtpimage.mirrors import INDEX_SETTING, BuildMirrors, MirroredBase, Mirrors, redact
from mtpimage.plan.model import IMAGE_REPOSITORY, Plan
from mtpimage.publish import baseplatform, imageindex, pullneeds, sbomattach
from mtpimage.publish.registryclient import RegistryClient, RegistryUnreachable, answers

Say = Callable[[str], None]


def _say(msg: str) -> None:
    print(msg, flush=True)


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr)


class TestsFailed(BuilderError):
    exit_code = EXIT_RULES


BUILT, UP_TO_DATE = "built", "up to date"


def image_line(ref: str) -> str:
    """The line that names the image a run is about (its first line of progress)."""
    return f"image   {ref}"


def up_to_date_line(ref: str, where: str = "locally") -> str:
    return f"up to date: {ref} exists {where}; nothing to build"


@dataclass(frozen=True)
class JobResult:
    """What a main job that succeeded did: the contract between the pipeline and its callers
    (the CLI's exit status, build.py's fast-path memo). Failures are raised, not returned."""

    state: str  # BUILT or UP_TO_DATE
    ref: str  # the local content tag, mtp-verl:<identity>
    image_id: str | None  # None: up to date in the registry only, not in the local engine
    local_only: bool  # no registry: both local tags are on image_id
    pushed: bool = False
    exit_code: int = 0

    @property
    def rememberable(self) -> bool:
        """A plain local run whose image and both tags are here: the fast path may replay it."""
        return self.local_only and self.image_id is not None

    @property
    def heading(self) -> str:
        return image_line(self.ref)

    @property
    def up_to_date(self) -> str:
        """What this run prints, after its heading, when run again with the image still here."""
        return up_to_date_line(self.ref)


@dataclass(frozen=True)
class BuildOptions:
    """How to build: the engine, BuildKit secrets, mirrors, builder, cache and output (none of
    it in the identity)."""

    # What builds, tags, runs and inspects, picked by name where the command line is read
    # (engine.named: --engine, else MTP_ENGINE, else docker) and passed on from here: every step
    # of a build reads it from its options, none asks for an ambient one.
    engine: engine.ContainerEngine = field(default_factory=engine.named)
    ca_bundle: Path | None = None
    netrc: Path | None = None
    builder: str | None = None
    progress: str | None = None  # None: tty on a terminal, else plain
    no_cache: bool = False
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    # the site's index and registry mirrors (MTP_INDEX_REWRITE, --registry-mirror or
    # MTP_REGISTRY_MIRROR); the environment's unless the command line gave them
    mirrors: Mirrors = field(default_factory=Mirrors.configured)

    def mirrors_for(self, plan: Plan) -> BuildMirrors:
        return build_mirrors(self.mirrors, plan)

    def request(self, context_tar: bytes, labels: dict, plan: Plan, **build) -> engine.BuildRequest:
        """The one place a BuildRequest is made: these options' secrets, builder, progress,
        cache and `plan`'s mirrors, for the image, a stack or a builder stage alike. `build`:
        what that build sets itself (its target and output, its own cache sources, ...)."""
        given = {
            "mirrors": self.mirrors_for(plan),
            "ca_bundle": self.ca_bundle,
            "netrc": self.netrc,
            "builder": self.builder,
            "progress": self.progress or ("tty" if sys.stderr.isatty() else "plain"),
            "no_cache": self.no_cache,
            "cache_from": self.cache_from,
            "cache_to": self.cache_to,
            # named only where it is not the lock's platform: an amd64 build's argv is as before
            "platform": None if plan.platform == baseplatform.BUILD_PLATFORM else plan.platform,
        }
        return engine.BuildRequest(context_tar=context_tar, labels=labels, **{**given, **build})


def build_mirrors(mirrors: Mirrors, plan: Plan) -> BuildMirrors:
    """What a build of `plan` gets: the table of its index URLs, the registry mirrors."""
    return mirrors.for_build(url for _name, url in plan.indexes)


@dataclass(frozen=True)
class MainJob:
    manifests: Manifests
    plan: Plan
    frozen: bool | None = None  # None: frozen when lock.yaml exists
    registry: Registry | None = None  # set: push after the tests pass
    build: BuildOptions = field(default_factory=BuildOptions)
    gpu: bool = False
    full_checks: bool = False  # run every in-image check, none reused (imagetest.run_checks)
    summary_file: Path | None = None


# ----------------------------------------------------------------------------- the steps
def check_frozen(job: MainJob, warn: Say = _warn) -> None:
    """Stop when manifests/ and lock.yaml disagree (unless --no-frozen)."""
    if job.frozen is False:
        return
    if job.frozen is None and not lockfile.lock_path(job.manifests.root).is_file():
        warn(
            f"warning: no {job.manifests.root.name}/lock.yaml: building unlocked pins "
            f"(run `{invocation.command()} lock`)"
        )
        return
    lockfile.check_frozen(job.manifests, job.plan)


def base_preflight(plan: Plan, eng: engine.ContainerEngine, mirrors: BuildMirrors | None = None) -> None:
    """The base must be present in the local engine `eng` or its registry reachable (through a
    registry mirror that serves it: the mirror); say which, clearly."""
    base = plan.base_image
    mirrored = (mirrors or BuildMirrors()).base(base)
    if mirrored is not None:
        ref, mirror = mirrored
        if eng.image_id(ref) is not None:
            return
        try:
            answers(mirror.host)
        except RegistryUnreachable as exc:
            raise MirroredBase(base, ref, mirror).failed(
                f"registry {mirror.host} cannot be reached ({exc.reason})"
            ) from None
        return
    if eng.image_id(base) is not None:
        return
    host = ImageRef.parse(base, flag="base image").host
    try:
        answers(host)
    except RegistryUnreachable as exc:
        raise EnvironmentProblem(
            f"base image {base} is not present locally and its registry {host} cannot be reached "
            f"({exc.reason}) (fix: `docker pull` or `docker load` it on this machine, or "
            "build where the registry is reachable; real profiles need their real CUDA base. "
            "To try the stack on a machine that cannot reach it, build on a local stand-in "
            "base: --substitute-base NAME:TAG@sha256:... (or MTP_SUBSTITUTE_BASE), see docs/real-stack.md)"
        ) from None


# verdicts already given in this process, by (base, lock's record, lock file, mirrors): what
# a registry serves at a digest cannot change, so the main job's two asks cost one look-up
_PLATFORM_VERDICTS: dict[tuple, object] = {}


def base_platform(plan: Plan, manifests_root: Path | None, mirrors: BuildMirrors | None = None):
    """The base read again at its pinned digest, its build-platform manifest compared with the
    one lock.yaml records (publish/baseplatform.py): a baseplatform.Verdict, verified or saying
    why not; a lock that records another manifest is refused (InputError, the fix: lock)."""
    where = lockfile.shown(manifests_root) if manifests_root else lockfile.LOCK_NAME
    relock = lockfile.relock_command(manifests_root) if manifests_root else "python3 build.py lock"
    key = (plan.base_image, plan.base_platform, plan.substitutions, where, mirrors)
    if key in _PLATFORM_VERDICTS:
        return _PLATFORM_VERDICTS[key]
    verdict = baseplatform.verify(plan, where, relock, mirrors)
    if verdict.status in ("verified", "unrecorded"):  # the registry answered: it stays so
        _PLATFORM_VERDICTS[key] = verdict
    return verdict


def base_first(
    plan: Plan, image: str, registry, options: BuildOptions, manifests_root: Path | None = None
) -> None:
    """The base preflight before anything is printed, where the build would need the base: an
    engine that builds from a local base, the image not here, no registry that could answer
    "up to date". With the manifests' root, the base's platform manifest too (a lock that
    records another one stops here, in one line)."""
    eng = options.engine
    if not eng.needs_local_base or registry is not None or eng.image_id(image) is not None:
        return
    mirrors = options.mirrors_for(plan)
    base_preflight(plan, eng, mirrors)
    if manifests_root is not None:
        base_platform(plan, manifests_root, mirrors)


def fetched_indexes(plan: Plan) -> dict[str, str]:
    """{index URL: a project the build fetches from it}: the indexes of the locked rows (build
    backends included), of the packages and of the PyPI components. A git source installed
    from its tree asks an index only for dependencies it declares, which the plan cannot tell."""
    urls = dict(plan.indexes)
    wanted = [(r.index, r.name) for r in plan.locked]
    wanted += [(p.index, p.name) for p in plan.packages if p.build is None]
    wanted += [(c.index, c.package) for c in plan.components if c.source == "pypi"]
    out: dict[str, str] = {}
    for index, project in wanted:
        if index in urls:
            out.setdefault(urls[index], project)
    return out


def index_preflight(plan: Plan, mirrors: BuildMirrors) -> None:
    """Each index mirror the build fetches from answers, asked from here before any build step:
    a mirror that is down fails in one line naming the setting, not after pip's retries in
    the middle of a build (or hours into a compile)."""
    fetched = fetched_indexes(plan)
    for origin, mirror in mirrors.indexes:
        if origin not in fetched:
            continue
        # a page the build asks for (a 404 answers too: pip then names what is missing)
        why = probe_index(origin, fetched[origin])
        if why:
            raise EnvironmentProblem(
                f"the index mirror {redact(mirror)} that {INDEX_SETTING} gives for {origin} does not "
                f"answer: {redact(why)} (fix: start or reach the mirror, or correct {INDEX_SETTING}; "
                "every file is checked against lock.yaml's sha256 whichever index serves it)"
            )


def build_image(plan: Plan, rendered: Rendered, options: BuildOptions, say: Say = _say) -> str:
    """BuildKit build of the rendered context with its sources; returns the untagged image id.
    A size budget the image exceeds fails here, before any tag."""
    eng = options.engine
    if eng.needs_local_base:
        base_preflight(plan, eng, options.mirrors_for(plan))
    say(f"base    {base_platform(plan, rendered.manifests_root, options.mirrors_for(plan)).line}")
    t0 = time.monotonic()
    req = build_request(plan, rendered, options, say)
    say(f"build   {rendered.identity} with {eng.describe()}")
    image_id = eng.build(req)
    say(f"built   {image_id[:19]} in {time.monotonic() - t0:.1f}s (untagged until its checks pass)")
    sizes.after_build(plan, image_id, eng, say)
    return image_id


def build_request(
    plan: Plan, rendered: Rendered, options: BuildOptions, say: Say = _say, labels: dict | None = None
) -> engine.BuildRequest:
    """The image's build: its context (sources, patches, the compiled extensions' wheels)
    and labels (identity_labels, or `labels` given instead: verify takes the published
    image's provenance labels); the same for every engine and for verify's rebuild."""
    mirrors = options.mirrors_for(plan)
    if mirrors.describe():
        say(f"mirrors {mirrors.describe()}")
    index_preflight(plan, mirrors)
    fetch_sources_first(rendered, say)  # every source before the first compile (#38 item 2)
    wheels = extension_wheels(plan, rendered, options, say)
    return options.request(
        build_context(rendered, progress=say, wheels=wheels),
        {**(identity_labels(rendered.identity) if labels is None else labels), **extension_labels(wheels)},
        plan,
    )


def extension_wheels(plan: Plan, rendered: Rendered, options: BuildOptions, say: Say = _say) -> dict:
    """The compiled extensions' wheels, from the wheel cache or built once per key in their
    builder stages (same secrets and builder as the image build); see extbuild.py."""
    if not extensions.built(plan):
        return {}
    context_for, request_for = extension_builder(rendered, options, say)
    return extbuild.ensure_wheels(
        rendered, context_for, request_for, say, jobs=extbuild.max_jobs(plan.ext_max_jobs)
    )


def extension_builder(rendered: Rendered, options: BuildOptions, say: Say = _say):
    """(context_for(name), request_for(context, target, out_dir, build_args)): how extbuild
    runs one extension's builder stage, on this run's engine, secrets and builder."""

    def context_for(name: str) -> bytes:
        return build_context(rendered, progress=say, only_extension=name)

    def request_for(context: bytes, target: str, out_dir: Path, build_args, on_line=None) -> None:
        # a compile's progress replaces its raw output on the terminal; the log keeps it all
        log = buildlog.new_log(target) if on_line is not None else None
        if log is not None:
            say(f"log     {log} (the compiler's full output)")
        options.engine.build(
            options.request(
                context,
                {},
                rendered.plan,
                target=target,
                output_dir=out_dir,
                build_args=tuple(build_args),
                network="host",  # the compile cache is served on the host's loopback
                on_line=on_line,
                cache_from=(),  # the image's caches are not a builder stage's
                cache_to=(),
            ),
            log_path=log,
        )

    return context_for, request_for


def extension_labels(wheels: dict) -> dict[str, str]:
    """Each compiled wheel's sha256 on the image (the rendered version vector holds its key)."""
    return {
        f"{LABEL_NS}.extension.{name}": f"{w.filename} sha256:{w.sha256}"
        for name, w in sorted(wheels.items())
    }


def attach_sbom(
    job: MainJob,
    rendered: Rendered,
    client,
    digest: str,
    fresh: bool,
    summary: dict,
    say: Say = _say,
    pushed: list | None = None,
) -> str:
    """Attach the plan's SBOM (sbom.py) to the pushed image `digest` (sbomattach.py); -> its
    reference. `fresh`: this run built the image, so its SBOM (which knows the wheels it
    compiled) replaces any; otherwise an SBOM already attached stays. With --summary-file it
    is also written beside the summary, as `<profile>.sbom.cdx.json`. `pushed` gets the
    artifact's digest when this call pushed one (for the roll-back of a failed push)."""
    there = None if fresh else sbomattach.attached(client, IMAGE_REPOSITORY, digest)
    if there is not None:
        ref = f"{client.registry.ref(IMAGE_REPOSITORY, sbomattach.sbom_tag(digest))}@{there}"
    else:
        data = sbom.for_rendered(rendered)
        ref = sbomattach.attach(client, IMAGE_REPOSITORY, digest, data, sbom.file_name(job.plan.profile))
        if pushed is not None:
            pushed.append(ref.rsplit("@", 1)[1])
        if job.summary_file:
            job.summary_file.parent.mkdir(parents=True, exist_ok=True)
            (job.summary_file.parent / sbom.file_name(job.plan.profile)).write_bytes(data)
    say(f"sbom    {ref}")
    summary["sbom"] = ref
    return ref


def run_tests(
    image: str, gpu: bool, eng: engine.ContainerEngine, say: Say = _say, full: bool = False
) -> imagetest.TestReport:
    say(f"test    in-image checks on {image[:40]}")
    report = imagetest.run_checks(image, eng, gpu=gpu, full=full)
    say(report.table())
    return report


def say_pulls(ref: ImageRef, say: Say = _say, layer_format: str | None = None) -> None:
    """The digest and a line per client that pulls it; a client that must be a given version
    to read `layer_format` layers (docker 23.0 for zstd) says so on its line."""
    say(f"digest  {ref.digest}")
    needs = pullneeds.pull_needs(layer_format)
    for key, text in ref.pull_strings().items():
        need = f"   # {needs[key]}" if key in needs else ""
        say(f"{key:<9} {text}{need}")


# ----------------------------------------------------------------------------- the job
def run(job: MainJob, say: Say = _say, warn: Say = _warn) -> JobResult:
    """The main job; returns what it did (errors are raised as BuilderError)."""
    check_frozen(job, warn)
    summary = {
        "profile": job.plan.profile,
        "image": None,
        "pushed": False,
        "references": [],
        "digest": None,
        "up_to_date": False,
    }
    try:
        return _build_test_publish(job, summary, say)
    finally:
        if job.summary_file:
            # Written on failure too, so CI's job summary can say how far the run got.
            job.summary_file.parent.mkdir(parents=True, exist_ok=True)
            job.summary_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _build_test_publish(job: MainJob, summary: dict, say: Say) -> JobResult:
    plan, reg = job.plan, job.registry
    rendered = render(plan, job.manifests.root)
    local, human_local = rendered.image(), rendered.profile_image()
    client = None
    if reg is not None:
        client = RegistryClient(reg)
    say(image_line(local))
    summary["image"] = local
    local_id = job.build.engine.image_id(local)
    if reg is None:
        return _steps(job, rendered, client, local_id, None, summary, say)
    tags = formattags.for_format(rendered.identity, plan.profile_tag, job.build.engine.publish_format)
    remote, stale = _remote(client, tags, say)
    # With a registry, a failed push must leave no new tag anywhere: the local tags this run
    # sets or moves are put back as they were (docs/build-test-publish.md, "Publish only after the tests pass").
    before = {local: local_id, human_local: job.build.engine.image_id(human_local)}
    try:
        return _steps(job, rendered, client, local_id, remote, summary, say, tags, stale)
    except BaseException:
        notes = release.restore_local_tags(job.build.engine, before)
        if notes:
            say("rolled back " + "; ".join(notes))
        raise


def _remote(client, tags: formattags.PublishedTags, say: Say) -> tuple[str | None, str | None]:
    """(the digest the content tag of this format names, or None; the other format its
    layers are in when this tool pushed them in another: they are published over)."""
    got = client.manifest(IMAGE_REPOSITORY, tags.content)
    if got is None:
        return None, None
    try:
        stale = formattags.stale_format(json.loads(got[0]), tags.format)
    except ValueError:
        stale = None  # not JSON: the registry's problem, said where the manifest is read
    if stale is None:
        return got[1], None
    say(
        f"note    {client.registry.ref(IMAGE_REPOSITORY, tags.content)} holds {stale} layers "
        f"(pushed before {tags.format} was the format of this tag): publishing {tags.format} over it"
    )
    return None, stale


def _steps(
    job: MainJob,
    rendered: Rendered,
    client,
    local_id,
    remote,
    summary: dict,
    say: Say,
    tags: formattags.PublishedTags | None = None,
    stale: str | None = None,
) -> JobResult:
    plan, reg, eng = job.plan, job.registry, job.build.engine
    local, human_local = rendered.image(), rendered.profile_image()
    if local_id is not None or remote is not None:
        # up to date: the identity names plan + context, so an existing tag is this image
        human_ok = reg is None or (
            remote is not None
            and (
                client.manifest_digest(IMAGE_REPOSITORY, tags.profile) == remote
                # the profile's tag names the multi-arch index that lists this image (issue 49)
                or imageindex.lists(client, IMAGE_REPOSITORY, tags.profile, plan.platform, remote)
            )
        )
        if local_id is not None and eng.image_id(human_local) != local_id:
            eng.tag(local_id, human_local)
        if human_ok:
            where = (
                "locally" if reg is None else f"locally and in {reg.host}" if local_id else f"in {reg.host}"
            )
            say(up_to_date_line(local, where))
            summary["up_to_date"] = True
            if reg is not None:
                attach_sbom(job, rendered, client, remote, False, summary, say)
                _published(summary, reg, tags, remote, say)
            return JobResult(UP_TO_DATE, local, local_id, local_only=reg is None)
        if local_id is None:
            raise EnvironmentProblem(
                f"{reg.ref(IMAGE_REPOSITORY, tags.content)} exists but "
                f"{reg.ref(IMAGE_REPOSITORY, tags.profile)} does not point at it "
                f"(fix: docker pull it, then run again to move the tag)"
            )
        say(f"up to date: {local} exists locally; publishing it")
        state, image_id = UP_TO_DATE, local_id
    else:
        image_id = build_image(plan, rendered, job.build, say)
        report = run_tests(image_id, job.gpu, eng, say, full=job.full_checks)
        summary["checks"] = report.summary()
        if not report.ok:
            raise TestsFailed(
                f"in-image checks failed; no tag was set or moved (image {image_id[:19]} left untagged)"
            )
        eng.tag(image_id, local)
        eng.tag(image_id, human_local)
        say(f"tagged  {local} and {human_local}")
        state = BUILT
    if reg is None:
        return JobResult(state, local, image_id, local_only=True)
    sboms: list[str] = []  # the SBOM this run attached, if any
    image_digest: list[str] = []

    def before_move(d: str) -> None:
        image_digest.append(d)
        attach_sbom(job, rendered, client, d, state == BUILT, summary, say, pushed=sboms)

    try:
        digest = release.publish(
            eng,
            local,
            IMAGE_REPOSITORY,
            tags.content,
            tags.profile,
            reg,
            client,
            say,
            before_move=before_move,
            replace=stale is not None,
        )
    except BaseException:
        # publish rolled the image back; an SBOM whose image is gone would name nothing
        if sboms and _image_gone(client, tags.content):
            sbomattach.detach(client, IMAGE_REPOSITORY, image_digest[0], sboms[0])
            say(f"rolled back the SBOM {sboms[0]}")
        raise
    say(
        f"pushed  {reg.ref(IMAGE_REPOSITORY, tags.content)} and moved "
        f"{reg.ref(IMAGE_REPOSITORY, tags.profile)}"
    )
    summary["pushed"] = True
    _published(summary, reg, tags, digest, say)
    return JobResult(state, local, image_id, local_only=False, pushed=True)


def _image_gone(client, tag: str) -> bool:
    """After a failed push: is the content tag gone from the registry? (No answer: keep.)"""
    try:
        return client.manifest(IMAGE_REPOSITORY, tag, check_header=False) is None
    except Exception:  # noqa: BLE001 - the push's own error matters
        return False


def _published(summary: dict, reg: Registry, tags: formattags.PublishedTags, digest: str, say: Say) -> None:
    """What a run that ends with the image in the registry reports: the summary's digest,
    references and layer format, and the pull strings."""
    summary.update(
        digest=digest,
        references=[reg.ref(IMAGE_REPOSITORY, tags.content), reg.ref(IMAGE_REPOSITORY, tags.profile)],
        layer_format=tags.format,
    )
    say_pulls(reg.image(IMAGE_REPOSITORY, digest=digest), say, tags.format)
