"""Shared pytest fixtures. The logic lives in tests/fixtures/; this file only registers it.

Git (session): ``git_world`` (fixture repos + git daemon + git config), ``fixture_repos``,
``git_daemon``. Git (function): ``git_env`` (monkeypatches GIT_CONFIG_GLOBAL so
``https://github.com/<owner>/...`` resolves to the loopback daemon), ``private_git_world``
(fresh repos and daemon a test may change or stop). HTTP (function): ``http_server``.
Docker (session): ``docker_host``, ``registry``: they fail loudly when the host is not
prepared; set MTP_ALLOW_SKIP_E2E=1 to skip instead. ``registry`` is the session's own
registry (mtpimage/demo/registry.py), gone with the session together with every local
tag under its address and every image built FROM its base: tests leave only caches.
Temporary directories of passing tests are removed (pytest.ini: tmp_path_retention_policy).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mtpimage.demo.gitserver import GitWorld, serve_git_world  # noqa: E402
from mtpimage.demo.registry import private_registry  # noqa: E402
from tests.fixtures.dockerhost import DockerHost, probe_docker_host, remove_session_images  # noqa: E402
from tests.fixtures.servers import HttpFileServer  # noqa: E402


@pytest.fixture(scope="session")
def git_world(tmp_path_factory) -> GitWorld:
    with serve_git_world(tmp_path_factory.mktemp("git-world")) as world:
        yield world


@pytest.fixture(scope="session")
def fixture_repos(git_world):
    return git_world.repos


@pytest.fixture(scope="session")
def git_daemon(git_world):
    return git_world.daemon


@pytest.fixture
def git_env(git_world, monkeypatch) -> dict:
    """Route github.com URLs to the session daemon for this test (and its subprocesses)."""
    if not git_world.daemon.running:  # a test stopped the shared daemon: bring it back
        git_world.daemon.start()
    for key, value in git_world.env.items():
        monkeypatch.setenv(key, value)
    return git_world.env


@pytest.fixture
def private_git_world(tmp_path, monkeypatch) -> GitWorld:
    """Repos and daemon of this test alone: advance branches, stop the server, at will."""
    with serve_git_world(tmp_path / "git-world") as world:
        for key, value in world.env.items():
            monkeypatch.setenv(key, value)
        yield world


@pytest.fixture
def http_server(tmp_path) -> HttpFileServer:
    with HttpFileServer(tmp_path / "http") as server:
        yield server


def _e2e_unavailable(problems) -> None:
    message = "end-to-end host not ready:\n  " + "\n  ".join(problems)
    if os.environ.get("MTP_ALLOW_SKIP_E2E") == "1":
        pytest.skip(message + "\n(skipped because MTP_ALLOW_SKIP_E2E=1)")
    pytest.fail(message + "\n(set MTP_ALLOW_SKIP_E2E=1 to skip instead of failing)", pytrace=False)


@pytest.fixture(scope="session")
def _docker_probe():
    return probe_docker_host()


@pytest.fixture(scope="session")
def docker_host(_docker_probe, tmp_path_factory) -> DockerHost:
    host, problems = _docker_probe
    if host is None:
        _e2e_unavailable(problems)
    try:
        registry = private_registry(tmp_path_factory.mktemp("registry"))
        address = registry.__enter__()
    except RuntimeError as exc:
        _e2e_unavailable([str(exc)])
    if os.environ.get("MTP_TEST_SESSION_FILE"):  # tests/e2e/test_cleanup.py watches a session
        Path(os.environ["MTP_TEST_SESSION_FILE"]).write_text(f"registry={address}\n")
    try:
        yield dataclasses.replace(host, registry=address)
    finally:
        remove_session_images(host.cli, [f"{address}/"])
        registry.__exit__(None, None, None)


@pytest.fixture(scope="session")
def docker_available(docker_host) -> DockerHost:
    """Same as ``docker_host``, for tests that only need to know it is there."""
    return docker_host


@pytest.fixture(scope="session")
def registry(docker_host) -> str:
    """host:port of the session's own loopback registry (answering GET /v2/)."""
    return docker_host.registry


def pytest_addoption(parser):
    # One flag regenerates the committed golden renders (tests/golden/, tests/unit/test_golden.py),
    # as `ci --check` / `ci` do for the workflow: a template change is then reviewed as a diff.
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/ from the current renders instead of comparing with them",
    )


_ANNOUNCED: set[str] = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """With -q the dots said nothing for minutes while e2e modules built images: name each
    slow (e2e) module as it starts, with the time, so a reader knows what runs."""
    path = item.nodeid.split("::", 1)[0]
    if "/e2e/" in f"/{path}" and path not in _ANNOUNCED:
        _ANNOUNCED.add(path)
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            import time

            reporter.write_line(f"\n[{time.strftime('%H:%M:%S')}] {path}")
    return None
