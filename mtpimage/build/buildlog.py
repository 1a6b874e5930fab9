"""What a failed build's log says, as one line (issue #22: a wheel that changes under the same
URL is refused at build time). The image installs every locked PyPI file with `pip install
--require-hashes`; when an index serves other bytes under the same URL, pip stops with a block
of several lines (THESE PACKAGES DO NOT MATCH THE HASHES ...), buried in BuildKit's output. This
reads that block from the stream of build output lines (plain progress: `#9 1.23 ` prefixes)
and says it in one line: the package, the URL, both sha256 and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


class Watcher:
    """Fed every output line of a build; remembers pip's hash mismatches."""

    def __init__(self) -> None:
        self.mismatches: list[Mismatch] = []
        self._in_block = False

    def feed(self, line: str) -> None:
        text = _STEP.sub("", line.rstrip("\r\n"))
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
            + " (fix: the file changed under the same URL (a re-upload, or a mirror serving other "
            "bytes); find out why before `python build.py lock` records the new hash)"
        )


def explain(lines) -> str | None:
    """One line for a whole log (a list of lines or a text)."""
    w = Watcher()
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        w.feed(line)
    return w.one_line()
