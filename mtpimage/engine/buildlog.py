"""What a failed build's log says, as one line (issue #22: a wheel that changes under the same
URL is refused at build time). The image installs every locked PyPI file with `pip install
--require-hashes`; when an index serves other bytes under the same URL, pip stops with a block
of several lines (THESE PACKAGES DO NOT MATCH THE HASHES ...), buried in BuildKit's output. This
reads that block from the stream of build output lines (plain progress: `#9 1.23 ` prefixes)
and says it in one line: the package, the URL, both sha256 and the fix.

Any other failure is said as its cause, then where the whole log is: the first compiler
diagnostic (`add.cpp:2:2: error: ...`) and the build backend's own verdict (`error: command
'x86_64-linux-gnu-gcc' failed ...`), never BuildKit's closing line, which repeats the whole RUN
command (thousands of characters) and names no cause. The log of every build is written to
$MTP_CACHE_DIR/logs/ while it runs, removed when the build succeeds, kept when it fails.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mtpimage import invocation, settings
from mtpimage.mirrors import INDEX_SETTING

HEAD = "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE"
# BuildKit's plain progress puts `#<step> <seconds> ` before each line a RUN prints
_STEP = re.compile(r"^#\d+ \d+(?:\.\d+)? ")
# pip: `    NAME==VERSION from URL (from -r FILE (line N)):`
_REQ = re.compile(r"^\s+(?P<req>\S+) from (?P<url>\S+?)(?: \(from .*\))?:$")
_EXPECTED = re.compile(r"^\s+Expected sha256 (?P<hex>[0-9a-f]{64})$")
_GOT = re.compile(r"^\s+Got +(?P<hex>[0-9a-f]{64})$")


@dataclass
class Mismatch:
    requirement: str
    url: str
    expected: str = ""
    got: str = ""


# a compiler's diagnostic: `file:line[:col]: [fatal ]error: ...`
_DIAGNOSTIC = re.compile(r"^\S+?:\d+(?::\d+)?: (?:fatal )?error: ")
# a build backend's or pip's verdict (setuptools: `error: command 'gcc' failed ...`)
_VERDICT = re.compile(r"^(?:error: |ERROR: |\w+(?:\.\w+)*Error: )")
# BuildKit's and the docker CLI's own closing lines: they repeat the RUN command, not its cause
_ENGINE = (
    "did not complete successfully",
    "failed to solve",
    "executor failed",
    "subprocess-exited-with-error",
)
# newer setuptools quote the whole argv (`error: Command '['g++', '-c', ...]' returned non-zero
# exit status 1.`): the program and the verdict are what say something
_ARGV_VERDICT = re.compile(r"""^error: [Cc]ommand '\[['"]([^'"]+)['"].*\]' ((?:failed|returned) .*)$""")
CAUSE_WIDTH = 240  # characters of each cause line


# pip, when an index does not answer: `WARNING: Retrying (Retry(total=4, ...)) after connection
# broken by 'NewConnectionError('...: Failed to establish a new connection: [Errno 111]
# Connection refused')': /simple/x/`; the reason is the part after the last colon
_RETRYING = re.compile(r"Retrying \(Retry\(.*\)\) after connection broken by '(?P<why>.*)': (?P<path>\S+)")
_NOT_FOUND = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the requirement) (?P<req>\S+)"
)


class Watcher:
    """Fed every output line of a build; remembers pip's hash mismatches and the lines that
    say why a step failed. `through_mirror`: pip fetched through the site's index mirrors
    (MTP_INDEX_REWRITE), so what it could not get is the mirror's to serve, and the line
    names the setting."""

    def __init__(self, through_mirror: bool = False) -> None:
        self.through_mirror = through_mirror
        self.mismatches: list[Mismatch] = []
        self._in_block = False
        self.diagnostic: str | None = None  # the first compiler error
        self.verdict: str | None = None  # the last build backend / pip error line
        self.unreachable: str | None = None  # why pip's first connection to an index broke
        self.not_found: str | None = None  # a requirement no index served

    def feed(self, line: str) -> None:
        text = _STEP.sub("", line.rstrip("\r\n"))
        bare = text.strip()
        if self.unreachable is None and (m := _RETRYING.search(bare)):
            why = re.sub(r"[')\s]+$", "", m["why"]).rsplit(": ", 1)[-1]
            self.unreachable = f"{why[:CAUSE_WIDTH]} (at {m['path']})"
        if self.not_found is None and (m := _NOT_FOUND.search(bare)):
            self.not_found = m["req"]
        if self.diagnostic is None and _DIAGNOSTIC.match(bare):
            self.diagnostic = bare[:CAUSE_WIDTH]
        elif _VERDICT.match(bare) and not any(e in bare for e in _ENGINE):
            if m := _ARGV_VERDICT.match(bare):
                bare = f"error: command '{m[1]}' {m[2]}"
            # the backend's own `error: ...` wins over pip's summary (`ERROR: Failed to build ...`)
            if bare.startswith("error: ") or self.verdict is None or not self.verdict.startswith("error: "):
                self.verdict = bare[:CAUSE_WIDTH]
        if HEAD in text:
            self._in_block = True
            return
        if not self._in_block:
            return
        if m := _REQ.match(text):
            self.mismatches.append(Mismatch(m["req"], m["url"].split("#", 1)[0]))
        elif (m := _EXPECTED.match(text)) and self.mismatches and not self.mismatches[-1].expected:
            self.mismatches[-1].expected = m["hex"]
        elif (m := _GOT.match(text)) and self.mismatches:
            self.mismatches[-1].got = m["hex"]
        elif text.strip() and not text.startswith(" "):
            self._in_block = False  # pip's block is indented; anything else ends it

    def one_line(self) -> str | None:
        """The mismatches as one line, or None when pip reported none."""
        done = [m for m in self.mismatches if m.expected and m.got]
        if not done:
            return None
        return (
            "pip refused a file whose sha256 is not the locked one: "
            + "; ".join(
                f"{m.requirement} from {m.url} has sha256 {m.got}, lock.yaml pins {m.expected}" for m in done
            )
            + (
                f" (fix: the index mirror that {INDEX_SETTING} sends pip to serves other bytes than the "
                "index the lock was made from: make the mirror serve the original files (resync it, "
                "or drop its rebuilt copy), or correct the setting; the lock stays as it is)"
                if self.through_mirror
                else " (fix: the file changed under the same URL (a re-upload, or a mirror serving other "
                f"bytes); find out why before `{invocation.command()} lock` records the new hash)"
            )
        )

    def mirror_line(self) -> str | None:
        """Through a mirror: what pip could not get, as one line naming the setting; else None."""
        if not self.through_mirror:
            return None
        if self.unreachable:
            return (
                f"pip inside the build could not reach the index mirror set by {INDEX_SETTING}: "
                f"{self.unreachable} (fix: check that the mirror runs and answers from this machine's "
                f"build steps, or correct {INDEX_SETTING})"
            )
        if self.not_found:
            return (
                f"the index mirror set by {INDEX_SETTING} does not serve {self.not_found} "
                f"(fix: make the mirror serve every file lock.yaml pins, or correct {INDEX_SETTING})"
            )
        return None


def explain(lines) -> str | None:
    """One line for a whole log (a list of lines or a text)."""
    w = Watcher()
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        w.feed(line)
    return w.one_line()


def cause(watch: Watcher, tail: list[str]) -> str:
    """Why a build failed, in a few words: pip's refusal, else the compiler's first error and
    the backend's verdict, else the last lines of the log (BuildKit's own lines shortened)."""
    refused = watch.one_line()
    if refused:
        return refused
    found = [c for c in (watch.diagnostic, watch.verdict) if c]
    if found:
        return "; ".join(found)
    lines = [t.strip()[:CAUSE_WIDTH] for t in tail if t.strip()]
    return " | ".join(lines[-4:]) or "no output"


# ----------------------------------------------------------------------------- the log files
KEEP_SECONDS = 14 * 24 * 3600  # failed builds' logs older than this are removed


def logs_dir() -> Path:
    return settings.current().cache_root / "logs"


def new_log(what: str) -> Path:
    """A fresh log file's path for one build (`what`: its target stage, or "image")."""
    d = logs_dir()
    d.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in d.glob("*.log"):
        try:
            if now - old.stat().st_mtime > KEEP_SECONDS:
                old.unlink()
        except OSError:
            pass
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", what)
    fd, path = tempfile.mkstemp(prefix=f"{stamp}-{safe}-", suffix=".log", dir=d)
    os.close(fd)
    return Path(path)


def failure(watch: Watcher, tail: list[str], log: Path | None, target: str | None) -> str:
    """The BuildFailed line: the stage, the cause, then where the whole log is (pip's refusal
    of a changed file is whole in itself: its line alone)."""
    refused = watch.one_line()
    if refused:
        return refused
    where = f"build of stage {target} failed" if target else "build failed"
    mirror = watch.mirror_line()
    if mirror:  # its own fix, then where the log is
        return f"{where}: {mirror[:-1]}; full log: {log})" if log is not None else f"{where}: {mirror}"
    text = f"{where}: {cause(watch, tail)}"
    return text + (f" (full log: {log})" if log is not None else "")
