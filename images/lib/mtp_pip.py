"""pip through the site's index mirrors, inside a build step (standard library only).

The rendered Dockerfile names the manifests' own index URLs (`--index-url https://pypi.org/
simple`): they are part of the image's identity, and a mirror must not be. The tool gives
each build, as the BuildKit secret `index-mirrors` (a tmpfs file for one RUN, never in a
layer, a label, the history or a build argument), the exact table of the plan's index URLs
and the mirror each is fetched from (mtpimage/mirrors.py decides it from MTP_INDEX_REWRITE,
the same setting `lock` uses). pip still checks every file against lock.yaml's sha256, so
whichever index serves it, the bytes are the locked ones.

    python mtp_pip.py ARGS...   run `pip ARGS` with its index options rewritten: what the
                                `pip` shell function of pip-env.sh runs when the table is
                                not empty
    mtp_pip.rewrite(ARGS)       the rewritten ARGS (mtp_install.py's own pip calls)

Only `--index-url`/`-i` and `--extra-index-url` are rewritten, to exactly the URL the table
gives (no prefix rules here: those are the tool's, in one place). A mirror reached over
plain http on another host gets `--trusted-host` (pip ignores such an index otherwise; the
hashes are what vouch for the bytes). The mirror URL may hold a token: it is never printed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

SECRET = Path("/run/secrets/index-mirrors")
INDEX_OPTIONS = ("--index-url", "-i", "--extra-index-url")
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def table(path: Path = SECRET) -> dict[str, str]:
    """{index URL as rendered: its mirror}; empty when the build has no mirrors."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return json.loads(text) if text.strip() else {}


def _trusted(url: str) -> list[str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http" or host in LOOPBACK or host.startswith("127."):
        return []
    return ["--trusted-host", f"{host}:{parts.port}" if parts.port else host]


def rewrite(args: list[str], mirrors: dict[str, str] | None = None) -> list[str]:
    """pip's arguments with every index URL the table names replaced by its mirror."""
    mirrors = table() if mirrors is None else mirrors
    out: list[str] = []
    extra: list[str] = []

    def mapped(url: str) -> str:
        new = mirrors.get(url, url)
        if new != url:
            extra.extend(_trusted(new))
        return new

    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arg in INDEX_OPTIONS and i + 1 < len(args):
            out += [arg, mapped(args[i + 1])]
            i += 2
            continue
        if eq and name in ("--index-url", "--extra-index-url"):
            out.append(f"{name}={mapped(value)}")
        elif arg.startswith("-i") and len(arg) > 2 and not arg.startswith("--"):
            out.append(f"-i{mapped(arg[2:])}")
        else:
            out.append(arg)
        i += 1
    return out + list(dict.fromkeys(extra))  # pip takes options after its arguments too


def main(argv: list[str]) -> int:
    args = rewrite(argv)
    os.execvp("pip", ["pip", *args])  # the same pip the step would have run
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
