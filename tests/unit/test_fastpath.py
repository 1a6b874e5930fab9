"""The remembered no-op (mtpimage/assembly/fastpath.py): every input the main job reads must miss when
it changes, and a hit must still ask dockerd. dockerd is a small fake on a unix socket here;
tests/e2e/test_fastpath_e2e.py runs the same against the real engine."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtpimage import cli, locations
from mtpimage.assembly import fastpath, pipeline
from mtpimage.plan import model

REPO = Path(__file__).resolve().parents[2]


class FakeEngine:
    """GET /images/{ref}/json answered from a dict, over a unix socket, like dockerd."""

    def __init__(self, path: Path):
        self.images: dict[str, str] = {}
        self.requests: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                path = data.split(b" ")[1].decode()
                self.requests.append(path)
                ref = path[len("/images/") : -len("/json")]
                if ref in self.images:
                    body = json.dumps({"Id": self.images[ref]}).encode()
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
                else:
                    conn.sendall(b'HTTP/1.0 404 Not Found\r\n\r\n{"message":"No such image"}')


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A copy of everything the key covers, so each test may change any byte of it."""
    pkg = tmp_path / "pkg"
    shutil.copytree(locations.PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    images = tmp_path / "images"
    shutil.copytree(locations.IMAGES_DIR, images)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("build.py", "requirements.txt"):
        shutil.copy(REPO / name, checkout / name)
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    monkeypatch.setattr(locations, "PACKAGE", pkg)
    monkeypatch.setattr(locations, "IMAGES_DIR", images)
    monkeypatch.setattr(locations, "CHECKOUT", checkout)
    monkeypatch.setattr(locations, "DEFAULT_MANIFESTS", manifests)
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.delenv("MTP_FASTPATH", raising=False)
    engine = FakeEngine(tmp_path / "docker.sock")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'docker.sock'}")
    engine.images.update(
        {"mtp-verl:mtp-detach-0123456789ab": "sha256:aaa", "mtp-verl:mtp-detach": "sha256:aaa"}
    )
    return {"pkg": pkg, "images": images, "checkout": checkout, "manifests": manifests, "engine": engine}


ARGV = ["--profile", "mtp-detach"]
REF = "mtp-verl:mtp-detach-0123456789ab"
RESULT = pipeline.JobResult(pipeline.BUILT, REF, "sha256:aaa", local_only=True)  # what run() returned
PRINTED = [
    ["out", "plan of mtp-detach\n"],
    ["err", "warning: something users must see\n"],
    ["out", f"more plan\nimage   {REF}\nbuilt   sha256:aaa\n"],
    ["err", "#1 BuildKit output\n"],
]


def _remember(argv=ARGV):
    reply, key = fastpath.lookup(argv)
    assert reply is None and key
    assert fastpath.remember(argv, key, RESULT, PRINTED)
    return key


def test_a_remembered_run_replays_what_it_printed_up_to_its_image_line(world):
    _remember()
    reply, _ = fastpath.lookup(ARGV)
    assert reply == [
        ["out", "plan of mtp-detach\n"],
        ["err", "warning: something users must see\n"],
        ["out", f"more plan\nimage   {REF}\nup to date: {REF} exists locally; nothing to build\n"],
    ]
    # and it asked dockerd about both tags, every time
    assert world["engine"].requests[-2:] == [f"/images/{REF}/json", "/images/mtp-verl:mtp-detach/json"]


@pytest.mark.parametrize(
    "change",
    [
        "manifest",
        "lock",
        "profile",
        "template",
        "check",
        "install-helper",
        "module",
        "data",
        "build.py",
        "requirements",
        "new-file",
    ],
)
def test_any_changed_input_misses(world, change):
    _remember()
    target = {
        "manifest": world["manifests"] / "components.yaml",
        "lock": world["manifests"] / "lock.yaml",
        "profile": world["manifests"] / "profiles" / "mtp-detach.yaml",
        "template": world["images"] / "Dockerfile.j2",
        "check": world["images"] / "checks" / "run_checks.py",
        "install-helper": world["images"] / "lib" / "mtp_install.py",
        "module": world["pkg"] / "assembly" / "render.py",
        "data": world["pkg"] / "data" / "rules.yaml",
        "build.py": world["checkout"] / "build.py",
        "requirements": world["checkout"] / "requirements.txt",
        "new-file": world["manifests"] / "profiles" / "new.yaml",
    }[change]
    if change == "new-file":
        target.write_text("name: new\n")
    else:
        target.write_bytes(target.read_bytes() + b"\n")
    assert fastpath.lookup(ARGV)[0] is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--profile", "mtp-full"],
        ["--profile", "mtp-detach", "--set", "verl.commit=abc"],
        ["--profile", "mtp-detach", "--ca-bundle", "/etc/ssl/other.pem"],
    ],
)
def test_another_command_line_misses(world, argv):
    _remember()
    world["engine"].images["mtp-verl:mtp-full"] = "sha256:aaa"
    assert fastpath.lookup(argv)[0] is None


def test_an_environment_variable_of_the_tool_misses(world, monkeypatch):
    _remember()
    monkeypatch.setenv("MTP_SUBSTITUTE_BASE", "127.0.0.1:5000/other@sha256:" + "0" * 64)
    assert fastpath.lookup(ARGV)[0] is None
    monkeypatch.delenv("MTP_SUBSTITUTE_BASE")
    assert fastpath.lookup(ARGV)[0] is not None


@pytest.mark.parametrize("what", ["identity-gone", "profile-tag-moved", "profile-tag-gone", "engine-down"])
def test_the_engine_decides_every_time(world, what):
    _remember()
    images = world["engine"].images
    if what == "identity-gone":
        del images[REF]
    elif what == "profile-tag-moved":
        images["mtp-verl:mtp-detach"] = "sha256:bbb"
    elif what == "profile-tag-gone":
        del images["mtp-verl:mtp-detach"]
    else:
        path = world["engine"].sock.getsockname()
        world["engine"].sock.close()
        Path(path).unlink()
    assert fastpath.lookup(ARGV)[0] is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--profile", "mtp-detach", "--push", "--registry", "127.0.0.1:5000/x"],
        ["--json"],
        ["--dry-run"],
        ["list"],
        ["check"],
        ["--profile", "a", "--profile", "b"],
        ["--profile"],
        ["--gpu"],
        ["--no-cache"],
    ],
)
def test_only_the_plain_local_main_job_is_remembered(world, argv):
    assert fastpath.parse(argv) is None
    assert fastpath.lookup(argv) == (None, None)


def test_off_switch_and_no_memo_without_the_image_line(world, monkeypatch):
    reply, key = fastpath.lookup(ARGV)
    assert not fastpath.remember(ARGV, key, RESULT, [["out", "no image line here\n"]])
    assert fastpath.lookup(ARGV)[0] is None
    _remember()
    monkeypatch.setenv("MTP_FASTPATH", "0")
    assert fastpath.lookup(ARGV) == (None, None)


def test_not_remembered_when_the_profile_tag_is_elsewhere(world):
    world["engine"].images["mtp-verl:mtp-detach"] = "sha256:bbb"
    _, key = fastpath.lookup(ARGV)
    assert not fastpath.remember(ARGV, key, RESULT, PRINTED)


def test_constants_agree_with_the_tool():
    assert fastpath.local_image("t") == f"{model.IMAGE_REPOSITORY}:t"
    assert fastpath.DEFAULT_PROFILE == cli.DEFAULT_PROFILE
    assert "MTP_" not in fastpath.__doc__.split("What the key covers")[0]  # read only by settings.py
    # the options it accepts: tests/unit/test_main_flags.py


def test_summary_file_is_outside_the_key_and_a_hit_writes_it(world, tmp_path):
    """The real-stack script passes --summary-file: its warm no-op must answer from the memo
    too, wherever the summary goes, and still leave the summary a full run would write."""
    first = tmp_path / "a" / "summary.json"
    _remember([*ARGV, "--summary-file", str(first)])
    second = tmp_path / "b" / "summary.json"
    reply, _ = fastpath.lookup([*ARGV, "--summary-file", str(second)])
    assert reply is not None
    assert json.loads(second.read_text()) == {
        "profile": "mtp-detach",
        "image": REF,
        "pushed": False,
        "references": [],
        "digest": None,
        "up_to_date": True,
    }
    assert fastpath.lookup(ARGV)[0] is not None  # the same memo serves the run without it


def test_a_summary_file_that_cannot_be_written_takes_the_full_path(world, tmp_path):
    _remember()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert fastpath.lookup([*ARGV, "--summary-file", str(blocker / "summary.json")])[0] is None


def test_the_replayed_summary_is_the_one_the_full_path_writes(tmp_path, monkeypatch):
    from mtpimage.manifests import manifest

    monkeypatch.setattr(pipeline, "check_frozen", lambda job, warn: None)
    both_tags = SimpleNamespace(image_id=lambda ref: "sha256:aaa")  # both tags on the image
    m = manifest.load()
    job = pipeline.MainJob(
        manifests=m,
        plan=cli.plan_for(m, "mtp-detach", None),
        build=pipeline.BuildOptions(engine=both_tags),
        summary_file=tmp_path / "s.json",
    )
    said: list[str] = []
    result = pipeline.run(job, say=said.append)
    assert result.exit_code == 0 and result.state == pipeline.UP_TO_DATE and result.rememberable
    ref = next(line.split()[1] for line in said if line.startswith("image "))
    assert (tmp_path / "s.json").read_text() == fastpath.summary("mtp-detach", ref)


def test_the_memo_follows_the_result_not_console_wording(world):
    """The heading and the up-to-date line come from the pipeline's JobResult; a run that was
    not a plain local one (a registry, or no image here) is never remembered."""
    _, key = fastpath.lookup(ARGV)
    pushed = pipeline.JobResult(pipeline.BUILT, REF, "sha256:aaa", local_only=False, pushed=True)
    assert not fastpath.remember(ARGV, key, pushed, PRINTED)
    assert not fastpath.remember(ARGV, key, None, PRINTED)
    assert fastpath.remember(ARGV, key, RESULT, PRINTED)
    reply, _ = fastpath.lookup(ARGV)
    assert reply[-1][1].endswith(f"{RESULT.heading}\n{RESULT.up_to_date}\n")


def test_a_manifests_path_that_is_a_symlink_loop_is_one_line_not_a_traceback(tmp_path):
    from .helpers import assert_one_line_error, run_cli

    (tmp_path / "loop1").symlink_to("loop1")
    proc = run_cli(
        "--manifests", "loop1", "--profile", "test-detach", cwd=tmp_path, env={"MTP_FASTPATH": "1"}
    )
    assert_one_line_error(proc, "loop1", "manifests directory not found")
