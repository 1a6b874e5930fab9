"""A compiled extension's pinned source checked against upstream when `lock` runs: an sdist's
sha256 against its index page, a git commit fetched by hash."""

from __future__ import annotations

import re

from mtpimage import gitfetch
from mtpimage.lock.pydeps import ca_bundle, rewrite
from mtpimage.plan.model import Package


def verify_source(pkg: Package) -> tuple[bool | None, str]:
    """Is the pinned source what upstream serves? An sdist: its index (PEP 503 page) lists
    the file with this sha256. A git commit: the one git fetcher gets it by hash.
    (True, detail), (False, what differs) or (None, why it could not be asked)."""
    b = pkg.build
    if b.source == "git":
        try:
            gitfetch.fetch(b.repo, b.commit)
        except gitfetch.GitError as exc:
            return None, f"{b.repo} @ {b.commit[:12]}: not fetched ({exc.one_line()})"
        return True, f"{b.repo} @ {b.commit[:12]} fetched"
    import requests  # lazy: ~60 ms, only needed when an index is asked

    filename = b.url.rsplit("/", 1)[-1]
    project = re.sub(r"[-_.]+", "-", filename.rsplit("-", 1)[0]).lower()
    page = rewrite(f"https://pypi.org/simple/{project}/")
    try:
        r = requests.get(page, timeout=20, verify=ca_bundle() or True)
        r.raise_for_status()
    except requests.RequestException as exc:
        return None, f"{filename}: index page {page} not read ({str(exc).splitlines()[0][:120]})"
    listed = re.findall(re.escape(filename) + r"#sha256=([0-9a-f]{64})", r.text)
    if not listed:
        return False, f"{filename} is not listed on {page} (fix: pin a file the index serves)"
    if b.sha256 not in listed:
        return False, (
            f"{filename}: the index lists sha256 {listed[0]}, components.yaml pins {b.sha256} "
            "(fix: find out why the file changed before pinning the new hash)"
        )
    return True, f"{filename} sha256 as listed on {page}"
