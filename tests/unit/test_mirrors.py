"""#37 item 1: builds through a site's index and registry mirrors (mtpimage/mirrors.py,
images/lib/mtp_pip.py, the engines). The mirror is a build-time input only: the rendered
files, the identity, the version vector and the compiled extensions' wheel keys are the same
with and without it; it reaches pip as a secret and the base's FROM in the context sent; a
token in a mirror URL is redacted from every line."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import stat
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtpimage import mirrors
from mtpimage.assembly.render import deterministic_tar, render
from mtpimage.commands.load import plan_for
from mtpimage.engine import buildlog, buildstream, containerengine, dockerengine
from mtpimage.engine.containerengine import BuildRequest, mirrored_bases, mirrored_dockerfile, secret_files
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.ext import extensions
from mtpimage.manifests import manifest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "manifests"
DIGEST = "sha256:" + "ab" * 32
MIRROR = "https://bob:s3cret@pypi.mirror.example/simple"
REGISTRY = "docker.io=registry.mirror.example:5000/hub"


@pytest.fixture(autouse=True)
def _no_site_mirrors(monkeypatch):
    for var in ("MTP_INDEX_REWRITE", "MTP_REGISTRY_MIRROR", "MTP_SUBSTITUTE_BASE", "MTP_OMIT_PACKAGES"):
        monkeypatch.delenv(var, raising=False)


def _site(monkeypatch) -> None:
    monkeypatch.setenv(
        "MTP_INDEX_REWRITE",
        f"https://pypi.org/simple={MIRROR};https://download.pytorch.org=http://10.0.0.7:3141/torch",
    )
    monkeypatch.setenv("MTP_REGISTRY_MIRROR", REGISTRY)


# ----------------------------------------------------------------------------- settings
def test_the_longest_index_prefix_wins_and_other_urls_stay(monkeypatch):
    monkeypatch.setenv(
        "MTP_INDEX_REWRITE", "https://pypi.org=http://a  https://pypi.org/simple=http://b/pypi"
    )
    m = mirrors.current()
    assert m.index_url("https://pypi.org/simple/torch/") == "http://b/pypi/torch/"
    assert m.index_url("https://pypi.org/other") == "http://a/other"
    assert m.index_url("https://download.pytorch.org/whl") == "https://download.pytorch.org/whl"


def test_a_malformed_index_pair_names_the_setting_without_the_token(monkeypatch):
    monkeypatch.setenv("MTP_INDEX_REWRITE", "https://bob:s3cret@mirror/simple")
    with pytest.raises(InputError) as exc:
        mirrors.current()
    assert exc.value.where == "MTP_INDEX_REWRITE" and "s3cret" not in str(exc.value)


def test_a_registry_mirror_serves_the_base_by_its_digest():
    [m] = mirrors.parse_registry(REGISTRY)
    assert (m.registry, m.host, m.prefix) == ("docker.io", "registry.mirror.example:5000", "hub")
    cuda = f"nvidia/cuda:13.0.2-devel-ubuntu24.04@{DIGEST}"
    assert m.ref(cuda) == f"registry.mirror.example:5000/hub/nvidia/cuda@{DIGEST}"
    assert (
        m.ref(f"docker.io/library/ubuntu:24.04@{DIGEST}")
        == f"registry.mirror.example:5000/hub/library/ubuntu@{DIGEST}"
    )
    assert m.ref(f"ubuntu@{DIGEST}") == f"registry.mirror.example:5000/hub/library/ubuntu@{DIGEST}"
    assert m.ref(f"nvcr.io/nvidia/pytorch:25.01@{DIGEST}") is None  # another registry
    [loop] = mirrors.parse_registry("127.0.0.1:5000=127.0.0.1:5001")
    assert loop.ref(f"127.0.0.1:5000/mtp-test/base:x@{DIGEST}") == f"127.0.0.1:5001/mtp-test/base@{DIGEST}"


def test_a_base_without_a_digest_is_not_taken_from_a_mirror():
    [m] = mirrors.parse_registry(REGISTRY)
    with pytest.raises(InputError) as exc:
        m.ref("nvidia/cuda:13.0.2-devel-ubuntu24.04")
    assert "digest" in exc.value.problem and exc.value.where == "MTP_REGISTRY_MIRROR"


@pytest.mark.parametrize("bad", ["docker.io", "docker.io=", "cuda=mirror:5000", "docker.io=http://mirror"])
def test_a_malformed_registry_mirror_is_one_input_error(bad):
    with pytest.raises(InputError) as exc:
        mirrors.parse_registry(bad, "--registry-mirror")
    assert exc.value.where == "--registry-mirror"


def test_the_flag_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("MTP_REGISTRY_MIRROR", "docker.io=from-env:5000")
    assert mirrors.Mirrors.configured().registries[0].host == "from-env:5000"
    flagged = mirrors.Mirrors.configured(["docker.io=from-flag:5000"])
    assert [r.host for r in flagged.registries] == ["from-flag:5000"]


def test_a_build_gets_the_exact_table_of_its_plans_indexes(monkeypatch):
    _site(monkeypatch)
    bm = mirrors.Mirrors.configured().for_build(["https://pypi.org/simple", "https://example.org/simple"])
    assert bm.indexes == (("https://pypi.org/simple", MIRROR),)
    assert json.loads(bm.secret()) == {"https://pypi.org/simple": MIRROR}
    assert mirrors.Mirrors().for_build(["https://pypi.org/simple"]).secret() == b""
    assert "s3cret" not in bm.describe() and "docker.io -> registry.mirror.example:5000/hub" in bm.describe()


def test_redact_takes_the_user_and_token_out_of_every_url():
    text = f"Looking in indexes: {MIRROR} and git+https://tok@host/x.git, http://plain/simple"
    assert mirrors.redact(text) == (
        "Looking in indexes: https://****@pypi.mirror.example/simple and git+https://****@host/x.git, "
        "http://plain/simple"
    )


# ----------------------------------------------------------------------------- nothing that names the image
def _everything(profile: str) -> tuple[dict, str, list]:
    m = manifest.load(SHIPPED)
    rendered = render(plan_for(m, profile, None), SHIPPED)
    return rendered.files, rendered.identity, [e["key"] for e in rendered.extensions]


@pytest.mark.parametrize("profile", manifest.load(SHIPPED).names())
def test_rendered_files_identity_and_wheel_keys_are_the_same_through_mirrors(profile, monkeypatch):
    before = _everything(profile)
    _site(monkeypatch)
    after = _everything(profile)
    assert after == before
    assert b"mirror.example" not in b"".join(after[0].values())


def test_every_step_that_runs_pip_mounts_the_index_table():
    """Each RUN that sources pip-env.sh (every install step, every builder stage) mounts the
    secret it reads; a step without it would go to the manifests' own index."""
    files, _identity, _keys = _everything("mtp-detach")
    runs = [
        r for r in files["Dockerfile"].decode().split("\nRUN ")[1:] if ". /tmp/mtp-build/lib/pip-env.sh" in r
    ]
    assert len(runs) >= 8
    for run in runs:
        assert f"--mount=type=secret,id={mirrors.INDEX_SECRET} " in run.split("pip-env.sh")[0]


def test_the_mirror_mount_is_no_part_of_a_wheels_recipe():
    """The key hashes the stage without the mirror mount: the keys recorded before mirrors
    existed (the golden version vectors, wheels.lock.yaml) stay valid."""
    text = (
        "RUN --mount=type=secret,id=netrc,target=/root/.netrc \\\n"
        f"    {extensions.MIRROR_MOUNT}\n"
        "    . /tmp/mtp-build/lib/pip-env.sh; \\\n"
        "# a comment\n"
    )
    assert extensions.recipe_lines(text) == (
        "RUN --mount=type=secret,id=netrc,target=/root/.netrc \\\n    . /tmp/mtp-build/lib/pip-env.sh; \\\n"
    )


# ----------------------------------------------------------------------------- the engines
def test_every_secret_is_given_empty_when_the_run_has_none(tmp_path):
    """buildah leaves /run/secrets/ in a layer only when a secret is given: always giving all
    three keeps a build with a CA bundle or mirrors bit for bit the one without."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("CA\n")
    bm = mirrors.BuildMirrors((("https://pypi.org/simple", MIRROR),))
    with secret_files(BuildRequest(b"", {}, ca_bundle=bundle, mirrors=bm)) as secrets:
        assert list(secrets) == ["ca-bundle", "netrc", "index-mirrors"]
        assert secrets["ca-bundle"] == bundle.resolve()
        assert secrets["netrc"].read_bytes() == b""
        assert json.loads(secrets["index-mirrors"].read_text()) == {"https://pypi.org/simple": MIRROR}
        assert stat.S_IMODE(secrets["index-mirrors"].stat().st_mode) == 0o600
        written = secrets["index-mirrors"]
    assert not written.exists()
    with pytest.raises(InputError):
        with secret_files(BuildRequest(b"", {}, netrc=tmp_path / "none")):
            pass


def _argv(req: BuildRequest, secrets=None) -> list[str]:
    kit = dockerengine.BuildKitCLI("/usr/bin/docker", "builtin", "20.10")
    return dockerengine.build_argv(kit, req, Path("/tmp/iid"), secrets)


def test_a_loopback_index_mirror_builds_on_the_hosts_network():
    local = mirrors.BuildMirrors((("https://pypi.org/simple", "http://127.0.0.1:3141/root/pypi"),))
    remote = mirrors.BuildMirrors((("https://pypi.org/simple", MIRROR),))
    assert "--network" not in _argv(BuildRequest(b"", {}, mirrors=remote))
    argv = _argv(BuildRequest(b"", {}, mirrors=local))
    assert argv[argv.index("--network") + 1] == "host"
    with secret_files(BuildRequest(b"", {}, mirrors=local)) as secrets:
        argv = _argv(BuildRequest(b"", {}, mirrors=local), secrets)
    assert [a.split(",")[0] for a in argv if a.startswith("id=")] == [
        f"id={s}" for s in containerengine.SECRETS
    ]


DOCKERFILE = f"""# Plan digest: x
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04@{DIGEST} AS mtp-torch
RUN echo FROM nvidia/cuda
FROM mtp-torch AS mtp-ext-build-x
FROM scratch AS mtp-ext-wheel-x
FROM mtp-torch AS mtp-image
"""


def test_only_the_base_images_from_names_the_mirror():
    bm = mirrors.BuildMirrors((), mirrors.parse_registry(REGISTRY))
    bases = mirrored_bases(DOCKERFILE, bm)
    assert [(b.ref, b.mirror_ref) for b in bases] == [
        (
            f"nvidia/cuda:13.0.2-devel-ubuntu24.04@{DIGEST}",
            f"registry.mirror.example:5000/hub/nvidia/cuda@{DIGEST}",
        )
    ]
    out = mirrored_dockerfile(DOCKERFILE, bases)
    assert out == DOCKERFILE.replace(
        f"FROM nvidia/cuda:13.0.2-devel-ubuntu24.04@{DIGEST} AS",
        f"FROM registry.mirror.example:5000/hub/nvidia/cuda@{DIGEST} AS",
    )
    assert mirrored_bases(DOCKERFILE, mirrors.BuildMirrors()) == []
    err = bases[0].failed("connection refused")
    assert "MTP_REGISTRY_MIRROR" in str(
        err
    ) and "--registry-mirror docker.io=registry.mirror.example:5000/hub" in str(err)


def test_the_docker_engine_sends_the_mirrored_from_and_every_other_byte_as_it_was(monkeypatch):
    files = {
        "Dockerfile": DOCKERFILE.encode(),
        "src/x/" + "deep/" * 30 + "a.py": b"A" * 3000,
        "build/lib/b": b"b",
    }
    context = deterministic_tar(files)
    pulled = []
    eng = dockerengine.DockerEngine()
    monkeypatch.setattr(eng, "image_id", lambda ref: None)
    monkeypatch.setattr(eng, "pull", pulled.append)
    req = BuildRequest(context, {}, mirrors=mirrors.BuildMirrors((), mirrors.parse_registry(REGISTRY)))
    sent = b"".join(bytes(c) for c in eng._mirrored_context(req))
    assert pulled == [f"registry.mirror.example:5000/hub/nvidia/cuda@{DIGEST}"]
    with tarfile.open(fileobj=io.BytesIO(sent)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert got.pop("Dockerfile").decode() == mirrored_dockerfile(
        DOCKERFILE, mirrored_bases(DOCKERFILE, req.mirrors)
    )
    assert got == {k: v for k, v in files.items() if k != "Dockerfile"}
    # nothing mirrored: the request's own bytes, untouched
    assert eng._mirrored_context(BuildRequest(context, {})) is context


def test_a_mirror_that_cannot_give_the_base_is_one_line(monkeypatch):
    from mtpimage.engine.containerengine import PullFailed

    eng = dockerengine.DockerEngine()
    monkeypatch.setattr(eng, "image_id", lambda ref: None)

    def refuse(ref):
        raise PullFailed(ref, "unreachable", "dial tcp 10.0.0.9:5000: connect: connection refused")

    monkeypatch.setattr(eng, "pull", refuse)
    req = BuildRequest(
        deterministic_tar({"Dockerfile": DOCKERFILE.encode()}),
        {},
        mirrors=mirrors.BuildMirrors((), mirrors.parse_registry(REGISTRY)),
    )
    with pytest.raises(EnvironmentProblem) as exc:
        eng._mirrored_context(req)
    line = exc.value.one_line()
    assert (
        "registry mirror (MTP_REGISTRY_MIRROR" in line and "connection refused" in line and "(fix: " in line
    )


def test_a_build_logs_and_echoes_no_mirror_token(tmp_path, monkeypatch, capsys):
    script = (
        "print('#9 1.0 Looking in indexes: https://bob:s3cret@pypi.mirror.example/simple');"
        "print('#9 1.1 done')"
    )
    log = tmp_path / "build.log"
    code, tail = buildstream.stream_build(
        [sys.executable, "-c", script], dict(os.environ), [b"", b""], log, True
    )
    assert code == 0
    seen = capsys.readouterr().err + log.read_text() + "\n".join(tail)
    assert "s3cret" not in seen and "bob" not in seen and "https://****@pypi.mirror.example/simple" in seen


# ----------------------------------------------------------------------------- what a failure says
REFUSAL = """#9 3.2 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have tampered with them.
#9 3.2     tiny==0.1 from http://127.0.0.1:4000/simple/tiny/tiny-0.1-py3-none-any.whl#sha256=aa (from -r /tmp/r.txt (line 1)):
#9 3.2         Expected sha256 {pinned}
#9 3.2              Got        {got}
"""


def test_a_mirror_serving_other_bytes_names_the_setting():
    pinned, got = "a" * 64, "b" * 64
    watch = buildlog.Watcher(through_mirror=True)
    for line in REFUSAL.format(pinned=pinned, got=got).splitlines():
        watch.feed(line)
    line = watch.one_line()
    assert f"has sha256 {got}, lock.yaml pins {pinned}" in line
    assert "(fix: the index mirror that MTP_INDEX_REWRITE sends pip to serves other bytes" in line


def test_a_mirror_that_stops_answering_mid_build_names_the_setting(tmp_path):
    watch = buildlog.Watcher(through_mirror=True)
    for line in (
        "#9 1.0 WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
        "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at "
        "0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/tiny/",
        "#9 9.0 ERROR: Could not find a version that satisfies the requirement tiny==0.1 (from versions: none)",
        "#9 9.0 ERROR: No matching distribution found for tiny==0.1",
    ):
        watch.feed(line)
    text = buildlog.failure(watch, [], tmp_path / "x.log", None)
    assert text.startswith(
        "build failed: pip inside the build could not reach the index mirror set by MTP_INDEX_REWRITE: "
    )
    assert "[Errno 111] Connection refused (at /simple/tiny/)" in text and text.endswith(
        f"full log: {tmp_path / 'x.log'})"
    )
    lacking = buildlog.Watcher(through_mirror=True)
    lacking.feed("#9 9.0 ERROR: No matching distribution found for tiny==0.1")
    assert "the index mirror set by MTP_INDEX_REWRITE does not serve tiny==0.1" in buildlog.failure(
        lacking, [], None, None
    )
    plain = buildlog.Watcher()  # no mirrors: the cause as before
    plain.feed("#9 9.0 ERROR: No matching distribution found for tiny==0.1")
    assert "MTP_INDEX_REWRITE" not in buildlog.failure(plain, [], None, None)


def test_an_index_mirror_that_does_not_answer_stops_the_build_before_it_starts(monkeypatch):
    from mtpimage.assembly import pipeline

    monkeypatch.setenv("MTP_INDEX_REWRITE", "https://pypi.org/simple=http://bob:s3cret@127.0.0.1:9/simple")
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    plan = plan_for(manifest.load(SHIPPED), "mtp-detach", None)
    options = pipeline.BuildOptions()
    with pytest.raises(EnvironmentProblem) as exc:
        pipeline.index_preflight(plan, options.mirrors_for(plan))
    line = exc.value.one_line()
    assert line.startswith(
        "the index mirror http://****@127.0.0.1:9/simple that MTP_INDEX_REWRITE gives for https://pypi.org/simple does not answer: "
    )
    assert "s3cret" not in line and "(fix: " in line


def test_a_registry_mirror_that_does_not_answer_is_named_before_anything_builds(monkeypatch):
    from mtpimage.assembly import pipeline

    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    no_images = SimpleNamespace(image_id=lambda ref: None)
    plan = plan_for(manifest.load(SHIPPED), "mtp-detach", None)
    bm = mirrors.Mirrors.configured(["docker.io=127.0.0.1:9/hub"]).for_build([])
    with pytest.raises(EnvironmentProblem) as exc:
        pipeline.base_preflight(plan, no_images, bm)
    line = exc.value.one_line()
    assert line.startswith(f"base image {plan.base_image} through its registry mirror (MTP_REGISTRY_MIRROR")
    assert "127.0.0.1:9/hub/nvidia/cuda@sha256:" in line and "cannot be reached" in line


# ----------------------------------------------------------------------------- inside the build step
def _lib(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "images" / "lib" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLE = {
    "https://pypi.org/simple": MIRROR,
    "https://download.pytorch.org/whl/cu130": "http://10.0.0.7:3141/torch",
}


@pytest.mark.parametrize(
    "args,want",
    [
        (
            ["install", "--index-url", "https://pypi.org/simple", "-r", "r.txt"],
            ["install", "--index-url", MIRROR, "-r", "r.txt"],
        ),
        (["install", "-i", "https://pypi.org/simple", "x"], ["install", "-i", MIRROR, "x"]),
        (["install", "--index-url=https://pypi.org/simple", "x"], ["install", f"--index-url={MIRROR}", "x"]),
        (["install", "-ihttps://pypi.org/simple", "x"], ["install", f"-i{MIRROR}", "x"]),
        (
            [
                "install",
                "--index-url",
                "https://other.example/simple",
                "--extra-index-url",
                "https://pypi.org/simple",
            ],
            ["install", "--index-url", "https://other.example/simple", "--extra-index-url", MIRROR],
        ),
        (["install", "--no-index", "/tmp/x.whl"], ["install", "--no-index", "/tmp/x.whl"]),
        (
            ["install", "--index-url", "https://download.pytorch.org/whl/cu130", "torch"],
            [
                "install",
                "--index-url",
                "http://10.0.0.7:3141/torch",
                "torch",
                "--trusted-host",
                "10.0.0.7:3141",
            ],
        ),
    ],
)
def test_mtp_pip_rewrites_exactly_the_index_options(args, want):
    assert _lib("mtp_pip").rewrite(args, TABLE) == want


def test_mtp_pip_without_a_table_changes_nothing_and_runs_the_same_pip(tmp_path, monkeypatch):
    mtp_pip = _lib("mtp_pip")
    args = ["install", "--index-url", "https://pypi.org/simple", "x"]
    assert mtp_pip.rewrite(args, {}) == args
    assert mtp_pip.table(tmp_path / "absent") == {} and mtp_pip.table(_empty(tmp_path)) == {}
    ran = []
    monkeypatch.setattr(mtp_pip, "table", lambda path=None: TABLE)
    monkeypatch.setattr(mtp_pip.os, "execvp", lambda prog, argv: ran.append((prog, argv)))
    mtp_pip.main(args)
    assert ran == [("pip", ["pip", "install", "--index-url", MIRROR, "x"])]


def _empty(tmp_path: Path) -> Path:
    p = tmp_path / "empty"
    p.write_text("")
    return p


def test_a_git_sources_build_backends_come_through_the_mirror(tmp_path, monkeypatch):
    """mtp_install.py build-source runs its own pip (a throwaway venv's): through the table."""
    mtp_install = _lib("mtp_install")
    mtp_pip = _lib("mtp_pip")
    monkeypatch.setitem(sys.modules, "mtp_pip", mtp_pip)
    monkeypatch.setattr(mtp_pip, "table", lambda path=None: TABLE)
    calls = []
    monkeypatch.setattr(mtp_install.subprocess, "run", lambda argv, **kw: calls.append(argv))
    args = type(
        "A",
        (),
        {
            "src": tmp_path,
            "name": "x",
            "build_requirements": tmp_path / "b.txt",
            "index_url": "https://pypi.org/simple",
        },
    )
    mtp_install._build_source(args, [])
    [install] = [c for c in calls if "--require-hashes" in c]
    assert install[install.index("--index-url") + 1] == MIRROR
