"""Whether this machine can run a platform's binaries: natively, or under qemu's user-mode
emulator registered with the kernel's binfmt_misc (issue 49: a linux/arm64 image built on an
x86_64 machine runs its RUN steps and its in-image checks as arm64 processes).

Debian's qemu-user-static registers `qemu-aarch64` with the F flag (the interpreter is opened
once, at registration), so it runs inside build containers and chroots that do not hold it;
binfmt-support enables it at boot. scripts/setup-test-host.sh installs both. On an arm64
machine (GitHub's ubuntu-24.04-arm) nothing is emulated.
"""

from __future__ import annotations

import platform as _host
from pathlib import Path

from mtpimage.errors import EnvironmentProblem

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# uname's machine -> the architecture OCI names; and the architecture -> qemu's handler name
HOST_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
QEMU = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}


def host_platform() -> str:
    machine = _host.machine()
    return f"linux/{HOST_ARCH.get(machine, machine)}"


def handler(platform: str, binfmt: Path = BINFMT) -> str | None:
    """The binfmt_misc entry that runs `platform`'s binaries here, or None when they run
    natively. Raises EnvironmentProblem, one line with the fix, when nothing runs them."""
    host = host_platform()
    if platform == host:
        return None
    arch = platform.split("/")[1] if "/" in platform else platform
    name = QEMU.get(arch)
    entry = binfmt / name if name else None
    if entry is not None and entry.is_file():
        try:
            state = entry.read_text().splitlines()
        except OSError:
            state = []
        if state[:1] == ["enabled"]:
            return name
    raise EnvironmentProblem(
        f"a {platform} build on this {host} machine runs {arch} binaries under qemu, but "
        f"{name or 'no qemu handler'} is not registered with binfmt_misc ({binfmt}) "
        "(fix: apt-get install qemu-user-static binfmt-support, as scripts/setup-test-host.sh "
        "does, with binfmt_misc mounted; in a container, run it privileged; or build on a "
        f"{platform} machine)"
    )
