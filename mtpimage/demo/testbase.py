"""The base image the demo and the end-to-end tests build on: a small Debian image with a
registry digest.

scripts/setup-test-host.sh makes mtp-test-base:bookworm with debootstrap (no registry can
be pulled from there). The profiles need Python 3.12 and a base pinned by digest (rule
unpinned-ref), so this adds a python3.12 link to Debian's python3 (3.11: the stand-ins do
not mind) and pushes the result to a loopback registry, whose digest is then the pin. A
debootstrapped image differs per machine, so the digest is made here, never written down.
Every docker call goes through the engine seam (engine.named(DOCKER_ENGINE)), as the tool's own do.

The multi-arch base (issue 49): the same recipe on mtp-test-base:bookworm-arm64 (the test host's
debootstrap --arch arm64), built by the reproducible engine for linux/arm64 (its RUN steps under
qemu), and one image index over both platforms' bases, pinned by the index's digest as the real
CUDA base is: a build picks its platform's manifest from it.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass

from mtpimage import engine
from mtpimage.engine import BuildRequest
from mtpimage.errors import EnvironmentProblem
from mtpimage.imageref import Registry
from mtpimage.publish import imageindex
from mtpimage.publish.registryclient import RegistryClient

DEFAULT_BASE_IMAGE = "mtp-test-base:bookworm"  # scripts/setup-test-host.sh makes it
ARM64_BASE_IMAGE = "mtp-test-base:bookworm-arm64"  # and its linux/arm64 twin
# the multi-arch base: a repository of its own (the single-platform base's tag stays what it is)
MULTIARCH_REPOSITORY = "base-multiarch"
ROOTFS_REPOSITORY = "rootfs"  # the arm64 debootstrap image, pushed so buildah pulls it by digest
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
    "RUN d=$(mktemp -d) && mkdir -p $d/DEBIAN $d/usr/lib/{lib}"
    " && printf 'Package: libnccl2\\nVersion: {v}\\nArchitecture: all\\nMaintainer: mtp-image-builder"
    "\\nDescription: stand-in of the real base held NCCL\\n' > $d/DEBIAN/control"
    " && : > $d/usr/lib/{lib}/libnccl.so.{so}"
    " && dpkg-deb -b $d /tmp/libnccl2.deb >/dev/null && dpkg -i /tmp/libnccl2.deb >/dev/null"
    " && apt-mark hold libnccl2 >/dev/null && rm -rf $d /tmp/libnccl2.deb /var/log/dpkg.log /var/log/apt"
)
# where Debian keeps a platform's libraries (its multiarch triplet)
LIBDIR = {"linux/amd64": "x86_64-linux-gnu", "linux/arm64": "aarch64-linux-gnu"}


def _context(source: str, platform: str = "linux/amd64") -> bytes:
    held = _HELD.format(v=HELD_NCCL, so=HELD_NCCL.split("-")[0], lib=LIBDIR[platform])
    dockerfile = f"FROM {source}\nRUN ln -sf python3 /usr/bin/python3.12\n{held}\n".encode()
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


def push_arm64_base(registry: str, source: str = ARM64_BASE_IMAGE) -> PushedBase:
    """The arm64 twin of push_base: `source` (linux/arm64, in dockerd) pushed as the rootfs,
    then the same recipe built on it by the reproducible engine for linux/arm64 (RUN under
    qemu; buildah's layer cache makes a second run quick) and pushed."""
    docker = engine.named(DOCKER_ENGINE)
    reg = Registry.parse(f"{registry}/{BASE_NAMESPACE}")
    client = RegistryClient(reg)
    rootfs = f"{reg.ref(ROOTFS_REPOSITORY)}:{BASE_TAG}-arm64"
    if docker.image_id(source) is None:
        raise EnvironmentProblem(
            f"no {source} in dockerd (fix: run scripts/setup-test-host.sh, which debootstraps it)"
        )
    docker.tag(source, rootfs)
    docker.push(rootfs)
    rootfs_digest = client.manifest_digest(ROOTFS_REPOSITORY, f"{BASE_TAG}-arm64")
    builder = engine.BuildahEngine()
    image_id = builder.build(
        BuildRequest(
            context_tar=_context(f"{reg.ref(ROOTFS_REPOSITORY)}@{rootfs_digest}", "linux/arm64"),
            labels={},
            platform="linux/arm64",
        ),
        echo=False,
    )
    pushed = PushedBase(reg.ref(BASE_REPOSITORY), f"{BASE_TAG}-arm64", "")
    builder.tag(image_id, pushed.tagged)
    builder.push(pushed.tagged)
    digest = client.manifest_digest(BASE_REPOSITORY, pushed.tag)
    return PushedBase(pushed.name, pushed.tag, digest)


def push_multiarch_base(
    registry: str, amd64_source: str = DEFAULT_BASE_IMAGE, arm64_source: str = ARM64_BASE_IMAGE
) -> PushedBase:
    """Both platforms' bases and one image index over them (imageindex.py, its digest read
    from its bytes), as HOST:PORT/mtp-test/base-multiarch:bookworm-py3.12@<index digest>."""
    amd64 = push_base(registry, amd64_source)
    arm64 = push_arm64_base(registry, arm64_source)
    reg = Registry.parse(f"{registry}/{BASE_NAMESPACE}")
    client = RegistryClient(reg)
    members = [
        imageindex.member(client, BASE_REPOSITORY, amd64.digest, "linux/amd64"),
        imageindex.member(client, BASE_REPOSITORY, arm64.digest, "linux/arm64"),
    ]
    # an index names manifests of its own repository: the images' blobs are mounted there
    for one in members:
        body, _ = client.manifest(BASE_REPOSITORY, one.digest)
        manifest = json.loads(body)
        for desc in [manifest["config"], *manifest["layers"]]:
            if not client.blob_exists(MULTIARCH_REPOSITORY, desc["digest"]):
                out = io.BytesIO()
                client.fetch_blob(BASE_REPOSITORY, desc["digest"], out, 1 << 34)
                client.upload_blob(MULTIARCH_REPOSITORY, desc["digest"], out.getvalue())
        client.put_manifest(MULTIARCH_REPOSITORY, one.digest, body, one.media_type)
    digest = imageindex.publish(client, MULTIARCH_REPOSITORY, BASE_TAG, members)
    return PushedBase(reg.ref(MULTIARCH_REPOSITORY), BASE_TAG, digest)
