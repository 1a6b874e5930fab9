"""SIGINT during build or test, SIGTERM to the tool alone during a build, and two concurrent
runs of the same profile.

SIGINT (as a terminal's Ctrl-C, to the whole process group) leaves no running container,
none of the tool's temp directories, no tag, and manifests/ (a real lock.yaml, written by
`lock` against the loopback git daemon, included) byte for byte as it was. SIGINT during
`lock` (while git fetches) leaves lock.yaml byte-identical and no half-fetched cache entry. Two concurrent runs both succeed, agree on the image, and leave the source
cache consistent (each archive matches its recorded sha256).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.image_fixtures import REPO, copy_manifests, make_test_base

pytestmark = pytest.mark.timeout(600)
PROFILE = "test-load-only"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    base = make_test_base(docker_host)
    manifests = copy_manifests(tmp_path_factory.mktemp("sigint-manifests") / "manifests", base)
    tmp = tmp_path_factory.mktemp("tool-tmp")
    env = {
        **os.environ,
        **git_world.env,
        "MTP_CACHE_DIR": str(tmp_path_factory.mktemp("src-cache")),
        "MTP_DOCKER_CLI": docker_host.cli,
        "TMPDIR": str(tmp),
    }
    env.pop("MTP_DEBUG", None)
    # a real lock.yaml (builds then run --frozen against it); no index is reachable here
    env["MTP_INDEX_REWRITE"] = "https://pypi.org/simple=http://127.0.0.1:9/simple"
    env.update(MTP_NET_RETRIES="1", MTP_HTTP_TIMEOUT="5")
    locked = subprocess.run(
        [sys.executable, str(REPO / "build.py"), "--manifests", str(manifests), "lock", "--profile", PROFILE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert locked.returncode == 0, locked.stdout + locked.stderr
    assert (manifests / "lock.yaml").is_file()
    return {"host": docker_host, "manifests": manifests, "env": env, "tmp": tmp}


def _ctrl_c_as_a_terminal_sends_it() -> None:
    """SIGINT back to its default in the child: a runner that starts the tests in the
    background (`cmd &` in a script) passes SIGINT ignored, and Python then never raises
    KeyboardInterrupt, so the run could not be interrupted at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen(world, *args):
    return subprocess.Popen(
        [sys.executable, str(REPO / "build.py"), "--manifests", str(world["manifests"]), *args],
        cwd=REPO,
        env=world["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_sends_it,
    )


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _running(world) -> set[str]:
    return set(world["host"].docker("ps", "-q", "--no-trunc").stdout.split())


def _identity(world):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "build.py"),
            "--manifests",
            str(world["manifests"]),
            "render",
            "--profile",
            PROFILE,
            "--json",
            "--out",
            str(world["tmp"] / "r"),
        ],
        cwd=REPO,
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["identity"]


def _forget(world, identity):
    for ref in (f"mtp-verl:{identity}", f"mtp-verl:{PROFILE}"):
        world["host"].docker("image", "rm", "--no-prune", ref, check=False)


def _descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _sigint_to_group(proc) -> None:
    os.killpg(proc.pid, signal.SIGINT)


def _sigterm_to_tool(proc) -> None:
    """As a CI runner cancels a job or `kill` does: the tool alone, not its children."""
    os.kill(proc.pid, signal.SIGTERM)


def _interrupt_when(proc, marker: str, then=None, send=_sigint_to_group) -> str:
    """Read output until `marker`, optionally wait for `then()`, then interrupt (`send`)."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            break
    else:
        proc.wait()
        pytest.fail(f"the run ended before {marker!r}: {''.join(seen)[-3000:]}")
    if then is not None:
        for _ in range(400):
            if then():
                break
            time.sleep(0.05)
    send(proc)
    rest, _ = proc.communicate(timeout=120)
    return "".join(seen) + rest


def _tool_temp(world) -> list[str]:
    return sorted(p.name for p in world["tmp"].iterdir() if p.name.startswith(("mtp-", "tmp")))


@pytest.mark.parametrize(
    "stage,send",
    [("build", _sigint_to_group), ("test", _sigint_to_group), ("build", _sigterm_to_tool)],
    ids=["build-sigint", "test-sigint", "build-sigterm"],
)
def test_interrupt_leaves_no_process_container_temp_dir_tag_or_changed_manifests(world, stage, send):
    identity = _identity(world)
    _forget(world, identity)
    before_manifests = _snapshot(world["manifests"])
    before_running = _running(world)
    before_tmp = _tool_temp(world)
    children: set[int] = set()
    if stage == "build":
        proc = _popen(world, "--profile", PROFILE, "--no-cache")

        def building() -> bool:
            children.update(_descendants(proc.pid))
            return bool(children)

        out = _interrupt_when(proc, "build   ", then=building, send=send)
        if send is _sigterm_to_tool:
            assert proc.returncode == 128 + signal.SIGTERM and "terminated" in out, out[-3000:]
        assert children, "the build started no process to end"
        left = {pid: _cmdline(pid) for pid in children if _alive(pid)}
        assert not left, f"the build outlived the terminated tool: {left}"
    else:
        ok = subprocess.run(
            [
                sys.executable,
                str(REPO / "build.py"),
                "--manifests",
                str(world["manifests"]),
                "--profile",
                PROFILE,
            ],
            cwd=REPO,
            env=world["env"],
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
        proc = _popen(world, "test", "--profile", PROFILE, "--image", f"mtp-verl:{PROFILE}")
        out = _interrupt_when(proc, "test    ", then=lambda: _running(world) - before_running, send=send)
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    time.sleep(0)  # no waiting on docker: the tool removes its container before it exits
    assert _running(world) - before_running == set(), "a test container outlived the interrupted run"
    assert _tool_temp(world) == before_tmp
    assert _snapshot(world["manifests"]) == before_manifests
    if stage == "build":
        assert world["host"].docker("image", "inspect", f"mtp-verl:{identity}", check=False).returncode != 0


def test_two_concurrent_runs_of_one_profile_both_succeed(world):
    identity = _identity(world)
    _forget(world, identity)
    before_manifests = _snapshot(world["manifests"])
    procs = [_popen(world, "--profile", PROFILE) for _ in range(2)]
    outs = [p.communicate(timeout=500)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    host = world["host"]
    ids = {
        host.docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        for ref in (f"mtp-verl:{identity}", f"mtp-verl:{PROFILE}")
    }
    assert len(ids) == 1
    # the one git fetcher's cache: complete trees under their commit, no half-fetched temp dir
    cache = Path(world["env"]["MTP_CACHE_DIR"]) / "git"
    trees = sorted(cache.glob("*/*/.git"))
    assert trees
    for tree in trees:
        head = subprocess.run(
            ["git", "-C", str(tree.parent), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert head == tree.parent.name
    assert not list(cache.glob("*/.*-*")), "a half-fetched source tree was left"
    assert _snapshot(world["manifests"]) == before_manifests


def test_sigint_during_lock_leaves_lock_yaml_and_no_half_fetched_cache(world, tmp_path):
    """`git fetch` is slowed by a `git` wrapper first on PATH (it sleeps, then runs the real
    git), so SIGINT lands while lock fetches a source into the cache."""
    real_git = shutil.which("git")
    shim = tmp_path / "bin"
    shim.mkdir()
    marker = tmp_path / "fetching"
    (shim / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *" fetch "*) touch "{marker}"; sleep 60;; esac\nexec "{real_git}" "$@"\n'
    )
    (shim / "git").chmod(0o755)
    cache = tmp_path / "cache"
    env = {**world["env"], "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "MTP_CACHE_DIR": str(cache)}
    before = _snapshot(world["manifests"])
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "build.py"),
            "--manifests",
            str(world["manifests"]),
            "lock",
            "--profile",
            PROFILE,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_sends_it,
    )
    for _ in range(600):
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=60)[0][-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "interrupted" in out, out[-3000:]
    assert _snapshot(world["manifests"]) == before
    assert not list(world["manifests"].glob(".lock-*")), "a temporary lock.yaml was left"
    half = [p for p in cache.rglob(".*") if p.is_dir()] + [
        p for p in (cache / "git").glob("*/*") if not (p / ".git").is_dir()
    ]
    assert half == [], f"half-fetched cache entries left: {half}"


def test_sigkill_during_a_build_leaves_no_process_and_no_temp_dir(world):
    """SIGKILL runs no handler: the janitor the build's temp directory started ends the
    `docker build` the tool left and removes its TMPDIR/mtp-build-* (issue #35), without
    waiting for the next build."""
    identity = _identity(world)
    _forget(world, identity)
    before_tmp = _tool_temp(world)
    children: set[int] = set()
    proc = _popen(world, "--profile", PROFILE, "--no-cache")

    def building() -> bool:  # docker's build CLI runs (not build.py itself)
        children.update(_descendants(proc.pid))
        return any("docker" in c and " build " in c for c in map(_cmdline, children))

    _interrupt_when(proc, "build   ", then=building, send=lambda p: os.kill(p.pid, signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    assert children, "the build started no process"
    for _ in range(600):  # the janitor looks every 0.2 s; a child gets SIGTERM, then SIGKILL
        left = {
            pid: _cmdline(pid) for pid in children if _alive(pid) and "mtpimage.janitor" not in _cmdline(pid)
        }
        if not left and _tool_temp(world) == before_tmp:
            break
        time.sleep(0.1)
    assert not left, f"the build outlived the killed tool: {left}"
    assert _tool_temp(world) == before_tmp


@pytest.mark.skipif(
    shutil.which("buildah") is None, reason="buildah not installed (scripts/setup-test-host.sh)"
)
def test_sigkill_during_a_reproducible_build_leaves_no_storage_root_or_mount(world):
    """The buildah engine's throwaway storage root (and its overlay mounts) of a killed tool
    are gone as soon as its buildah ends, not at the next build."""
    from mtpimage.engine import buildahengine

    env = {**world["env"], "MTP_ENGINE": "buildah", "MTP_FASTPATH": "0"}
    # --no-cache: a cold build, on a throwaway root (the layer cache's test is below)
    proc = _popen({**world, "env": env}, "--profile", PROFILE, "--no-cache")
    scratch = buildahengine.SCRATCH_PARENT / f"mtp-image-builder-{os.getuid()}" / "buildah"

    def roots() -> list[Path]:
        return sorted(scratch.glob(f"root-{proc.pid}-*")) if scratch.is_dir() else []

    seen: list[Path] = []

    def building() -> bool:
        seen.extend(r for r in roots() if (r / "storage").is_dir())
        return bool(seen)

    _interrupt_when(proc, "build   ", then=building, send=lambda p: os.kill(p.pid, signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    assert seen, "killed before buildah had a storage root: nothing was tested"
    mounts = []
    for _ in range(900):
        mounts = [
            line for line in Path("/proc/mounts").read_text().splitlines() if f"/root-{proc.pid}-" in line
        ]
        if not roots() and not mounts:
            break
        time.sleep(0.1)
    assert not roots() and not mounts, (roots(), mounts)


@pytest.mark.skipif(
    shutil.which("buildah") is None, reason="buildah not installed (scripts/setup-test-host.sh)"
)
def test_sigkill_during_a_build_on_the_layer_cache_leaves_the_cache_without_mounts_or_containers(world):
    """Issue #48: a reproducible build on the layer cache, killed: its buildah ends, its working
    containers and their mounts go, the cache (its layers) stays, and the next build can take it
    (its lock was released with the process)."""
    from mtpimage.engine import buildahengine

    env = {**world["env"], "MTP_ENGINE": "buildah", "MTP_FASTPATH": "0"}
    scratch = buildahengine.SCRATCH_PARENT / f"mtp-image-builder-{os.getuid()}" / "buildah"
    cache = scratch / buildahengine.CACHE_NAME
    proc = _popen({**world, "env": env}, "--profile", PROFILE)

    def building() -> bool:  # buildah runs on the cache (a step may be served from it: no mount)
        for entry in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if f"{cache}/storage".encode() in entry.read_bytes():
                    return True
            except OSError:
                continue
        return False

    _interrupt_when(proc, "build   ", then=building, send=lambda p: os.kill(p.pid, signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    store = buildahengine.Storage.__new__(buildahengine.Storage)
    store.root = cache

    def left() -> tuple[list[str], str, bool]:
        """(merged mounts under the cache, its containers, whether its lock is free): the
        janitor sees the tool gone within 0.2 s, ends its buildah (up to its grace period), then
        empties the cache of what the build left, holding the cache's lock meanwhile."""
        mounts = [
            line
            for line in Path("/proc/mounts").read_text().splitlines()
            if f"{cache}/" in line and "/merged " in line
        ]
        with open(scratch / buildahengine.CACHE_LOCK, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return mounts, "?", False
            listed = store.run("containers", "--quiet")
            return mounts, listed.stdout.strip() if listed.returncode == 0 else listed.stderr, True

    state = left()
    for _ in range(900):
        if state == ([], "", True):
            break
        time.sleep(0.1)
        state = left()
    assert state == ([], "", True), state  # no mount, no container, the lock free for the next build
    assert (cache / "storage").is_dir()  # the layers stay
