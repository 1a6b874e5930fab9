"""Each install step (mtpimage/assembly/steps.py) renders exactly its text, as hpccm's building
blocks are tested: one exact-string test per kind of step, its mounts and its files. The
expected strings are what images/partials/layer.j2 rendered for each kind before the steps
rendered themselves (the whole-Dockerfile goldens check them together, test_golden.py)."""

from __future__ import annotations

from pathlib import Path

from mtpimage.assembly import steps as st
from mtpimage.assembly.recipe import InstallLayer, recipe_of
from mtpimage.assembly.render import render
from mtpimage.assembly.templating import environment
from mtpimage.commands.load import plan_for
from mtpimage.locations import IMAGES_DIR
from mtpimage.manifests import manifest
from mtpimage.plan.model import LockedRow

PYPI = "https://pypi.org/simple"
ROWS = (
    LockedRow("numpy", "2.0.0", "torch", "pypi", "numpy-2.0.0.whl", "1" * 64),
    LockedRow("odd name", "1", "torch", "pypi", "odd.whl", "2" * 64),
)
PATCHES = (
    st.PatchFile("/tmp/mtp-patches/x/000-a b.patch", 1),
    st.PatchFile("/tmp/mtp-patches/x/001-c.patch", 0),
)
PATCH_ARGS = " --patch '/tmp/mtp-patches/x/000-a b.patch':1 --patch /tmp/mtp-patches/x/001-c.patch:0"


def _mounts(step: st.Step) -> list[str]:
    return [m.render() for m in step.mounts()]


def test_locked_wheels():
    step = st.LockedWheels("torch-my idx", "https://x y/simple", ROWS)
    assert step.render() == (
        "    pip install --no-deps --require-hashes --only-binary=:all: --index-url 'https://x y/simple' \\\n"
        "      -r /tmp/mtp-build/requirements/'torch-my idx.txt'; \\"
    )
    assert _mounts(step) == [
        "--mount=type=bind,source=build/requirements/torch-my idx.txt,"
        "target=/tmp/mtp-build/requirements/torch-my idx.txt"
    ]
    assert step.files() == {
        "build/requirements/torch-my idx.txt": (
            f"numpy==2.0.0 --hash=sha256:{'1' * 64}\nodd name==1 --hash=sha256:{'2' * 64}\n"
        ).encode()
    }
    assert step.installs() == ("numpy", "odd name")


def test_locked_sdists():
    step = st.LockedSdists("torch-pypi-sdist", PYPI, ROWS)
    assert step.render() == (
        "    pip install --no-deps --require-hashes --no-build-isolation --no-binary numpy --no-binary 'odd name' \\\n"
        "      --index-url https://pypi.org/simple -r /tmp/mtp-build/requirements/torch-pypi-sdist.txt; \\"
    )
    assert list(step.files()) == ["build/requirements/torch-pypi-sdist.txt"]
    assert step.installs() == ("numpy", "odd name")


def test_extension_wheels():
    step = st.ExtensionWheels("extensions")
    assert step.render() == (
        "    pip install --no-deps --require-hashes --only-binary=:all: --no-index "
        "-r /tmp/mtp-ext-wheels/requirements.txt; \\\n"
        "    python /tmp/mtp-build/lib/mtp_extension.py record --wheels /tmp/mtp-ext-wheels; \\"
    )
    assert _mounts(step) == ["--mount=type=bind,source=build/ext-wheels,target=/tmp/mtp-ext-wheels"]
    assert step.files() == {} and step.installs() == ()


def test_locked_git_source_with_backends():
    step = st.LockedGitSource(
        "h", package="h-core", index_url=PYPI, src="/tmp/mtp-src/h/python", build_rows=ROWS
    )
    assert step.render() == (
        "    python /tmp/mtp-build/lib/mtp_install.py build-source --name h --src /tmp/mtp-src/h/python \\\n"
        "      --build-requirements /tmp/mtp-build/requirements/build-h.txt --index-url https://pypi.org/simple; \\\n"
        "    python /tmp/mtp-build/lib/mtp_install.py record --name h --package h-core \\\n"
        "      --source git --src /tmp/mtp-src/h; \\"
    )
    assert _mounts(step) == [
        "--mount=type=bind,source=build/requirements/build-h.txt,target=/tmp/mtp-build/requirements/build-h.txt",
        "--mount=type=bind,source=src/h,target=/tmp/mtp-src/h,rw",
    ]
    assert list(step.files()) == ["build/requirements/build-h.txt"]


def test_locked_git_source_with_patches_and_no_backends():
    step = st.LockedGitSource("x", package="x", index_url=PYPI, src="/tmp/mtp-src/x", patches=PATCHES)
    assert step.render() == (
        f"    python /tmp/mtp-build/lib/mtp_install.py build-source --name x --src /tmp/mtp-src/x{PATCH_ARGS}; \\\n"
        "    python /tmp/mtp-build/lib/mtp_install.py record --name x --package x \\\n"
        f"      --source git --src /tmp/mtp-src/x{PATCH_ARGS}; \\"
    )
    assert _mounts(step) == [
        "--mount=type=bind,source=src/x,target=/tmp/mtp-src/x,rw",
        "--mount=type=bind,source=patches/x,target=/tmp/mtp-patches/x",
    ]
    assert step.files() == {}


def test_locked_pypi_component():
    assert st.LockedPypiComponent("p", package="p p").render() == (
        "    python /tmp/mtp-build/lib/mtp_install.py record --name p --package 'p p' \\\n      --source pypi; \\"
    )
    patched = st.LockedPypiComponent("x", package="x", patches=PATCHES)
    assert patched.render() == (
        f"    python /tmp/mtp-build/lib/mtp_install.py patch-installed --name x{PATCH_ARGS}; \\\n"
        "    python /tmp/mtp-build/lib/mtp_install.py record --name x --package x \\\n"
        f"      --source pypi{PATCH_ARGS}; \\"
    )
    assert _mounts(patched) == ["--mount=type=bind,source=patches/x,target=/tmp/mtp-patches/x"]


def test_packages_of_a_plan_without_a_lock():
    step = st.Packages(
        "torch-pytorch",
        layer="torch",
        index_url="https://download.pytorch.org/whl/cu130",
        extra_index_url=PYPI,
        requirements=("torch==2.9.0", "foo[x,y]==1.0"),
    )
    assert step.render() == (
        "    pip install --constraint /tmp/mtp-build/constraints/torch.txt \\\n"
        "      --index-url https://download.pytorch.org/whl/cu130 --extra-index-url https://pypi.org/simple \\\n"
        "      torch==2.9.0 'foo[x,y]==1.0'; \\"
    )
    assert st.Packages(
        "t", layer="torch", index_url=PYPI, extra_index_url=None, requirements=("a==1",)
    ).render() == (
        "    pip install --constraint /tmp/mtp-build/constraints/torch.txt \\\n"
        "      --index-url https://pypi.org/simple \\\n"
        "      a==1; \\"
    )
    assert step.mounts() == () and step.installs() == ("torch", "foo[x,y]")


def test_git_source_of_a_plan_without_a_lock():
    step = st.GitSource(
        "x",
        layer="megatron",
        package="x-core",
        index_url=PYPI,
        build_requires=("setuptools==80", "a b"),
        target="/tmp/mtp-src/x/sub[dev]",
        patches=PATCHES,
    )
    assert step.render() == (
        "    python /tmp/mtp-build/lib/mtp_install.py patch-source --name x \\\n"
        f"      --dir /tmp/mtp-src/x{PATCH_ARGS}; \\\n"
        "    pip install --index-url https://pypi.org/simple setuptools==80 'a b'; \\\n"
        "    pip install --no-build-isolation --constraint /tmp/mtp-build/constraints/megatron.txt \\\n"
        "      --index-url https://pypi.org/simple '/tmp/mtp-src/x/sub[dev]'; \\\n"
        "    python /tmp/mtp-build/lib/mtp_install.py record --name x --package x-core \\\n"
        f"      --source git --src /tmp/mtp-src/x{PATCH_ARGS}; \\"
    )
    plain = st.GitSource(
        "y", layer="l", package="y", index_url=PYPI, build_requires=(), target="/tmp/mtp-src/y"
    )
    assert "pip install --index-url" not in plain.render()


def test_pypi_component_of_a_plan_without_a_lock():
    step = st.PypiComponent(
        "y", layer="l", package="y", index_url="https://m/simple", extra_index_url=PYPI, requirement="y[a]==1"
    )
    assert step.render() == (
        "    pip install --constraint /tmp/mtp-build/constraints/l.txt \\\n"
        "      --index-url https://m/simple --extra-index-url https://pypi.org/simple \\\n"
        "      'y[a]==1'; \\\n"
        "    python /tmp/mtp-build/lib/mtp_install.py record --name y --package y \\\n"
        "      --source pypi; \\"
    )
    patched = st.PypiComponent(
        "x", layer="l", package="x", index_url=PYPI, extra_index_url=None, requirement="x==1", patches=PATCHES
    )
    assert f"patch-installed --name x{PATCH_ARGS}; \\\n" in patched.render()


def test_a_layer_lists_its_steps_mounts_by_kind_in_step_order():
    """Requirement files, then sources, then wheels, then patches: the Dockerfile's order."""
    steps = (
        st.LockedGitSource("g", package="g", index_url=PYPI, src="/tmp/mtp-src/g", patches=PATCHES[:1]),
        st.LockedWheels("l-pypi", PYPI, ROWS),
        st.ExtensionWheels("l"),
        st.LockedGitSource("h", package="h", index_url=PYPI, src="/tmp/mtp-src/h", build_rows=ROWS),
    )
    layer = InstallLayer("l", ("g", "h"), steps, locked=True)
    assert [m.source for m in layer.mounts()] == [
        "build/requirements/l-pypi.txt",
        "build/requirements/build-h.txt",
        "src/g",
        "src/h",
        "build/ext-wheels",
        "patches/g",
    ]


def test_the_layer_template_renders_the_steps_in_order():
    steps = (st.LockedWheels("l-pypi", PYPI, ROWS), st.LockedPypiComponent("p", package="p"))
    text = (
        environment(Path(IMAGES_DIR))
        .get_template("partials/layer.j2")
        .render(layer=InstallLayer("l", ("p",), steps, locked=True))
    )
    body = text.split(". /tmp/mtp-build/lib/pip-env.sh; \\\n", 1)[1]
    assert body == "\n".join(s.render() for s in steps) + (
        "\n    python /tmp/mtp-build/lib/mtp_install.py pip-check --allowed /tmp/mtp-build/allowed-conflicts.json\n"
    )


def test_the_recipe_is_what_render_wrote():
    """render writes exactly the recipe's build files, and the recipe it returns is the one a
    fresh recipe_of gives (render derives nothing on its own)."""
    m = manifest.load()
    plan = plan_for(m, "mtp-full", None)
    rendered = render(plan, m.root)
    recipe = recipe_of(plan)
    assert rendered.recipe == recipe
    for path, data in recipe.files().items():
        assert rendered.files[path] == data, path
    written = {p for p in rendered.files if p.startswith(("build/requirements/", "build/allowed-conflicts"))}
    assert written == set(recipe.files())
    kinds = {type(s).__name__ for layer in recipe.layers for s in layer.steps}
    assert kinds == {
        "LockedWheels",
        "LockedSdists",
        "ExtensionWheels",
        "LockedGitSource",
        "LockedPypiComponent",
    }
    assert [b.name for b in recipe.builders] == [p.name for p in plan.packages if p.build is not None]
    assert recipe.builders_after == "torch-deps"
