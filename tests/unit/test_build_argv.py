"""The docker CLI command line of a build: an extension's builder stage exports its files."""

from __future__ import annotations

from pathlib import Path

from mtpimage.engine.containerengine import BuildRequest
from mtpimage.engine.dockerengine import BuildKitCLI, build_argv


def _argv(**kw) -> list[str]:
    kit = BuildKitCLI("/usr/bin/docker", "builtin", "20.10")
    return build_argv(kit, BuildRequest(context_tar=b"", labels={}, **kw), Path("/tmp/iid"))


def test_an_image_build_asks_for_its_image_id():
    assert "--iidfile" in _argv()


def test_a_local_export_asks_for_no_image_id(tmp_path):
    # docker 20.10 writes the files, then fails: "server did not provide an image ID"
    argv = _argv(target="mtp-ext-wheel-x", output_dir=tmp_path, build_args=(("A", "1"),), network="host")
    assert "--iidfile" not in argv
    assert argv[argv.index("--output") + 1] == f"type=local,dest={tmp_path.resolve()}"
    assert argv[argv.index("--target") + 1] == "mtp-ext-wheel-x"
    assert argv[argv.index("--build-arg") + 1] == "A=1"
    assert argv[argv.index("--network") + 1] == "host"
