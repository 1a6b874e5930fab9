"""children.spawn: a signal that lands while the child is starting ends that child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mtpimage import children


class Stop(KeyboardInterrupt):
    pass


@pytest.fixture
def sigterm_raises():
    def raise_stop(signum, frame):
        raise Stop()

    before = signal.signal(signal.SIGTERM, raise_stop)
    yield
    signal.signal(signal.SIGTERM, before)


def _popen_then_signal(started: list):
    """A Popen that is hit by SIGTERM after the child exists, before Popen returns."""
    real = subprocess.Popen

    def popen(*args, **kwargs):
        proc = real(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    return popen


def test_a_sigterm_during_the_start_ends_the_child_then_is_raised(sigterm_raises, monkeypatch):
    started: list = []
    monkeypatch.setattr(children.subprocess, "Popen", _popen_then_signal(started))
    with pytest.raises(Stop):
        children.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    (proc,) = started
    assert proc.returncode is not None, "the child outlived the interrupted start"


def test_without_the_hold_the_child_is_orphaned(sigterm_raises, monkeypatch):
    """The fault spawn() exists for: plain Popen loses the child to the signal."""
    started: list = []
    popen = _popen_then_signal(started)
    with pytest.raises(Stop):
        popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (proc,) = started
    try:
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_run_kills_the_child_on_a_timeout():
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_run_is_subprocess_run():
    proc = children.run(
        [sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"],
        input="abc",
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stdout) == (0, "cba\n")
