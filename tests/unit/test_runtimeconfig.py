"""The files an exported squashfs carries the image's ENV in, per runtime, and how they are
placed in the unpacked rootfs (never through a link)."""

from __future__ import annotations

import os
import subprocess

import pytest

from mtpimage.errors import InputError
from mtpimage.outputs import runtimeconfig
from mtpimage.outputs.squashfs import _place

ENV = [
    "PATH=/opt/venv/bin:/usr/local/cuda/bin:/usr/bin:/bin",
    "NVIDIA_VISIBLE_DEVICES=all",
    'ODD=a "quoted" $HOME `x` \\ end',
    "EMPTY=",
    "NOVALUE",
    "1BAD=skipped",
]


def test_enroot_gets_etc_environment_as_enroot_import_writes_it():
    (f,) = runtimeconfig.files_for("enroot", ENV)
    assert f.path == "etc/environment" and f.mode == 0o644
    assert f.text.splitlines() == ENV  # config Env, one entry a line (enroot's docker::configure)


def test_apptainer_gets_its_docker_env_script_that_a_shell_reads_back(tmp_path):
    (f,) = runtimeconfig.files_for("apptainer", ENV)
    assert f.path == ".singularity.d/env/10-docker2singularity.sh" and f.mode == 0o755
    assert "1BAD" not in f.text
    script = tmp_path / "env.sh"
    script.write_text(f.text)
    # sourced with a host PATH and a host value for NVIDIA_VISIBLE_DEVICES, as Apptainer does
    probe = 'printf "%s\\n" "$PATH" "$NVIDIA_VISIBLE_DEVICES" "$ODD" "[$EMPTY]" "[$NOVALUE]"'
    out = subprocess.run(
        ["sh", "-c", f". {script}; {probe}"],
        env={"PATH": "/host/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "0,1", "HOME": "/root"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        "/opt/venv/bin:/usr/local/cuda/bin:/usr/bin:/bin",  # the image's PATH wins
        "0,1",  # the host's value wins where it set one
        'a "quoted" $HOME `x` \\ end',  # taken literally: nothing expanded
        "[]",
        "[]",
    ]


def test_place_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    root, outside = tmp_path / "rootfs", tmp_path / "host-file"
    (root / "etc").mkdir(parents=True)
    outside.write_text("host's own\n")
    (root / "etc" / "environment").symlink_to(outside)
    _place(root, runtimeconfig.RootfsFile("etc/environment", "A=1\n", 0o644))
    assert outside.read_text() == "host's own\n"
    placed = root / "etc" / "environment"
    assert not placed.is_symlink() and placed.read_text() == "A=1\n"
    assert oct(placed.stat().st_mode & 0o777) == oct(0o644)


def test_place_refuses_a_folder_that_links_out_of_the_rootfs(tmp_path):
    root, outside = tmp_path / "rootfs", tmp_path / "host-etc"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "etc")
    with pytest.raises(InputError) as exc:
        _place(root, runtimeconfig.RootfsFile("etc/environment", "A=1\n", 0o644))
    assert "links outside the image" in exc.value.one_line()
    assert list(outside.iterdir()) == []


def test_place_makes_missing_folders(tmp_path):
    _place(
        tmp_path,
        runtimeconfig.RootfsFile(".singularity.d/env/10-docker2singularity.sh", "#!/bin/sh\n", 0o755),
    )
    assert os.access(tmp_path / ".singularity.d/env/10-docker2singularity.sh", os.X_OK)
