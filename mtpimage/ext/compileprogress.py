"""Progress of one compiled extension's build, read from its builder stage's output.

The builder stage prints everything a compile prints (thousands of lines of warnings on
TransformerEngine, flash-attn and apex); a person needs four numbers: objects done of total,
time so far, an estimate of the time left, and how many objects came back from the compile
cache (an interrupted build resumes there). The full output stays in the build's log.

ninja (torch's cpp_extension builds with it) prints `[N/M] command` when an object finishes,
in a terminal that is not smart, as BuildKit's is; BuildKit's plain progress prefixes each
line with `#STEP SECONDS`. apex runs ninja once per module (14 modules, each its own M), so
the totals here add up each run's M as runs begin: the total grows as apex goes on.

An object that finishes within CACHE_HIT_S of the one before may have come from the compile
cache: no object of these extensions compiles that fast (the quickest seen here took 7 s on two
cores). But with N parallel jobs up to N real objects can finish close together by chance (a
fresh TE build on an empty cache, 2 jobs, said "about 1 resumed" at 5 of 28: two objects had
started together), so fast finishes count as cache hits only in a run of at least N in a row,
N read from the builder's `MAX_JOBS=` line (2 if it says none). A single hit between real
compiles goes uncounted: the count says "about", and errs low.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

JOBS = re.compile(r"\bMAX_JOBS=(\d+)")
NINJA = re.compile(r"^(?:#\d+\s+(?P<t>\d+(?:\.\d+)?)\s+)?\s*\[(?P<n>\d+)/(?P<m>\d+)\]\s")
CACHE_HIT_S = 2.0
BUILDER_SAYS = "mtp_extension: "  # images/lib/mtp_extension.py's prefix
PERIOD_S = 60.0  # a line this often in a log (CI); a terminal gets a live line instead


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@dataclass
class CompileProgress:
    """Fed every line of one builder stage's output (`feed`); says progress lines."""

    name: str
    say: Callable[[str], None]
    live: bool = False  # a terminal: one line rewritten in place (on stderr)
    period_s: float = PERIOD_S
    clock: Callable[[], float] = time.monotonic
    done: int = 0  # objects finished, over every ninja run
    total: int = 0  # objects announced so far (each run's M, added as the run begins)
    cached: int = 0  # objects in a run of >= jobs fast finishes: the compile cache
    jobs: int = 2  # parallel compiles (the builder's MAX_JOBS)
    _fast: int = 0  # fast finishes in a row not yet counted as cache hits
    _fast_s: float = 0.0  # and the time they took
    _burst: bool = False  # within a run of fast finishes already counted as the cache
    runs: int = 0
    _run_done: int = 0
    _run_total: int = 0
    _last_t: float | None = None  # the time of the last finished object (BuildKit's or ours)
    _compiled_s: float = 0.0  # time spent on objects that really compiled
    _compiled: int = 0
    _started: float | None = None
    _said_at: float | None = None
    _stream: object = field(default=None, repr=False)

    def feed(self, line: str) -> None:
        if self._started is None:  # elapsed counts from the builder stage's first line
            self._started = self.clock()
        own = line.find(BUILDER_SAYS)
        if own >= 0:  # the builder script's own few lines (what it builds, with which jobs; failures)
            jobs = JOBS.search(line)
            if jobs:
                self.jobs = max(1, int(jobs[1]))
            if self.live:
                (self._stream or sys.stderr).write("\r\033[K")
            self.say(line[own:].rstrip())
            return
        found = NINJA.match(line)
        if not found:
            return
        n, m = int(found["n"]), int(found["m"])
        now = self.clock()
        t = float(found["t"]) if found["t"] is not None else now
        if n <= self._run_done or m != self._run_total:  # a new ninja run (apex: the next module)
            self.runs += 1
            self.total += m
            self._run_total, self._run_done = m, 0
            self._last_t = None if found["t"] is None else self._last_t
        step = max(0, n - self._run_done)
        self._run_done = n
        self.done += step
        burst_ended = False  # a resume from the compile cache is said when it ends, not a minute on
        if self._last_t is not None:
            took = max(0.0, t - self._last_t)
            if took < CACHE_HIT_S:
                self._fast += step
                self._fast_s += took
                if self._fast >= self.jobs:  # more than chance: the compile cache, to the run's end
                    self.cached += self._fast
                    self._fast, self._fast_s = 0, 0.0
                    self._burst = True
                elif self._burst:
                    self.cached += self._fast
                    self._fast, self._fast_s = 0, 0.0
            else:  # fast finishes too few to be the cache were real compiles that ended together
                burst_ended = self._burst
                self._compiled += step + self._fast
                self._compiled_s += took + self._fast_s
                self._fast, self._fast_s, self._burst = 0, 0.0, False
        self._last_t = t
        if self.live:
            self._live_line()
        elif (
            self._said_at is None
            or now - self._said_at >= self.period_s
            or self._run_done == m
            or burst_ended
        ):
            self._said_at = now
            self.say(self.line())

    def left_s(self) -> float | None:
        """Time left for the objects announced so far, at the rate of the real compiles so far."""
        if not self._compiled:
            return None
        return (self.total - self.done) * self._compiled_s / self._compiled

    def elapsed_s(self) -> float:
        return 0.0 if self._started is None else self.clock() - self._started

    def line(self) -> str:
        more = " (more as apex's modules begin)" if self.runs > 1 else ""
        left = self.left_s()
        parts = [
            f"compile {self.name:<16} {self.done}/{self.total} objects{more}",
            f"{_clock_text(self.elapsed_s())} elapsed",
            f"about {_clock_text(left)} left"
            if left is not None
            else "estimate after the first compiled object",
        ]
        if self.cached:
            parts.append(f"about {self.cached} resumed from the compile cache")
        return ", ".join(parts)

    def _live_line(self) -> None:
        stream = self._stream or sys.stderr
        stream.write("\r\033[K" + self.line())
        stream.flush()

    def finish(self, stopped: bool = False) -> str:
        """The closing line (a live line is ended first). `stopped`: the build failed or was
        interrupted, so the line says where it stopped, and that a rerun resumes from there."""
        if self.live:
            stream = self._stream or sys.stderr
            stream.write("\r\033[K")
            stream.flush()
        took = _clock_text(self.elapsed_s())
        cached = f"; about {self.cached} of them resumed from the compile cache" if self.cached else ""
        if stopped:
            if not self.total:
                return f"stopped {self.name:<16} after {took}, before its first object (the log has it all)"
            return (
                f"stopped {self.name:<16} at {self.done}/{self.total} objects after {took}{cached}; "
                "the compile cache keeps the finished objects, so a rerun resumes there"
            )
        if not self.total:
            return f"compiled {self.name:<15} in {took} (no ninja progress in its output; the log has it all)"
        return f"compiled {self.name:<15} {self.done}/{self.total} objects in {took}{cached}"
