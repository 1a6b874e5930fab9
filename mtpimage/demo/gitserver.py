"""A git daemon on loopback serving the stand-in repositories (gitrepos.py), and the git
configuration that points real GitHub URLs at it (``url.<loopback>.insteadOf``), as a site
points git at its mirror. The demo (demo/run.py) and the end-to-end tests both use it.

The daemon binds 127.0.0.1 on a free port, is a context manager, and can be stopped in the
middle of a test to simulate an upstream going away.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from mtpimage import children
from mtpimage.demo.gitrepos import FixtureRepos, build_fixture_repos

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


# ----------------------------------------------------------------------------- git daemon


class GitDaemon:
    """``git daemon`` exporting every repository under ``base_path`` (read only).

    Repositories are addressed as ``git://127.0.0.1:PORT/<path below base_path>``; the daemon
    also tries the ``.git`` suffix, so ``<owner>/<name>`` finds ``<owner>/<name>.git``.
    Served repositories should set ``uploadpack.allowAnySHA1InWant`` (the fixture repos do)
    so a shallow fetch of an exact commit works.
    """

    def __init__(self, base_path: Path, port: int | None = None, log_path: Path | None = None):
        self.base_path = Path(base_path)
        self.host = LOOPBACK
        self._fixed_port = port
        self.port: int | None = port
        self.log_path = Path(log_path) if log_path else self.base_path.parent / "git-daemon.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``git://127.0.0.1:PORT/`` (with the trailing slash, ready for insteadOf)."""
        if self.port is None:
            raise RuntimeError("git daemon not started")
        return f"git://{self.host}:{self.port}/"

    def repo_url(self, owner: str, name: str) -> str:
        return f"{self.url}{owner}/{name}.git"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> GitDaemon:
        if self.running:
            return self
        last_error = ""
        for _ in range(5):
            port = self.port if (self._fixed_port or self.port) else free_port()
            log = open(self.log_path, "ab")
            # spawn: a Ctrl-C during the start must not leave a daemon nobody stops
            self.proc = children.spawn(
                [
                    "git",
                    "daemon",
                    "--reuseaddr",
                    "--verbose",
                    "--informative-errors",
                    f"--listen={self.host}",
                    f"--port={port}",
                    f"--base-path={self.base_path}",
                    "--export-all",
                    "--enable=upload-pack",
                    "--disable=receive-pack",
                    str(self.base_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: stop() ends the transfers too
                env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
            )
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _port_open(self.host, port):
                    self.port = port
                    return self
                time.sleep(0.05)
            last_error = self.log_path.read_text(errors="replace")[-2000:]
            self._kill()
            if self._fixed_port:
                break
            self.port = None
        raise RuntimeError(f"git daemon did not start on {self.host}: {last_error}")

    def _kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """Stop the daemon and every transfer in flight (the server 'goes away').

        The port is kept, so :meth:`start` (or :meth:`restart`) brings it back at the
        same URL, and git configuration written for it stays valid.
        """
        self._kill(signal.SIGKILL)

    def restart(self) -> GitDaemon:
        self.stop()
        return self.start()

    def __enter__(self) -> GitDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ----------------------------------------------------------------------------- git config


def github_rewrites(loopback_url: str, owners: Iterable[str]) -> dict[str, str]:
    """``{loopback prefix: github prefix}`` for each owner, e.g.
    ``{"git://127.0.0.1:4711/NVIDIA/": "https://github.com/NVIDIA/"}``."""
    base = loopback_url if loopback_url.endswith("/") else loopback_url + "/"
    return {f"{base}{owner}/": f"https://github.com/{owner}/" for owner in sorted(set(owners))}


def write_git_config(
    path: Path,
    rewrites: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write a git config file with ``url.<to>.insteadOf=<from>`` for each ``{to: from}``.

    ``extra`` adds plain ``key=value`` settings (e.g. ``{"protocol.version": "2"}``).
    Written with ``git config --file`` so quoting follows git's rules.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}

    def setting(*args: str) -> None:
        subprocess.run(["git", "config", "--file", str(path), *args], check=True, env=env)

    settings = {
        "user.name": "MTP Test",
        "user.email": "tests@mtp-image-builder.invalid",
        "advice.detachedHead": "false",
        "init.defaultBranch": "main",
    }
    settings.update(extra or {})
    for key, value in settings.items():
        setting(key, value)
    for to, frm in rewrites.items():
        setting("--add", f"url.{to}.insteadOf", frm)
    return path


def git_config_env(config_path: Path) -> dict[str, str]:
    """Environment variables that make git use only ``config_path`` as its global config."""
    return {
        "GIT_CONFIG_GLOBAL": str(config_path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }


# ----------------------------------------------------------------------------- together


@dataclasses.dataclass(frozen=True)
class GitWorld:
    """Fixture repositories + a git daemon serving them + a git config rewriting GitHub URLs.

    ``env`` holds the variables (GIT_CONFIG_GLOBAL, ...) that make git in a subprocess (or
    the builder, through ``monkeypatch.setenv``) fetch ``https://github.com/<owner>/...`` from
    the daemon.
    """

    repos: FixtureRepos
    daemon: GitDaemon
    config_path: Path

    @property
    def env(self) -> dict[str, str]:
        return git_config_env(self.config_path)

    def subprocess_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


@contextlib.contextmanager
def serve_git_world(root: Path) -> Iterator[GitWorld]:
    """Build the fixture repositories under ``root``, serve them, write the git config."""
    root = Path(root)
    repos = build_fixture_repos(root / "repos")
    with GitDaemon(repos.base_path, log_path=root / "git-daemon.log") as daemon:
        config = write_git_config(root / "gitconfig", github_rewrites(daemon.url, repos.owners()))
        yield GitWorld(repos, daemon, config)
