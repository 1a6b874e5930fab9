"""Child processes that never outlive the tool.

Ctrl-C reaches the whole process group, but SIGTERM (a cancelled CI job, `kill`) reaches the
tool alone: every child must be ended by the tool as it unwinds (cli.Terminated). A signal
that lands while subprocess.Popen is still starting the child raises before the caller holds
the Popen object, and that child runs on, orphaned (found by the build-sigterm test: a
`docker build` outlived the tool). spawn() holds SIGINT and SIGTERM for the few milliseconds of
the start, then ends the child and delivers the signal as it would have been.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from contextlib import contextmanager

HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _holding(held: list[int]):
    """Record HELD signals in `held` instead of acting on them (main thread only: Python runs
    signal handlers there, and only there can they be swapped)."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return

    def hold(signum, frame):
        held.append(signum)

    before = {s: signal.signal(s, hold) for s in HELD}
    try:
        yield before
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)  # raises KeyboardInterrupt or cli.Terminated
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


@contextmanager
def signals_held():
    """Run the block with SIGINT and SIGTERM held, then act on the first that came: for a start
    whose bookkeeping must be done before the tool unwinds (janitor.guard registers the
    janitor's dismissal: a SIGTERM inside its Popen left the janitor running past the tool)."""
    held: list[int] = []
    with _holding(held) as before:
        yield
    if held:
        _deliver(held[0], before[held[0]])


def end(proc: subprocess.Popen, grace: float = 30) -> None:
    """Terminate, then kill after `grace` seconds; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)


def spawn(argv, **kwargs) -> subprocess.Popen:
    """subprocess.Popen, but a signal during the start ends the child before it is raised."""
    held: list[int] = []
    with _holding(held) as before:
        proc = subprocess.Popen(argv, **kwargs)
    if held:
        end(proc)
        _deliver(held[0], before[held[0]])
    return proc


def run(argv, *, input=None, capture_output: bool = False, timeout: float | None = None, **kwargs):
    """subprocess.run on spawn(): the child is killed and reaped on a timeout or an interrupt."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with spawn(argv, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
