"""The base image the demo and the end-to-end tests build on: a small Debian image with a
registry digest.

scripts/setup-test-host.sh makes mtp-test-base:bookworm with debootstrap (no registry can
be pulled from there). The profiles need Python 3.12 and a base pinned by digest (rule
unpinned-ref), so this adds a python3.12 link to Debian's python3 (3.11: the stand-ins do
not mind) and pushes the result to a loopback registry, whose digest is then the pin. A
debootstrapped image differs per machine, so the digest is made here, never written down.
Every docker call goes through the engine seam (engine.named(DOCKER_ENGINE)), as the tool's own do.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass

from mtpimage import engine
from mtpimage.engine import BuildRequest
from mtpimage.errors import EnvironmentProblem
from mtpimage.imageref import Registry
from mtpimage.publish.registryclient import RegistryClient

DEFAULT_BASE_IMAGE = "mtp-test-base:bookworm"  # scripts/setup-test-host.sh makes it
BASE_NAMESPACE = "mtp-test"
BASE_REPOSITORY = "base"
BASE_TAG = "bookworm-py3.12"
# The engine (engine.ENGINES) that holds images and runs containers here, whatever builds:
# the demo's base, its tags and pulls are dockerd's.
DOCKER_ENGINE = "docker"


@dataclass(frozen=True)
class PushedBase:
    name: str  # HOST:PORT/mtp-test/base (what components.yaml's base_image.name holds)
    tag: str
    digest: str  # sha256:... as the registry serves it

    @property
    def tagged(self) -> str:
        """The local tag the push left (the teardown removes it)."""
        return f"{self.name}:{self.tag}"

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}"


# What the real base holds that the stack replaces, as the real base holds it: a libnccl2 at
# NVIDIA's version, kept with apt-mark hold, its library in the loader's cache. An empty
# package with a placeholder file (not a working NCCL): what the os layer's removal
# (platform.os_remove) and the native-libs check meet on the real base.
HELD_NCCL = "2.28.3-1+cuda13.0"
_HELD = (
    "RUN d=$(mktemp -d) && mkdir -p $d/DEBIAN $d/usr/lib/x86_64-linux-gnu"
    " && printf 'Package: libnccl2\\nVersion: {v}\\nArchitecture: all\\nMaintainer: mtp-image-builder"
    "\\nDescription: stand-in of the real base held NCCL\\n' > $d/DEBIAN/control"
    " && : > $d/usr/lib/x86_64-linux-gnu/libnccl.so.{so}"
    " && dpkg-deb -b $d /tmp/libnccl2.deb >/dev/null && dpkg -i /tmp/libnccl2.deb >/dev/null"
    " && apt-mark hold libnccl2 >/dev/null && rm -rf $d /tmp/libnccl2.deb /var/log/dpkg.log /var/log/apt"
).format(v=HELD_NCCL, so=HELD_NCCL.split("-")[0])


def _context(source: str) -> bytes:
    dockerfile = f"FROM {source}\nRUN ln -sf python3 /usr/bin/python3.12\n{_HELD}\n".encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    return out.getvalue()


def push_base(registry: str, source: str = DEFAULT_BASE_IMAGE) -> PushedBase:
    """Build (BuildKit's cache makes a second run instant) `source` + the python3.12 link,
    push it to `registry` (host:port) and return it with the registry's digest."""
    eng = engine.named(DOCKER_ENGINE)  # dockerd holds and pushes it, whatever MTP_ENGINE builds with
    image_id = eng.build(BuildRequest(context_tar=_context(source), labels={}), echo=False)
    reg = Registry.parse(f"{registry}/{BASE_NAMESPACE}")
    pushed = PushedBase(reg.ref(BASE_REPOSITORY), BASE_TAG, "")
    eng.tag(image_id, pushed.tagged)
    eng.push(pushed.tagged)
    digest = RegistryClient(reg).manifest_digest(BASE_REPOSITORY, BASE_TAG)
    if not digest:
        raise EnvironmentProblem(
            f"registry {registry} has no {pushed.tagged} right after its push "
            "(fix: check the registry's log and its disk, then run again)"
        )
    return PushedBase(pushed.name, BASE_TAG, digest)
