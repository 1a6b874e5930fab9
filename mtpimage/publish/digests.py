"""Content digests: the one place that says what a digest is, and how one is computed.

A registry's answers are text someone else wrote: a `Docker-Content-Digest` header, a
config or layer digest in a manifest, a platform entry of an index. Every digest the tool
prints, pins or compares is computed here from bytes it read (`of`), and every digest read
from a registry's JSON goes through `checked` before it reaches a URL, a path or a log line:
`sha256:` and 64 lowercase hex, or `sha512:` and 128 (the other algorithm the OCI image
spec registers; hashlib computes both). Anything else ("sha256:../../v2/other/manifests/x",
upper case, a newline) is refused in one line that shows only a short, escaped excerpt.
"""

from __future__ import annotations

import hashlib
import re

from mtpimage.errors import EnvironmentProblem

# algorithm -> the number of lowercase hex digits of its digest (OCI image spec, descriptor.md)
ALGORITHMS = {"sha256": 64, "sha512": 128}
_FORM = re.compile(r"(?P<algo>[a-z0-9]+):(?P<hex>[0-9a-f]+)")


class BadDigest(EnvironmentProblem):
    """A registry's JSON named a digest that is not one: nothing was asked for with it."""


def valid(value: object) -> bool:
    if not isinstance(value, str):
        return False
    m = _FORM.fullmatch(value)
    return bool(m) and ALGORITHMS.get(m["algo"]) == len(m["hex"])


def excerpt(value: object) -> str:
    """A value that failed the check, safe to print: escaped (no control characters reach a
    terminal or a log) and cut to 40 characters."""
    text = ascii(value if isinstance(value, str) else type(value).__name__)
    return text if len(text) <= 42 else text[:40] + "...'"


def checked(value: object, where: str, fix: str = "use another registry") -> str:
    """`value` when it is a digest of a known algorithm; else BadDigest naming `where` (who
    said it: "registry HOST: the config digest of NAME@sha256:...")."""
    if valid(value):
        return value  # type: ignore[return-value]
    known = ", ".join(f"{a}: and {n} lowercase hex" for a, n in ALGORITHMS.items())
    raise BadDigest(
        f"{where} is {excerpt(value)}, not a digest ({known}); nothing was requested with it (fix: {fix})"
    )


def hasher(digest: str):
    """A hashlib object of the algorithm `digest` (already checked) names."""
    return hashlib.new(digest.split(":", 1)[0])


def of(data: bytes, like: str = "sha256:") -> str:
    """The digest of `data`, in the algorithm of `like` (sha256 unless it names another)."""
    algo = like.split(":", 1)[0] if like.split(":", 1)[0] in ALGORITHMS else "sha256"
    return f"{algo}:{hashlib.new(algo, data).hexdigest()}"
