"""The one network policy: its environment variables, and retrying only what the caller
calls transient, re-raising the last error itself (never tenacity's RetryError)."""

from __future__ import annotations

import pytest

from mtpimage import netpolicy


def test_defaults_and_environment(monkeypatch):
    for var in ("MTP_NET_RETRIES", "MTP_NET_BACKOFF_MAX", "MTP_HTTP_TIMEOUT", "MTP_GIT_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    assert (
        netpolicy.attempts(),
        netpolicy.wait_max(),
        netpolicy.http_timeout(),
        netpolicy.git_timeout(),
    ) == (3, 8.0, 20.0, 300.0)
    monkeypatch.setenv("MTP_NET_RETRIES", "0")  # at least one attempt, always
    assert netpolicy.attempts() == 1
    monkeypatch.setenv("MTP_NET_RETRIES", "5")
    monkeypatch.setenv("MTP_NET_BACKOFF_MAX", "0.5")
    monkeypatch.setenv("MTP_HTTP_TIMEOUT", "7")
    monkeypatch.setenv("MTP_GIT_TIMEOUT", "9")
    assert (
        netpolicy.attempts(),
        netpolicy.wait_max(),
        netpolicy.http_timeout(),
        netpolicy.git_timeout(),
    ) == (5, 0.5, 7.0, 9.0)


class Flaky(Exception):
    pass


class Refused(Exception):
    pass


def test_retries_transient_errors_then_reraises_the_last(monkeypatch):
    monkeypatch.setenv("MTP_NET_RETRIES", "3")
    monkeypatch.setenv("MTP_NET_BACKOFF_MAX", "0")
    calls, sleeps = [], []

    def fn():
        calls.append(1)
        raise Flaky(f"attempt {len(calls)}")

    with pytest.raises(Flaky, match="attempt 3"):
        netpolicy.retrying(
            lambda e: isinstance(e, Flaky), before_sleep=lambda s: sleeps.append(s.attempt_number)
        )(fn)
    assert len(calls) == 3 and sleeps == [1, 2]


def test_permanent_errors_fail_at_once(monkeypatch):
    monkeypatch.setenv("MTP_NET_RETRIES", "5")
    calls = []

    def fn():
        calls.append(1)
        raise Refused("denied")

    with pytest.raises(Refused):
        netpolicy.retrying(lambda e: isinstance(e, Flaky))(fn)
    assert len(calls) == 1


def test_success_after_a_transient_failure(monkeypatch):
    monkeypatch.setenv("MTP_NET_BACKOFF_MAX", "0")
    calls = []

    def fn():
        calls.append(1)
        if len(calls) < 2:
            raise Flaky()
        return "ok"

    assert netpolicy.retrying(lambda e: isinstance(e, Flaky))(fn) == "ok" and len(calls) == 2


def test_git_fetches_follow_the_policy(monkeypatch, tmp_path):
    """sources' retries are the policy's: MTP_NET_RETRIES=2 means two git fetch attempts
    for a transient failure (a server that hangs up), one for a missing commit."""
    from mtpimage import gitfetch

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MTP_NET_RETRIES", "2")
    monkeypatch.setenv("MTP_NET_BACKOFF_MAX", "0")
    seen = []

    def git(*args, cwd=None, timeout=None, input=None):
        import subprocess

        if args[0] == "fetch":
            seen.append(args)
            return subprocess.CompletedProcess(args, 128, "", "fatal: the remote end hung up unexpectedly")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(gitfetch, "git", git)
    with pytest.raises(gitfetch.GitError, match="hung up"):
        gitfetch.fetch("https://git.example.com/a/b", "a" * 40)
    assert len(seen) == 2
    assert not list((tmp_path / "cache").rglob("*.git"))


def test_a_failed_fetch_is_not_retried_for_every_profile(monkeypatch):
    """check --probe-sources: a (repo, commit) that failed once fails at once afterwards."""
    from mtpimage import gitfetch

    calls = []

    def fetch(repo, commit):
        calls.append((repo, commit))
        raise gitfetch.GitError(repo, "git fetch", "fatal: the remote end hung up unexpectedly", commit)

    monkeypatch.setattr(gitfetch, "fetch", fetch)
    once = gitfetch.remembering_fetch()
    for _ in range(3):
        with pytest.raises(gitfetch.GitError, match="hung up"):
            once("https://git.example.com/a/b", "a" * 40)
    assert calls == [("https://git.example.com/a/b", "a" * 40)]
