"""A registry of its own on loopback: distribution's `serve` (Debian's docker-registry, as
scripts/setup-test-host.sh installs it) on a free port, its storage under a directory the
caller removes. The demo pushes there, and so does each test session (tests/conftest.py): no
repository outlives its user, and nothing is pushed to a registry someone else uses.

dockerd treats 127.0.0.0/8 as insecure, so pushes and pulls speak plain HTTP.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from mtpimage import children
from mtpimage.demo.gitserver import LOOPBACK, free_port

REGISTRY_BINARIES = ("docker-registry", "registry")  # Debian's name, upstream's name
SETUP_HINT = "run `sudo bash scripts/setup-test-host.sh` (installs and starts what the e2e tests need)"


def registry_binary() -> str | None:
    for name in REGISTRY_BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


def registry_answers(registry: str, timeout: float = 3.0) -> tuple[bool, str]:
    """(does http://REGISTRY/v2/ answer 200, what it said)."""
    try:
        with urllib.request.urlopen(f"http://{registry}/v2/", timeout=timeout) as resp:
            return resp.status == 200, f"GET /v2/ -> {resp.status}"
    except urllib.error.HTTPError as e:
        return False, f"GET http://{registry}/v2/ -> {e.code}"
    except OSError as e:
        return False, f"GET http://{registry}/v2/ failed: {e}"


@contextlib.contextmanager
def private_registry(root: Path, wait_s: float = 30) -> Iterator[str]:
    """A registry on a free loopback port with its storage under ``root``; yields
    ``host:port`` and stops it at the end (the storage stays for the caller to remove)."""
    binary = registry_binary()
    if binary is None:
        raise RuntimeError(f"no registry binary ({' or '.join(REGISTRY_BINARIES)}); {SETUP_HINT}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    proc, address, why = None, "", ""
    for attempt in range(3):  # a free port may be taken before the registry binds it
        address = f"{LOOPBACK}:{free_port()}"
        config = root / f"registry-{attempt}.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'storage'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {address}\n"
        )
        log = open(root / f"registry-{attempt}.log", "wb")
        # its own session: Ctrl-C reaches the caller, which stops it after what uses it
        proc = children.spawn(
            [binary, "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline:
            ok, why = registry_answers(address, timeout=1)
            if ok:
                break
            time.sleep(0.1)
        else:
            why = (root / f"registry-{attempt}.log").read_text(errors="replace")[-300:] or why
            children.end(proc, grace=20)
            proc = None
            continue
        break
    if proc is None:
        raise RuntimeError(f"the registry did not start: {why}")
    try:
        yield address
    finally:
        children.end(proc, grace=20)
