"""The conflict classes of the real stack, reproduced with stand-in packages (metadata-only
wheels written here, resolved by uv offline from a local folder): each fails without the
declared override/exclude, and resolves with it. Plus the pieces that used to be wrong:
file selection for linux_x86_64 wheels, versions read from the source, layer assignment."""

from __future__ import annotations

import textwrap

import pytest

from mtpimage.lock import pydeps, resolver, srcmeta


def _wheels(tmp_path, specs):
    d = tmp_path / "wheels"
    d.mkdir(exist_ok=True)
    for name, version, requires in specs:
        pydeps.write_stub_wheel(d, name, version, requires)
    return [str(d)]


def _resolve(tmp_path, reqs, specs, overrides=(), excludes=()):
    return resolver.resolve(
        reqs, {}, list(overrides), list(excludes), [], "3.12", find_links=_wheels(tmp_path, specs)
    )


# sglang pins transformers==5.6.0; verl excludes 5.6.0; Bridge wants >=5.8
TRANSFORMERS = [("transformers", v, []) for v in ("5.6.0", "5.6.2", "5.8.0")] + [
    ("sglang", "0.5.12", ["transformers==5.6.0"]),
    ("verl", "0.10.0", ["transformers>=5.5.3,!=5.6.0,<5.11"]),
]


def test_transformers_pins_collide_without_an_override(tmp_path):
    with pytest.raises(resolver.ResolutionFailed, match="transformers"):
        _resolve(tmp_path, ["sglang==0.5.12", "verl==0.10.0"], TRANSFORMERS)


def test_the_transformers_override_resolves_and_replaces_every_declaration(tmp_path):
    res = _resolve(
        tmp_path, ["sglang==0.5.12", "verl==0.10.0"], TRANSFORMERS, overrides=["transformers==5.6.2"]
    )
    assert res.packages["transformers"]["version"] == "5.6.2"


def test_kernels_window_is_held_by_its_override(tmp_path):
    specs = [("kernels", v, []) for v in ("0.10.5", "0.17.2")] + [("sglang", "0.5.12", ["kernels"])]
    assert _resolve(tmp_path, ["sglang==0.5.12"], specs).packages["kernels"]["version"] == "0.17.2"
    res = _resolve(tmp_path, ["sglang==0.5.12"], specs, overrides=["kernels>=0.10.2,<0.11"])
    assert res.packages["kernels"]["version"] == "0.10.5"


def test_flash_attn_4_is_dropped_by_its_exclude(tmp_path):
    specs = [("flash-attn-4", "4.0.0b15", []), ("sglang", "0.5.12", ["flash-attn-4"])]
    assert "flash-attn-4" in _resolve(tmp_path, ["sglang==0.5.12"], specs).packages
    assert (
        "flash-attn-4"
        not in _resolve(tmp_path, ["sglang==0.5.12"], specs, excludes=["flash-attn-4"]).packages
    )


def test_torch_requirements_hold_in_the_one_resolution(tmp_path):
    """The old lock pinned setuptools 84 and triton 3.9 as constraints of later layers while
    torch requires setuptools<82 and triton==3.6.0: one resolution cannot do that."""
    specs = (
        [("setuptools", v, []) for v in ("81.0.0", "84.2.1")]
        + [("triton", v, []) for v in ("3.6.0", "3.9.0")]
        + [
            ("torch", "2.11.0", ["setuptools<82", "triton==3.6.0"]),
            ("other", "1.0", ["setuptools", "triton"]),
        ]
    )
    res = _resolve(tmp_path, ["torch==2.11.0", "other==1.0"], specs)
    assert res.packages["setuptools"]["version"] == "81.0.0" and res.packages["triton"]["version"] == "3.6.0"
    with pytest.raises(resolver.ResolutionFailed):
        _resolve(tmp_path, ["torch==2.11.0", "setuptools==84.2.1"], specs)


def test_a_no_deps_source_brings_only_its_runtime_needs(tmp_path):
    """Megatron-Bridge declares flashinfer==0.6.8.post1 against sglang's 0.6.11.post1; as a
    stub with dependencies.declared: false it contributes only what `add` lists."""
    specs = [("flashinfer-python", v, []) for v in ("0.6.8.post1", "0.6.11.post1")] + [
        ("sglang", "0.5.12", ["flashinfer-python==0.6.11.post1"])
    ]
    declared = {"version": "0.6.1", "requires": ["flashinfer-python==0.6.8.post1"]}
    with pytest.raises(resolver.ResolutionFailed, match="flashinfer"):
        resolver.resolve(
            ["sglang==0.5.12", "megatron-bridge==0.6.1"],
            {"megatron-bridge": declared},
            [],
            [],
            [],
            "3.12",
            find_links=_wheels(tmp_path, specs),
        )
    res = resolver.resolve(
        ["sglang==0.5.12", "megatron-bridge==0.6.1"],
        {"megatron-bridge": {"version": "0.6.1", "requires": []}},
        [],
        [],
        [],
        "3.12",
        find_links=_wheels(tmp_path, specs),
    )
    assert (
        res.packages["megatron-bridge"]["stub"]
        and res.packages["flashinfer-python"]["version"] == "0.6.11.post1"
    )


def test_wheelhouse_linux_x86_64_wheels_are_selectable():
    """verl's wheelhouse tags its wheels cp312-cp312-linux_x86_64 (not manylinux): the old
    --platform manylinux_* resolution could never select them."""
    tags = resolver.target_tags("3.12")
    files = [
        {"filename": "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", "hashes": {"sha256": "a" * 64}},
        {"filename": "flash_attn-2.8.3.tar.gz", "hashes": {"sha256": "b" * 64}},
    ]
    assert resolver.choose_file(files, "flash-attn", "2.8.3", tags)["sha256"] == "a" * 64
    manylinux = {
        "filename": "flash_attn-2.8.3-cp312-cp312-manylinux_2_28_x86_64.whl",
        "hashes": {"sha256": "c" * 64},
    }
    assert resolver.choose_file(files + [manylinux], "flash-attn", "2.8.3", tags)["sha256"] == "c" * 64
    # an sdist is chosen only when declared, never as a fallback
    assert resolver.choose_file(files[1:], "flash-attn", "2.8.3", tags) is None
    assert resolver.choose_file(files[1:], "flash-attn", "2.8.3", tags, sdist_ok=True)["sdist"] is True


def test_versions_come_from_the_source(tmp_path):
    """core_v0.19.0 builds megatron-core 0.19.1: the version is read, not guessed."""
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "megatron" / "core" / "package_info.py").write_text(
        "MAJOR = 0\nMINOR = 19\nPATCH = 1\nPRE_RELEASE = ''\n__version__ = '.'.join(map(str, (MAJOR, MINOR, PATCH)))\n"
    )
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent("""
        [project]
        name = "megatron-core"
        dynamic = ["version"]
        dependencies = ["torch>=2.6.0", "numpy"]
        [tool.setuptools.dynamic]
        version = { attr = "megatron.core.package_info.__version__" }
    """)
    )
    meta = srcmeta.read(tmp_path)
    assert (meta.name, meta.version, meta.requires) == ("megatron-core", "0.19.1", ("torch>=2.6.0", "numpy"))


def test_dynamic_dependencies_come_from_setup_py(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "verl"\nversion = "0.10.0.dev"\ndynamic = ["dependencies"]\n'
    )
    (tmp_path / "setup.py").write_text(
        'from setuptools import setup\nreqs = ["hydra-core", "transformers<5.11"]\n'
        'setup(name="verl", install_requires=reqs)\n'
    )
    assert srcmeta.read(tmp_path).requires == ("hydra-core", "transformers<5.11")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(install_requires=compute())\n")
    with pytest.raises(srcmeta.MetadataUnreadable):
        srcmeta.read(tmp_path)


def test_each_package_goes_to_the_lowest_layer_that_needs_it():
    pkgs = {
        "torch": {"via": []},
        "setuptools": {"via": ["torch", "verl"]},
        "sglang": {"via": []},
        "transformers": {"via": ["sglang", "megatron-bridge"]},
        "megatron-bridge": {"via": []},
        "verl": {"via": []},
        "cachetools": {"via": ["verl"]},
    }
    layers = resolver.assign_layers(
        pkgs,
        [("torch", ["torch"]), ("bridges", ["megatron-bridge"]), ("sglang", ["sglang"]), ("verl", ["verl"])],
    )
    assert layers == {
        "cachetools": "verl",
        "megatron-bridge": "bridges",
        "setuptools": "torch",
        "sglang": "sglang",
        "torch": "torch",
        "transformers": "bridges",
        "verl": "verl",
    }


def test_a_version_the_index_does_not_list_gets_a_fix_that_fits(tmp_path):
    """Issue #46: a failed lock said "an override or exclude" for a pin that is simply not on
    the index; uv's own words name it, and the fix says to pin a version the index lists."""
    from mtpimage.lock.pythonset import resolution_fix

    specs = [("tiny", "1.0", [])]
    with pytest.raises(resolver.ResolutionFailed) as info:
        _resolve(tmp_path, ["tiny==9.9"], specs)
    assert info.value.not_on_index == ["tiny==9.9"], info.value.reason
    fix = resolution_fix(info.value)
    assert (
        fix.startswith("tiny==9.9 is not on the index: pin a version the index lists")
        and "override" not in fix
    )
    with pytest.raises(resolver.ResolutionFailed) as conflict:
        _resolve(tmp_path, ["sglang==0.5.12", "verl==0.10.0"], TRANSFORMERS)
    assert conflict.value.not_on_index == [] and "override or exclude" in resolution_fix(conflict.value)


def test_uvs_reason_comes_before_its_warnings():
    stderr = (
        "warning: The package `a==1` does not have an extra named `b`\n"
        "  × No solution found when resolving dependencies:\n"
        "  ╰─▶ Because there is no version of torch==2.10.0 and you require torch==2.10.0, we can\n"
        "      conclude that your requirements are unsatisfiable.\n"
    )
    exc = resolver.uv_failure(stderr, 1)
    text = str(exc)
    assert text.startswith("× No solution found") and text.index("torch==2.10.0") < text.index("warning:")
    assert exc.warnings == ("warning: The package `a==1` does not have an extra named `b`",)
    assert exc.not_on_index == ["torch==2.10.0"]
