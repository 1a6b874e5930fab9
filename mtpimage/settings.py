"""Every MTP_* environment variable the tool reads, read here and nowhere else, into one
frozen Settings object (as cibuildwheel's options reader computes its options once).

`current()` is what every module asks. It reads the environment into a Settings and
memoises it under a snapshot of the variables it reads, so the reading happens once per
distinct environment: a run reads once, and a test or a CI step that sets a variable gets
the new value on the next call instead of a stale one.

Standard library only, and no other module of the tool: build.py reads MTP_NO_BOOTSTRAP
before its dependencies may exist, and the fast path (fastpath.py) imports nothing else.
VARIABLES is the one table of them: docs/environment.md's "Environment variables" table lists
exactly these (tests/unit/test_settings.py checks both ways).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

PREFIX = "MTP_"

# Fixed names, not environment, kept here because the fast path needs them without importing
# the modules that use them (plan/model.py, cli.py import them from here).
IMAGE_REPOSITORY = "mtp-verl"  # the local repository every image is tagged in
DEFAULT_PROFILE = "mtp-detach"  # the main job's profile when --profile is not given


def local_image(tag: str) -> str:
    """The local image reference `mtp-verl:<tag>` (an identity, a profile, a stack tag): spelled
    here once, for every module and the fast path (which can import nothing else)."""
    return f"{IMAGE_REPOSITORY}:{tag}"


class Variable(tuple):
    """(name, default as a user would write it ("" = unset), what it does). A plain tuple:
    dataclasses would cost the fast path its import time."""

    __slots__ = ()

    def __new__(cls, name: str, default: str, doc: str):
        return super().__new__(cls, (name, default, doc))

    name = property(lambda self: self[0])
    default = property(lambda self: self[1])
    doc = property(lambda self: self[2])


VARIABLES = (
    Variable("MTP_CACHE_DIR", "~/.cache/mtp-image-builder", "the one cache root: git trees, wheels, uv, the extension wheel cache, lock files, the fast path's memo"),
    Variable("MTP_SUBSTITUTE_BASE", "", "build on this base (`NAME:TAG@sha256:...`) instead of the profile's; recorded in the plan and identity (flag: `--substitute-base`)"),
    Variable("MTP_OMIT_PACKAGES", "", "leave these pinned packages out (comma or space separated); recorded in the plan and identity (flag: `--omit-packages`)"),
    Variable("MTP_GIT_ALLOW_MISSING_BLOBS", "", "`1`: accept a mirror that lacks some blobs of a pinned commit (commit and trees fetched, missing paths recorded)"),
    Variable("MTP_INDEX_REWRITE", "", "index mirrors: `FROM=TO` pairs separated by spaces or `;` (longest FROM wins), for `lock` and builds (pip inside the build steps, through the BuildKit secret `index-mirrors`); the lock and the rendered files keep the manifests' URLs"),
    Variable("MTP_REGISTRY_MIRROR", "", "registry mirrors: `REGISTRY=HOST[:PORT][/PREFIX]` pairs separated by spaces or `;` (`docker.io=...`): the base image is pulled by its digest from there; in no layer, label or identity (flag: `--registry-mirror`)"),
    Variable("MTP_CA_BUNDLE", "", "CA bundle for index downloads (before PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE)"),
    Variable("MTP_LOCK_REFRESH", "", "`1`: `lock` asks the indexes again instead of answering from uv's cache"),
    Variable("MTP_NET_RETRIES", "3", "attempts per network step (git, indexes, pushes), the first one included"),
    Variable("MTP_NET_BACKOFF_MAX", "8", "longest wait between attempts, seconds (waits grow exponentially from 0.5 s)"),
    Variable("MTP_HTTP_TIMEOUT", "20", "one HTTP request, seconds"),
    Variable("MTP_GIT_TIMEOUT", "300", "one git call, seconds"),
    Variable("MTP_SIGNED_BY", "", "`OWNER/REPO` whose images workflow signs the published images: `explain --cluster` then writes the exact `cosign verify` to run before the first pull (flag: `--signed-by`)"),
    Variable("MTP_ENGINE", "docker", "the engine that builds: `docker` (BuildKit) or `buildah` (bit-for-bit reproducible; see docs/reproducible-builds-and-verify.md); flag: `--engine`, `--reproducible`"),
    Variable("MTP_DOCKER_CLI", "", "the docker CLI to use (default: the first of PATH's docker, /usr/bin/docker, /usr/local/bin/docker that works)"),
    Variable("MTP_DOCKER_BUILDKIT_CLI", "", "the older name of MTP_DOCKER_CLI, read when that is unset (scripts/setup-test-host.sh writes it)"),
    Variable("MTP_EXT_MAX_JOBS", "", "parallel compile jobs of the compiled extensions' builder stages (default: the profile's `build.max_jobs`); not in the wheel key"),
    Variable("MTP_WHEEL_CACHE_REPO", "", "`HOST[:PORT]/NS/NAME` where compiled extension wheels are shared: pulled on a local miss, pushed after a build (`HOST[:PORT]/NS`, the `--registry` form of `wheels push`, means `NS/ext-wheels` when that is where the wheels are)"),
    Variable("MTP_PROJECT_URL", "", "this project's URL for the images' `org.opencontainers.image.source` label (else GitHub Actions' repository, else an https origin)"),
    Variable("MTP_FASTPATH", "1", "`0`: never answer from the remembered no-op; every main job takes the full path"),
    Variable("MTP_FASTPATH_TRACE", "", "non-empty: the fast path says on stderr why it hit or missed"),
    Variable("MTP_DEBUG", "", "non-empty: an internal error shows its traceback instead of one line (exit 70)"),
    Variable("MTP_NO_BOOTSTRAP", "", "non-empty: build.py never makes `.venv/`; missing dependencies are an error (exit 3)"),
)  # fmt: skip
NAMES = frozenset(v.name for v in VARIABLES)


class Settings:
    """The environment as the tool reads it, frozen. Numbers stay text until asked for, so a
    bad value fails where it is used, as before, not on every command."""

    __slots__ = ("raw", "xdg_cache_home", "_values")

    def __init__(self, raw: tuple[tuple[str, str], ...], xdg_cache_home: str = ""):
        object.__setattr__(self, "raw", raw)  # (name, value) of every set MTP_* variable, sorted
        object.__setattr__(self, "xdg_cache_home", xdg_cache_home)
        object.__setattr__(self, "_values", dict(raw))

    def __setattr__(self, name, value):
        raise AttributeError("Settings are frozen: read the environment again with settings.current()")

    def __eq__(self, other) -> bool:
        return isinstance(other, Settings) and (self.raw, self.xdg_cache_home) == (
            other.raw,
            other.xdg_cache_home,
        )

    def __hash__(self) -> int:
        return hash((self.raw, self.xdg_cache_home))

    def get(self, name: str) -> str:
        if name not in NAMES:  # a typo here would read nothing, silently
            raise KeyError(f"{name} is not in settings.VARIABLES")
        return self._values.get(name, "")

    # -- where things are kept
    @property
    def cache_root(self) -> Path:
        if self.get("MTP_CACHE_DIR"):
            return Path(self.get("MTP_CACHE_DIR"))
        base = self.xdg_cache_home or str(Path.home() / ".cache")
        return Path(base) / "mtp-image-builder"

    # -- what the plan is (substitutions)
    @property
    def substitute_base(self) -> str:
        return self.get("MTP_SUBSTITUTE_BASE")

    @property
    def omit_packages(self) -> tuple[str, ...]:
        return split_list(self.get("MTP_OMIT_PACKAGES"))

    # -- sources and indexes
    @property
    def git_allow_missing_blobs(self) -> bool:
        return self.get("MTP_GIT_ALLOW_MISSING_BLOBS") == "1"

    @property
    def ca_bundle(self) -> str:
        return self.get("MTP_CA_BUNDLE")

    @property
    def lock_refresh(self) -> bool:
        return self.get("MTP_LOCK_REFRESH") == "1"

    # -- the network policy (netpolicy.py owns the defaults' meaning)
    def number(self, name: str, default: float) -> float:
        value = self.get(name)
        return float(value) if value else default

    # -- docker and builds
    @property
    def docker_cli(self) -> str:
        return self.get("MTP_DOCKER_CLI") or self.get("MTP_DOCKER_BUILDKIT_CLI")

    @property
    def engine(self) -> str:
        return self.get("MTP_ENGINE") or "docker"

    @property
    def ext_max_jobs(self) -> int | None:
        raw = self.get("MTP_EXT_MAX_JOBS")
        return int(raw) if raw.isdigit() and int(raw) > 0 else None

    @property
    def wheel_cache_repo(self) -> str | None:
        return self.get("MTP_WHEEL_CACHE_REPO") or None

    @property
    def project_url(self) -> str:
        return self.get("MTP_PROJECT_URL")

    # -- the tool itself
    @property
    def fastpath(self) -> bool:
        return self.get("MTP_FASTPATH") != "0"

    @property
    def fastpath_trace(self) -> bool:
        return bool(self.get("MTP_FASTPATH_TRACE"))

    @property
    def debug(self) -> bool:
        return bool(self.get("MTP_DEBUG"))

    @property
    def no_bootstrap(self) -> bool:
        return bool(self.get("MTP_NO_BOOTSTRAP"))

    def key_environment(self) -> list[tuple[str, str]]:
        """The MTP_* variables that can change what a run does, for the fast path's key: every
        one that is set, known or not (a new one must never be silently outside the key),
        except the trace switch, which changes only what is said."""
        return [(k, v) for k, v in self.raw if k != "MTP_FASTPATH_TRACE"]


def split_list(text: str) -> tuple[str, ...]:
    """`a,b c` -> ('a', 'b', 'c'): the list form of a variable or of its flag."""
    return tuple(x for x in re.split(r"[,\s]+", text or "") if x)


def _snapshot(environ) -> tuple:
    raw = tuple(sorted((k, v) for k, v in environ.items() if k.startswith(PREFIX)))
    return raw, environ.get("XDG_CACHE_HOME", "")


@functools.lru_cache(maxsize=8)
def _settings(snapshot: tuple) -> Settings:
    raw, xdg = snapshot
    return Settings(raw=raw, xdg_cache_home=xdg)


def current() -> Settings:
    """The settings of the environment as it is now (memoised per distinct environment)."""
    return _settings(_snapshot(os.environ))


def from_environ(environ) -> Settings:
    """Settings from an explicit mapping (tests, tools that run the builder for another env)."""
    return _settings(_snapshot(environ))
