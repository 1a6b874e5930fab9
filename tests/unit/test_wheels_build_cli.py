"""`wheels build` (issue 49): the profile's extension wheels without an image. What it refuses
before anything compiles, in one line: a package the profile does not compile, and an arch
list the rules refuse (flash-attn 2.8.3 would skip sm_103 without a word). The compile itself
is the main job's (tests/unit/test_wheel_key.py: `only` builds just the packages asked for)."""

from __future__ import annotations

from .helpers import assert_one_line_error, run_cli


def test_a_package_the_profile_does_not_compile_is_refused(tmp_path):
    proc = run_cli(
        "wheels",
        "build",
        "--profile",
        "mtp-detach",
        "--package",
        "torch",
        env={"MTP_CACHE_DIR": str(tmp_path)},
    )
    assert_one_line_error(proc, "--package", "torch", "transformer-engine-torch, apex, flash-attn")


def test_an_arch_an_extension_cannot_target_stops_before_any_compile(tmp_path):
    proc = run_cli(
        "wheels",
        "build",
        "--profile",
        "mtp-detach",
        "--set",
        "builds.cuda_archs=90,103",
        env={"MTP_CACHE_DIR": str(tmp_path)},
    )
    assert_one_line_error(proc, "extension-cuda-archs", "sm_103", "flash-attn 2.8.3", code=1)
    assert not (tmp_path / "ext-wheels").exists()
