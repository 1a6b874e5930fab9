"""Fetch pinned sources with the git CLI into a cache keyed by repository and commit.

Git's own configuration applies to every call (`url.<mirror>.insteadOf`, credential
helpers, `http.proxy`), which is how air-gapped sites point the builder at their mirrors.

Cache layout (root: $MTP_CACHE_DIR or ~/.cache/mtp-image-builder):
    git/<repo-slug>-<hash12>/<commit>/     a checked-out shallow clone of exactly that commit
    pypi/<name>-<version>/                 downloaded distributions (see pydeps.py)
A tree only appears under its final name once complete: it is fetched into a temporary
directory next to it and renamed, so concurrent runs and interrupted fetches never leave
a half tree behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpimage import children, netpolicy, settings
from mtpimage.errors import EnvironmentProblem, last_words

SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# Git's messages when the host cannot be reached at all (offline, air-gapped without a
# mirror): the lock records the source as unverified instead of failing.
OFFLINE_PATTERNS = (
    "could not resolve host",
    "name or service not known",
    "temporary failure in name resolution",
    "network is unreachable",
    "no route to host",
    "could not resolve hostname",
    "nodename nor servname",
)
# Messages that say the commit/ref is not there: never retried.
MISSING_PATTERNS = (
    "not our ref",
    "couldn't find remote ref",
    "no such remote ref",
    "unadvertised object",
    "not a tree object",
    "repository not found",
    "does not appear to be a git repository",
    "remote error: access denied",
    "unknown revision",
)

# What a mirror must allow, recognised by git's message when it does not (docs/lock-and-mirrors.md,
# "Air-gapped sites"): the setting to turn on there and why the tool needs it.
MIRROR_SETTINGS = (
    (
        "filtering not recognized by server",
        "uploadpack.allowFilter",
        "partial fetches (MTP_GIT_ALLOW_MISSING_BLOBS=1 fetches commit and trees with --filter=blob:none)",
    ),
)


def mirror_fix(repo: str, stderr: str) -> str | None:
    """The mirror setting git's message says is missing, as a fix; None when it names none."""
    low = (stderr or "").lower()
    for message, setting, why in MIRROR_SETTINGS:
        if message in low:
            return (
                f"the server of {repo} does not allow {why}: run `git -C <its repository> config "
                f"{setting} true` on it"
            )
    return None


MISSING_BLOBS_FIX = (
    "the mirror lacks some of this commit's files (a snapshot without large blobs): set "
    "MTP_GIT_ALLOW_MISSING_BLOBS=1 to fetch the commit and its trees and check out every path "
    "but the absent ones (still verified by hash; lock.yaml records them as missing_from_mirror)"
)


def _missing_blobs_fix(low_stderr: str) -> str | None:
    """git's "unable to read <sha>" (upload-pack: "possible repository corruption"): absent
    blobs, which the tool fetches around only when told to (never by default)."""
    if "unable to read" in low_stderr and not _allow_missing():
        return MISSING_BLOBS_FIX
    return None


def cache_root() -> Path:
    """The one cache root (settings.py decides it: MTP_CACHE_DIR, else the XDG cache)."""
    return settings.current().cache_root


class GitError(EnvironmentProblem):
    """A git call failed. `offline` when the host could not be reached at all."""

    def __init__(self, repo: str, what: str, stderr: str, commit: str | None = None):
        self.repo, self.what, self.commit = repo, what, commit
        self.stderr = last_words(stderr or "", 600)
        low = self.stderr.lower()
        self.offline = any(p in low for p in OFFLINE_PATTERNS)
        self.missing = any(p in low for p in MISSING_PATTERNS)
        self.fix = mirror_fix(repo, self.stderr) or _missing_blobs_fix(low)
        at = f" commit {commit}" if commit else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        super().__init__(f"{what} of {repo}{at} failed: git says: {self.stderr or '(no message)'}{fix}")


@dataclass(frozen=True)
class Tree:
    repo: str
    commit: str
    path: Path
    cached: bool  # True when it was already in the cache


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    env["LC_ALL"] = "C"
    env["GIT_ADVICE"] = "0"
    return env


def git(
    *args: str, cwd: Path | None = None, timeout: float | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    cmd = ["git"] + (["-C", str(cwd)] if cwd else []) + list(args)
    try:
        return children.run(
            cmd,
            capture_output=True,
            text=True,
            env=_env(),
            input=input,
            timeout=timeout or netpolicy.git_timeout(),
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, exc.stdout or "", f"timed out after {exc.timeout:.0f} s")


def _retrying(fn):
    """Call fn() under the network policy, retrying transient git errors (not offline, not
    missing, not a blob the mirror lacks)."""

    def transient(exc: BaseException) -> bool:
        return (
            isinstance(exc, GitError)
            and not exc.offline
            and not exc.missing
            and "unable to read" not in exc.stderr.lower()
        )

    return netpolicy.retrying(transient)(fn)


def ls_remote(repo: str, ref: str) -> str:
    """The commit `ref` (branch, tag, or full ref name) points at upstream; tags peeled."""
    if SHA_RE.match(ref):
        return ref
    candidates = [ref] if ref.startswith("refs/") else [f"refs/heads/{ref}", f"refs/tags/{ref}"]
    patterns = []
    for c in candidates:
        patterns += [c, f"{c}^{{}}"]

    def call() -> str:
        proc = git("ls-remote", "--", repo, *patterns)
        if proc.returncode != 0:
            raise GitError(repo, f"git ls-remote {ref}", proc.stderr)
        return proc.stdout

    out = _retrying(call)
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name.strip()] = sha.strip()
    for c in candidates:
        if f"{c}^{{}}" in found:  # annotated tag: the commit it points at
            return found[f"{c}^{{}}"]
        if c in found:
            return found[c]
    raise GitError(repo, f"git ls-remote {ref}", f"no branch or tag named {ref!r} upstream")


def _slug(repo: str) -> str:
    tail = re.sub(r"\.git$", "", repo.rstrip("/")).split("/")[-2:]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(tail)).strip("-") or "repo"
    return f"{name}-{hashlib.sha256(repo.encode()).hexdigest()[:12]}"


def tree_dir(repo: str, commit: str) -> Path:
    return cache_root() / "git" / _slug(repo) / commit


def cached_tree(repo: str, commit: str) -> Tree | None:
    path = tree_dir(repo, commit)
    return Tree(repo, commit, path, True) if (path / ".git").is_dir() else None


MISSING_FILE = ".mtp-missing-from-mirror"


def missing_paths(tree: Path) -> list[str]:
    """Paths of the pinned commit that the mirror could not provide (see _partial_checkout)."""
    f = Path(tree) / ".git" / MISSING_FILE
    return f.read_text().split("\n")[:-1] if f.is_file() else []


def _allow_missing() -> bool:
    return settings.current().git_allow_missing_blobs


# the commit just fetched, checked out detached (no advice printed: its stderr is read)
CHECKOUT_FETCHED = ("-c", "advice.detachedHead=false", "checkout", "-q", "--detach", "FETCH_HEAD")


def _partial_checkout(tmp: Path, repo: str, commit: str) -> list[str]:
    """Some mirrors (snapshots without large files) hold a commit whose trees are complete but
    some blobs are absent: git's plain fetch then dies with "unable to read <sha>". Opted in
    with MTP_GIT_ALLOW_MISSING_BLOBS=1 (never by default), fetch the commit and trees only
    (--filter=blob:none; the mirror needs uploadpack.allowFilter, and GitError names it when
    git says it is off), then check out every path
    except those whose blob the mirror cannot give, named one failed checkout at a time.
    The commit is still verified by hash; the missing paths are returned and recorded."""

    def run(*args: str, what: str, ok_fail: bool = False):
        proc = git(*args, cwd=tmp)
        if proc.returncode != 0 and not ok_fail:
            raise GitError(repo, what, proc.stderr, commit)
        return proc

    run("remote", "add", "origin", repo, what="git remote add")
    run("config", "extensions.partialClone", "origin", what="git config")
    run(
        "fetch",
        "-q",
        "--depth",
        "1",
        "--no-tags",
        "--filter=blob:none",
        "origin",
        commit,
        what="git fetch --filter=blob:none",
    )
    listing = run("ls-tree", "-r", "-z", "--full-tree", "FETCH_HEAD", what="git ls-tree").stdout
    by_blob: dict[str, list[str]] = {}
    for entry in listing.split("\0"):
        if entry and " blob " in entry.split("\t", 1)[0]:
            meta, path = entry.split("\t", 1)
            by_blob.setdefault(meta.split()[2], []).append(path)
    missing: list[str] = []
    for _ in range(50):
        if missing:
            run(
                "sparse-checkout",
                "set",
                "--no-cone",
                "/*",
                *[f"!/{p}" for p in missing],
                what="git sparse-checkout",
            )
        proc = run(*CHECKOUT_FETCHED, what="git checkout", ok_fail=True)
        if proc.returncode == 0:
            return sorted(missing)
        shas = [
            s
            for s in re.findall(r"(?:unable to read|not our ref) ([0-9a-f]{40})", proc.stderr)
            if s in by_blob
        ]
        if not shas:
            raise GitError(repo, "git checkout (partial)", proc.stderr, commit)
        for sha in shas:
            missing.extend(p for p in by_blob[sha] if p not in missing)
    raise GitError(repo, "git checkout (partial)", "too many blobs missing from the mirror", commit)


def fetch(repo: str, commit: str) -> Tree:
    """A checked-out tree of exactly `commit` of `repo`, from the cache or a shallow fetch.

    Raises GitError naming the repository, the commit and git's message; on failure
    nothing is left in the cache.
    """
    if not SHA_RE.match(commit or ""):
        raise GitError(repo, "fetch", f"{commit!r} is not a 40-hex commit", commit)
    hit = cached_tree(repo, commit)
    if hit:
        return hit
    final = tree_dir(repo, commit)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=final.parent))
    try:

        def step(*args: str, what: str) -> None:
            proc = git(*args, cwd=tmp)
            if proc.returncode != 0:
                raise GitError(repo, what, proc.stderr, commit)

        step("init", "-q", what="git init")
        step("config", "core.autocrlf", "false", what="git config")
        missing: list[str] = []
        try:
            _retrying(
                lambda: step(
                    "fetch", "-q", "--depth", "1", "--no-tags", "--", repo, commit, what="git fetch --depth 1"
                )
            )
            step(*CHECKOUT_FETCHED, what="git checkout")
        except GitError as exc:
            if not (_allow_missing() and "unable to read" in exc.stderr.lower()):
                raise
            missing = _partial_checkout(tmp, repo, commit)
        head = git("rev-parse", "HEAD", cwd=tmp).stdout.strip()
        if head != commit:
            raise GitError(repo, "git fetch", f"fetched {head}, expected {commit}", commit)
        if missing:
            (tmp / ".git" / MISSING_FILE).write_text("".join(f"{p}\n" for p in missing))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / ".git").is_dir():  # not a concurrent winner: a real problem
                raise
        return Tree(repo, commit, final, False)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def remembering_fetch():
    """fetch() that fails at once for a (repo, commit) that already failed in this run, instead
    of retrying it for every profile that pins it (`check --probe-sources` over all profiles)."""
    failures: dict[tuple[str, str], GitError] = {}

    def fetch_once(repo: str, commit: str) -> Tree:
        if (repo, commit) in failures:
            raise failures[(repo, commit)]
        try:
            return fetch(repo, commit)
        except GitError as exc:
            failures[(repo, commit)] = exc
            raise

    return fetch_once


def apply_check(tree: Path, patch: Path, strip: int) -> tuple[bool, str]:
    """`git apply --check -p<strip>` of a patch against a fetched tree."""
    proc = git("apply", "--check", f"-p{strip}", str(patch.resolve()), cwd=tree, timeout=120)
    return proc.returncode == 0, last_words(proc.stderr, 400)


# ----------------------------------------------------------------------------- diffs of two commits

# `git diff` with every option that shapes its bytes given explicitly, so the same two commits
# give the same bytes under any user's git configuration (diff.noprefix, diff.context,
# diff.algorithm, diff.renames, diff.orderFile, core.abbrev, color.ui, diff.external, ...):
# full blob ids (an abbreviation's length depends on how many objects the repository holds),
# a/ b/ prefixes, 3 lines of context, Myers with the indent heuristic (git's defaults).
DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--full-index",
    "--no-renames",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--unified=3",
    "--inter-hunk-context=0",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--ignore-submodules=none",
    "--submodule=short",
    "--no-relative",
    "-O/dev/null",
)
DIFF_CONFIG = ("core.quotePath=true", "diff.suppressBlankEmpty=false", "core.attributesFile=/dev/null")
# Environment variables git reads that would change a diff's bytes.
_DIFF_ENV_DROP = (
    "GIT_DIFF_OPTS",
    "GIT_EXTERNAL_DIFF",
    "GIT_DIFF_PATH_COUNTER",
    "GIT_DIFF_PATH_TOTAL",
    "GIT_ICASE_PATHSPECS",
    "GIT_GLOB_PATHSPECS",
    "GIT_NOGLOB_PATHSPECS",
)


def diff_command(base: str, head: str, paths: tuple[str, ...] = ()) -> str:
    """The command commit_diff runs, as a line a person can re-run in a clone to review it."""
    tail = f" -- {' '.join(paths)}" if paths else ""
    return f"git diff {' '.join(DIFF_OPTIONS)} {base} {head}{tail}"


_DIFFS: dict[tuple, tuple[bytes, tuple[str, ...]]] = {}


def commit_diff(
    repo: str, base: str, head: str, paths: tuple[str, ...] = ()
) -> tuple[bytes, tuple[str, ...]]:
    """(the diff base..head limited to `paths`, the files it changes), from the two commits
    fetched like every git source (fetch(): cache by repository and commit, retries,
    url.insteadOf mirrors). The diff runs in the head's cached repository with the base's
    objects as an alternate, so nothing is fetched twice and nothing is copied.

    Raises GitError naming the repository and the commit that could not be fetched."""
    key = (repo, base, head, tuple(paths))
    if key in _DIFFS:
        return _DIFFS[key]
    b, h = fetch(repo, base), fetch(repo, head)
    env = _env()
    for name in _DIFF_ENV_DROP:
        env.pop(name, None)
    env["GIT_LITERAL_PATHSPECS"] = "1"  # paths are file names, never pathspec magic or globs
    env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(b.path / ".git" / "objects")
    # Run inside .git: no work tree, so no .gitattributes of a checkout changes the output.
    base_cmd = ["git", *[a for c in DIFF_CONFIG for a in ("-c", c)], "-C", str(h.path / ".git"), "diff"]

    def run(*args: str) -> bytes:
        try:
            proc = children.run(
                [*base_cmd, *args, base, head, "--", *paths],
                capture_output=True,
                env=env,
                timeout=netpolicy.git_timeout(),
            )
        except subprocess.TimeoutExpired as exc:
            raise GitError(
                repo, f"git diff {base[:12]}..{head[:12]}", f"timed out after {exc.timeout:.0f} s", head
            ) from None
        if proc.returncode != 0:
            raise GitError(
                repo, f"git diff {base[:12]}..{head[:12]}", proc.stderr.decode(errors="replace"), head
            )
        return proc.stdout

    data = run(*DIFF_OPTIONS)
    files = tuple(
        x
        for x in run("--name-only", "-z", "--no-renames", "--no-relative", "--ignore-submodules=none")
        .decode(errors="surrogateescape")
        .split("\0")
        if x
    )
    _DIFFS[key] = (data, files)
    return data, files
