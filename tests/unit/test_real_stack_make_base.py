"""scripts/real-stack/make-base.sh reuses the stand-in base while its inputs are unchanged
(issue 21 item 3): `docker import` makes a new digest every time, so it must run only when
the rootfs, the reference or the import settings changed, or the registry lost the image.

The script runs for real against a small registry on loopback (manifests, blobs, HEAD) and a
fake `docker` on PATH that records its calls; the rootfs is a folder with one file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real-stack" / "make-base.sh"
NAME, TAG = "mtp-standin/cuda", "13.0.2-devel-trixie-py3.12"
LABEL = "nvidia/cuda:13.0.2-devel-ubuntu24.04 stand-in: Debian trixie + local CUDA 13.0 toolkit + Python 3.12"
PUSHED = "sha256:" + "e" * 64  # the digest the fake docker's push gives the new import

FAKE_DOCKER = r"""#!/usr/bin/env bash
state=$FAKE_DOCKER_STATE
echo "$*" >> "$state/calls"
case "$1" in
  import) cat > /dev/null; echo sha256:new > "$state/id" ;;
  push) ;;
  image)
    case "$2" in
      inspect)
        [ -f "$state/id" ] || { echo "Error: No such image: $5" >&2; exit 1; }
        case "$4" in
          *RepoDigests*) echo "$FAKE_REGISTRY/mtp-standin/cuda@$FAKE_PUSHED" ;;
          *) cat "$state/id" ;;
        esac ;;
      rm) ;;
    esac ;;
esac
"""


def blob(obj: dict) -> tuple[str, bytes]:
    data = json.dumps(obj).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


class Registry:
    """Tags, manifests and blobs of one repository, served as the distribution API does."""

    def __init__(self):
        self.tags: dict[str, str] = {}
        self.objects: dict[str, bytes] = {}
        self.requests: list[str] = []

    def put_image(self, labels: dict) -> str:
        config_digest, config = blob({"config": {"Labels": labels}})
        self.objects[config_digest] = config
        digest, manifest = blob({"schemaVersion": 2, "config": {"digest": config_digest}, "layers": []})
        self.objects[digest] = manifest
        self.tags[TAG] = digest
        return digest


@pytest.fixture
def registry():
    reg = Registry()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, body: bool):
            reg.requests.append(f"{self.command} {self.path}")
            prefix = f"/v2/{NAME}/"
            ref = self.path[len(prefix) :].split("/", 1)[-1] if self.path.startswith(prefix) else ""
            ref = reg.tags.get(ref, ref)
            if self.path == "/v2/":
                data, digest = b"{}", None
            elif ref in reg.objects:
                data, digest = reg.objects[ref], ref
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_GET(self):
            self.answer(body=True)

        def do_HEAD(self):
            self.answer(body=False)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    reg.address = f"127.0.0.1:{server.server_address[1]}"
    yield reg
    server.shutdown()
    server.server_close()


@pytest.fixture
def host(tmp_path, registry):
    """A Python, a CUDA toolkit, a made rootfs (empty .complete, as before keys), fake tools."""
    py = tmp_path / "python"
    (py / "bin").mkdir(parents=True)
    (py / "bin" / "python3.12").symlink_to(sys.executable)  # the script reads JSON with it
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    base = tmp_path / "standin"
    (base / "rootfs").mkdir(parents=True)
    (base / "rootfs" / "etc-os-release").write_text("trixie\n")
    (base / "rootfs" / ".complete").write_text("")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in {
        "docker": FAKE_DOCKER,
        # a rootfs rebuild would start here: it fails, loudly, instead of reaching a network
        "debootstrap": "#!/bin/sh\necho 'fake debootstrap: no rootfs is built in tests'\nexit 1\n",
    }.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    state = tmp_path / "docker-state"
    state.mkdir()
    (state / "id").write_text("sha256:old\n")  # the image the tag names locally now
    env = {
        **os.environ,
        "PATH": f"{tools}:{os.environ['PATH']}",
        "MTP_STANDIN_REGISTRY": registry.address,
        "MTP_STANDIN_DIR": str(base),
        "MTP_STANDIN_PYTHON": str(py),
        "MTP_STANDIN_CUDA": str(cuda),
        "FAKE_DOCKER_STATE": str(state),
        "FAKE_REGISTRY": registry.address,
        "FAKE_PUSHED": PUSHED,
    }

    class Host:
        stamp = base / "standin.stamp"
        complete = base / "rootfs" / ".complete"
        ref = f"{registry.address}/{NAME}:{TAG}"

        def run(self, **extra: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["bash", str(SCRIPT)], capture_output=True, text=True, env={**env, **extra}, timeout=60
            )

        def docker_calls(self) -> list[str]:
            calls = state / "calls"
            return calls.read_text().splitlines() if calls.exists() else []

        def imports(self) -> int:
            return sum(c.startswith("import ") for c in self.docker_calls())

    return Host()


def test_an_image_made_before_stamps_is_adopted_then_reused(host, registry):
    made = registry.put_image({"io.mtp-image-builder.standin": LABEL})
    first = host.run()
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == f"{host.ref}@{made}"
    assert host.imports() == 0 and host.docker_calls() == []
    assert host.stamp.read_text().split()[1] == made
    assert host.complete.read_text().strip()  # the rootfs now carries its key
    registry.requests.clear()
    second = host.run()
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[-1] == f"{host.ref}@{made}"
    assert host.imports() == 0
    assert f"HEAD /v2/{NAME}/manifests/{made}" in registry.requests


def test_an_image_without_the_label_is_not_adopted(host, registry):
    registry.put_image({"something": "else"})
    proc = host.run()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"{host.ref}@{PUSHED}"
    assert host.imports() == 1
    assert host.stamp.read_text().split()[1] == PUSHED
    # the image the tag named before is not left behind untagged
    assert "image rm sha256:old" in host.docker_calls()


def test_a_stamped_digest_gone_from_the_registry_is_imported_again(host, registry):
    made = registry.put_image({"io.mtp-image-builder.standin": LABEL})
    assert host.run().returncode == 0  # adopted
    del registry.objects[made]
    proc = host.run()
    assert proc.returncode == 0, proc.stderr
    assert host.imports() == 1
    assert "gone from" in proc.stderr
    assert proc.stdout.splitlines()[-1] == f"{host.ref}@{PUSHED}"


def test_a_stamp_from_other_inputs_is_imported_again(host, registry):
    made = registry.put_image({"io.mtp-image-builder.standin": LABEL})
    assert host.run().returncode == 0  # adopted
    host.stamp.write_text(f"{'0' * 64} {made}\n")
    proc = host.run()
    assert proc.returncode == 0, proc.stderr
    assert host.imports() == 1
    assert "inputs changed" in proc.stderr


def test_another_python_makes_the_rootfs_again(host, registry, tmp_path):
    registry.put_image({"io.mtp-image-builder.standin": LABEL})
    assert host.run().returncode == 0  # adopted: the rootfs's key is recorded
    (tmp_path / "python" / "bin" / "python3.12").unlink()
    (tmp_path / "python" / "bin" / "python3.12").write_text(
        f'#!/bin/sh\n[ "$1" = -VV ] && {{ echo "Python 3.12.9"; exit 0; }}\nexec {sys.executable} "$@"\n'
    )
    (tmp_path / "python" / "bin" / "python3.12").chmod(0o755)
    proc = host.run()
    assert proc.returncode != 0
    assert "fake debootstrap" in proc.stderr or "needs root" in proc.stderr
    assert host.imports() == 0


def test_a_registry_that_does_not_answer_stops_it_first(host, registry):
    proc = host.run(MTP_STANDIN_REGISTRY="127.0.0.1:9")
    assert proc.returncode == 1
    assert "registry 127.0.0.1:9 does not answer" in proc.stderr
    assert host.imports() == 0
