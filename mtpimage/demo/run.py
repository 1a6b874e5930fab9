"""`build.py demo`: the tool end to end on loopback, each step timed, everything made removed.

    host       what the demo needs, checked first (hostcheck.py): one line, one fix
    git        the stand-in upstreams served by a git daemon; github.com rewritten to it
    registry   a registry of its own on a free loopback port
    base       the local Debian base pushed there, so it has a digest to pin
    manifests  a manifests directory with one small profile (manifests.py)
    lock       build.py lock: every pin verified, the Python set resolved, lock.yaml written
    check      build.py check: the compatibility rules
    build      build.py --profile demo --engine buildah: build, in-image checks, local tags
    push       ... --push --registry: the tested image published, the human tag moved last
    pull       the local tags dropped, the image pulled back from the registry by digest
    test       build.py test --image REF@DIGEST --full-checks: the pulled image checked again
    verify     build.py verify: a clean rebuild, compared with the registry's layer by layer

The steps from lock on are the CLI as a user runs it, in child processes, in the demo's
directory (relative paths, so the commands shown can be read), with only the git config and
the cache root pointed at the demo's (GIT_CONFIG_GLOBAL, MTP_CACHE_DIR) and the variables
that would change the plan (substitutions, the engine) left out. buildah builds, because
`verify` can pass only for an image built bit for bit.

Teardown, also after a failure, Ctrl-C or SIGTERM (cli.py turns it into an unwinding
exception; the running step is ended first): the local tags the demo set or pulled, the git
daemon, the registry with its storage, the directory with its cache. BuildKit's cache of the
base stays (a cache). After a SIGKILL the janitor (janitor.py) still ends the daemon and the
registry and removes the directory (a step running then fails on its own as its files go);
the local tags stay, as no handler ran to remove them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage import children, engine, janitor, locations
from mtpimage.demo import hostcheck, manifests
from mtpimage.demo.gitserver import serve_git_world
from mtpimage.demo.registry import private_registry
from mtpimage.demo.testbase import DEFAULT_BASE_IMAGE, DOCKER_ENGINE, push_base
from mtpimage.errors import BuilderError, EnvironmentProblem
from mtpimage.settings import local_image

Say = Callable[[str], None]
NAMESPACE = "demo"  # where the demo publishes in its registry
STEPS = (
    "host",
    "git",
    "registry",
    "base",
    "manifests",
    "lock",
    "check",
    "build",
    "push",
    "pull",
    "test",
    "verify",
)
# MTP_* variables that would change the plan or the engine the demo chose: not passed on
DROPPED = ("MTP_SUBSTITUTE_BASE", "MTP_OMIT_PACKAGES", "MTP_ENGINE", "MTP_WHEEL_CACHE_REPO")
FAILED_TAIL = 40  # lines of a failed step's stderr shown


class StepFailed(BuilderError):
    """A CLI step ended with an error; exits with that step's status."""

    def __init__(self, step: str, code: int, error: str):
        # the step's own status (2 input, 3 environment, 1 a check); a step ended by a signal
        # (negative) or that could not run (126+) is a failed step: 1
        self.exit_code = code if 0 < code < 126 else 1
        super().__init__(f"demo: step {step} failed (exit {code}): {error or 'see its output above'}")


@dataclass(frozen=True)
class StepTime:
    name: str
    seconds: float


@dataclass
class Report:
    """What ran, how long each step took, and what the teardown removed."""

    steps: list[StepTime] = field(default_factory=list)
    seconds: float = 0.0
    image: str = ""  # REGISTRY/demo/mtp-verl@sha256:... once pushed
    removed: list[str] = field(default_factory=list)


def program() -> tuple[list[str], str]:
    """(argv prefix that runs this tool's CLI, how it is shown): build.py from a checkout,
    the installed package's cli.main otherwise."""
    if locations.CHECKOUT is not None:
        return [sys.executable, str(locations.CHECKOUT / "build.py")], "build.py"
    return [sys.executable, "-c", "import sys; from mtpimage.cli import main; sys.exit(main())"], (
        "mtp-image-builder"
    )


def last_error(lines: list[str]) -> str:
    """The step's own one-line error (the CLI's contract: `error: ...`, or `internal error:
    ...`), else its last line."""
    said = [line for line in lines if line.startswith(("error: ", "internal error: "))]
    if said:
        return said[-1].removeprefix("error: ")
    rest = [line for line in lines if line.strip()]
    return rest[-1].strip() if rest else ""


def child_env(work: Path, git_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(git_env)
    env["MTP_CACHE_DIR"] = str(work / "cache")
    env["PYTHONUNBUFFERED"] = "1"  # the step's lines as they come, not when it ends
    return env


class Demo:
    def __init__(self, base_source: str, say: Say, warn: Say):
        self.base_source = base_source
        self.say, self.warn = say, warn
        self.report = Report()
        self.made: list[str] = []  # local references the demo tagged or pulled, in order
        self.build_tags: list[str] = []  # the build step's (dropped before the pull)
        self.built_id: str | None = None
        self.work: Path | None = None
        self.env: dict[str, str] = {}
        self.address = ""  # host:port of the demo's registry
        # the local tags and pulls are dockerd's; the steps' builds pass --engine themselves
        self.engine = engine.named(DOCKER_ENGINE)

    # ------------------------------------------------------------------ step plumbing
    def _header(self, name: str, what: str) -> float:
        n = STEPS.index(name) + 1
        self.say(f"[{n:>2}/{len(STEPS)}] {name:<9} {what}")
        return time.monotonic()

    def _done(self, name: str, started: float, detail: str = "") -> None:
        took = time.monotonic() - started
        self.report.steps.append(StepTime(name, took))
        self.say(f"        ok {took:6.1f} s{f'  {detail}' if detail else ''}")

    def _cli(self, name: str, what: str, *args: str) -> None:
        """One step as a user runs it: the command shown, its stdout as it comes (indented),
        its stderr kept in a log and shown (the end of it) only when it fails."""
        started = self._header(name, what)
        prefix, shown = program()
        self.say(f"        $ {shown} {' '.join(shlex.quote(a) for a in args)}")
        log_path = self.work / "logs" / f"{name}.log"
        log_path.parent.mkdir(exist_ok=True)
        with open(log_path, "wb") as log:
            proc = children.spawn(
                [*prefix, *args], cwd=self.work, env=self.env, stdout=subprocess.PIPE, stderr=log
            )
            try:
                for raw in proc.stdout:
                    self.say("        " + raw.decode(errors="replace").rstrip())
                code = proc.wait()
            except BaseException:  # Ctrl-C reached it too; SIGTERM reached only us
                children.end(proc, grace=60)
                raise
        if code != 0:
            lines = log_path.read_text(errors="replace").splitlines()
            for line in lines[-FAILED_TAIL:]:
                self.warn(f"        ! {line}")
            raise StepFailed(name, code, last_error(lines))
        self._done(name, started)

    def _summary(self, name: str) -> dict:
        path = self.work / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def _remember(self, step: str) -> None:
        """The local tags a step set, for the pull step and the teardown, from its summary
        (written on failure too): the build's identity and human tags, and the push's
        registry-named ones (`docker push` needs a local tag of that name)."""
        summary = self._summary(step)
        refs = list(summary.get("references") or [])
        if step == "build" and summary.get("image"):
            self.built_id = self.engine.image_id(summary["image"])
            refs = [summary["image"], local_image(manifests.PROFILE)]
        for ref in refs:
            if ref not in self.made:
                self.made.append(ref)
                self.build_tags.append(ref)

    # ------------------------------------------------------------------ the demo
    def run(self) -> Report:
        begun = time.monotonic()
        started = self._header("host", "what the demo needs on this machine")
        host = hostcheck.check(self.base_source)
        self._done("host", started, host.line())
        self.work = Path(tempfile.mkdtemp(prefix="mtp-demo-"))
        janitor.guard(self.work)  # a SIGKILLed demo's daemon, registry and directory go too
        self.say(f"        work directory {self.work} (removed at the end); the steps below run there")
        try:
            with contextlib.ExitStack() as servers:
                self._setup(servers)
                self._steps()
        finally:
            self._teardown()
            self.report.seconds = time.monotonic() - begun
        return self.report

    def _setup(self, servers: contextlib.ExitStack) -> None:
        started = self._header("git", "stand-in upstream repositories, served on loopback")
        world = servers.enter_context(serve_git_world(self.work / "git"))
        servers.callback(self.report.removed.append, f"git daemon {world.daemon.url}")
        names = ", ".join(f"{r.owner}/{r.name}" for r in world.repos.all())
        self._done("git", started, f"{names} at {world.daemon.url}; github.com rewritten there")
        self.env = child_env(self.work, world.env)

        started = self._header("registry", "a registry of the demo's own")
        self.address = servers.enter_context(private_registry(self.work / "registry"))
        servers.callback(self.report.removed.append, f"registry {self.address}")
        self._done("registry", started, f"{self.address} (storage in the work directory)")

        started = self._header("base", f"{self.base_source} + a python3.12 link, pushed for a digest")
        base = push_base(self.address, self.base_source)
        self.made.append(base.tagged)
        self._done("base", started, base.ref)

        started = self._header("manifests", f"profile {manifests.PROFILE}: the stand-ins, the base by digest")
        manifests.write(self.work / "manifests", world.repos, base)
        self._done("manifests", started, "manifests/components.yaml, manifests/profiles/demo.yaml")

    def _steps(self) -> None:
        m = ("--manifests", "manifests")
        profile = ("--profile", manifests.PROFILE)
        registry = f"{self.address}/{NAMESPACE}"
        self._cli("lock", "resolve and verify every pin, write lock.yaml", *m, "lock")
        self._cli("check", "the compatibility rules", *m, "check")
        try:
            self._cli(
                "build",
                "build (buildah, bit for bit), run the in-image checks, tag",
                *m,
                *profile,
                "--engine",
                "buildah",
                "--summary-file",
                "build.json",
            )
        finally:
            self._remember("build")
        try:
            self._cli(
                "push",
                "publish the tested image",
                *m,
                *profile,
                "--engine",
                "buildah",
                "--push",
                "--registry",
                registry,
                "--summary-file",
                "push.json",
            )
        finally:
            self._remember("push")
        pushed = self._summary("push")
        name = pushed["references"][0].rsplit(":", 1)[0]
        self.report.image = f"{name}@{pushed['digest']}"
        self._pull(self.report.image)
        self._cli(
            "test",
            "the in-image checks, again, on the pulled image",
            *m,
            "test",
            *profile,
            "--image",
            self.report.image,
            "--full-checks",
        )
        self._cli(
            "verify",
            "rebuild on a clean builder, compare with the registry's image",
            *m,
            "verify",
            *profile,
            "--image",
            self.report.image,
        )

    def _pull(self, ref: str) -> None:
        """What a cluster does: the image from the registry by digest, with nothing of the
        build left locally (the tags dropped, so the image and its own layers are gone)."""
        started = self._header("pull", "drop the local tags, pull the published image by digest")
        eng = self.engine
        for local in self.build_tags:  # the base stays: verify's rebuild pulls it by digest
            self._untag(local)
        if self.built_id and eng.image_id(self.built_id) is not None:
            raise EnvironmentProblem(
                f"demo: image {self.built_id[:19]} is still in the local engine after its tags were "
                "removed (another tag or a container holds it), so a pull would prove nothing "
                "(fix: docker image ls and docker ps -a name what holds it)"
            )
        self.say(f"        $ docker pull {ref}")
        eng.pull(ref)
        self.made.append(ref)
        pulled = eng.image_id(ref)
        if pulled != self.built_id:
            raise EnvironmentProblem(
                f"demo: the registry served image {pulled} for {ref}, not {self.built_id}, the one "
                "built and tested (fix: report it: the push must upload the tested image's bytes)"
            )
        self._done("pull", started, f"image {pulled[:19]}: the one built and tested")

    def _untag(self, ref: str) -> bool:
        """Remove a local reference the demo made; the human tag only while it still names
        the demo's image (another run may have moved it since)."""
        eng = self.engine
        found = eng.image_id(ref)
        if found is None:
            return False
        # a human tag (mtp-verl:demo, REGISTRY/demo/mtp-verl:demo) may have been moved by
        # another run since: removed only while it names this run's image
        human = ref.rsplit("/", 1)[-1] == local_image(manifests.PROFILE)
        if human and found != self.built_id:
            return False
        eng.untag(ref)
        return eng.image_id(ref) is None

    def _teardown(self) -> None:
        removed = self.report.removed
        for ref in reversed(self.made):
            try:
                if self._untag(ref):
                    removed.append(ref)
            except BuilderError as exc:  # dockerd went away: say so, go on with the rest
                self.warn(f"demo: could not remove {ref}: {exc.one_line()}")
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            if self.work.exists():
                self.warn(f"demo: could not remove all of {self.work}")
            else:
                removed.append(str(self.work))
        self.say(f"teardown: removed {'; '.join(removed) if removed else 'nothing (nothing was made)'}")


def run(base_source: str = DEFAULT_BASE_IMAGE, say: Say = print, warn: Say = print) -> Report:
    return Demo(base_source, say, warn).run()
