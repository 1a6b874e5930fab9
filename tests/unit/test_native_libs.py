"""Issue 37 item 3, one copy of each library: the native-libs check (images/checks/native_libs.py)
finds a second NCCL on the loader path and names both files, passes a single copy, and finds
an undefined symbol in a compiled extension module (`ldd -r`, real .so files built with gcc
here); the sys.path part is launch-env's one-copy check, which catches a second megatron on
PYTHONPATH (run_checks.py in a child, as the image runs it)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpimage.assembly.render import IMAGES_DIR

CHECKS = IMAGES_DIR / "checks"
NCCL_WHEEL = "nvidia/nccl/lib/libnccl.so.2"
needs_gcc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("ldd")), reason="needs gcc and ldd")


@pytest.fixture(scope="module")
def nl():
    spec = importlib.util.spec_from_file_location("native_libs_under_test", CHECKS / "native_libs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _install(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A distribution as pip leaves it: its files and a dist-info whose RECORD lists them."""
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages holding torch's NCCL wheel, nvidia-nccl-cu13 2.28.9, first on sys.path."""
    root = tmp_path / "site-packages"
    _install(root, "nvidia-nccl-cu13", "2.28.9", {NCCL_WHEEL: b"nccl 2.28.9 from the wheel"})
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return root


def _nccl(nl):
    return next(lib for lib in nl.read_table().libraries if lib.name == "nccl")


def _where(nl, site: Path, ld_library_path=(), ld_cache=()):
    return nl.LoaderPath(tuple(ld_cache), tuple(ld_library_path), nl.wheel_lib_dirs([str(site)]))


def test_the_table_is_data_with_the_five_libraries_and_their_wheels(nl, tmp_path):
    table = nl.read_table()
    names = {lib.name: lib for lib in table.libraries}
    assert {"nccl", "cudnn", "cublas", "cudart", "nvrtc"} <= set(names)
    assert names["nccl"].wheels[0] == "nvidia-nccl-cu13" and names["nccl"].sonames == "libnccl.so.*"
    assert {"transformer-engine-cu13", "flash-attn", "apex"} <= set(table.extensions)
    bad = tmp_path / "table.txt"
    bad.write_text("library nccl libnccl.so.*\n")  # no wheel column
    with pytest.raises(nl.TableError, match=r"table.txt:1: .*want `library NAME SONAMES WHEELS`"):
        nl.read_table(bad)


def test_the_wheels_copy_alone_passes(nl, site):
    copies = nl.find_copies(_nccl(nl), _where(nl, site))
    assert [c.path for c in copies] == [str((site / NCCL_WHEEL).resolve())]
    v = nl.judge_copies(_nccl(nl), copies)
    assert v.status == "pass", v
    assert "nvidia-nccl-cu13 2.28.9" in v.detail


def test_a_link_to_the_wheels_copy_is_the_same_file(nl, site, tmp_path):
    d = tmp_path / "ld"
    d.mkdir()
    (d / "libnccl.so.2").symlink_to(site / NCCL_WHEEL)
    v = nl.judge_copies(_nccl(nl), nl.find_copies(_nccl(nl), _where(nl, site, [str(d)])))
    assert v.status == "pass" and v.checked == 1, v


def test_a_held_system_nccl_beside_the_wheels_fails_naming_both_files(nl, site, tmp_path):
    # the real base: libnccl2 2.28.3 in the ldconfig cache, its soname a link to the full version
    system = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    system.mkdir(parents=True)
    (system / "libnccl.so.2.28.3").write_bytes(b"nccl 2.28.3 from libnccl2")
    (system / "libnccl.so.2").symlink_to("libnccl.so.2.28.3")
    cache = nl.parse_ld_cache(
        "3 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibnccl.so.2 (libc6,x86-64) => {system}/libnccl.so.2\n"
        f"\tlibnccl.so (libc6,x86-64) => {system}/libnccl.so\n"
    )
    copies = nl.find_copies(_nccl(nl), _where(nl, site, ld_cache=cache))
    v = nl.judge_copies(_nccl(nl), copies, owner=lambda path: "libnccl2")
    assert v.status == "fail", v
    assert "\n" not in v.detail
    assert f"{system}/libnccl.so.2.28.3 (2.28.3; ldconfig cache)" in v.detail
    assert f"{(site / NCCL_WHEEL).resolve()} (nvidia-nccl-cu13 2.28.9" in v.detail
    assert (
        "fix: remove the other copy in the image: apt-get remove --allow-change-held-packages libnccl2"
        in v.detail
    )


def test_a_second_nccl_on_ld_library_path_fails(nl, site, tmp_path):
    planted = tmp_path / "elsewhere"
    planted.mkdir()
    (planted / "libnccl.so.2").write_bytes(b"some other NCCL build")
    v = nl.judge_copies(
        _nccl(nl), nl.find_copies(_nccl(nl), _where(nl, site, [str(planted)])), owner=lambda p: None
    )
    assert v.status == "fail" and f"{planted}/libnccl.so.2 (version unknown; LD_LIBRARY_PATH)" in v.detail, v
    assert "its directory from LD_LIBRARY_PATH" in v.detail


def test_the_same_library_in_another_file_is_one_library(nl, site, tmp_path):
    """The toolkit's own copy in a devel base, at the lock's version (or the same bytes), is
    the lock's library: reported, not failed."""
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libnccl.so.2.28.9").write_bytes(b"the same version, another build")
    same_bytes = tmp_path / "copy"
    same_bytes.mkdir()
    (same_bytes / "libnccl.so.2").write_bytes((site / NCCL_WHEEL).read_bytes())
    copies = nl.find_copies(_nccl(nl), _where(nl, site, [str(toolkit), str(same_bytes)]))
    v = nl.judge_copies(_nccl(nl), copies)
    assert v.status == "pass" and v.checked == 3, v
    assert "the same library" in v.detail


def test_without_the_wheel_one_system_copy_passes_and_two_versions_fail(nl, tmp_path):
    lib = nl.Library("nccl", "libnccl.so.*", ("not-installed-wheel",))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "libnccl.so.2.28.3").write_bytes(b"a")
    where = nl.LoaderPath((), (str(a),), ())
    assert nl.judge_copies(lib, nl.find_copies(lib, where)).status == "pass"
    (b / "libnccl.so.2.27.7").write_bytes(b"b")
    where = nl.LoaderPath((), (str(a), str(b)), ())
    assert nl.judge_copies(lib, nl.find_copies(lib, where)).status == "fail"
    assert nl.judge_copies(lib, []).status == "skip"


# ------------------------------------------------------------------------ undefined symbols
def _gcc(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True, cwd=tmp_path)
    return out


# An extension module: a Python C-API symbol (the interpreter gives it at import) and its own code.
CLEAN = "extern void *PyLong_FromLong(long);\nvoid *f(void) { return PyLong_FromLong(1); }\n"
BROKEN = (
    CLEAN
    + "extern int cublasLtGroupedMatrixLayoutInit_internal(void);\nint g(void) { return cublasLtGroupedMatrixLayoutInit_internal(); }\n"
)


@needs_gcc
def test_an_undefined_symbol_in_an_extension_fails_and_a_clean_one_passes(nl, tmp_path):
    clean = _gcc(tmp_path, "clean_ext.so", CLEAN)
    broken = _gcc(tmp_path, "broken_ext.so", BROKEN)
    env = dict(os.environ)
    ok = nl.judge_links([("flash-attn", str(clean))], env, (), None)
    assert ok.status == "pass" and ok.checked == 1, ok  # PyLong_FromLong is the interpreter's
    bad = nl.judge_links(
        [("transformer-engine-cu13", str(broken)), ("flash-attn", str(clean))], env, (), None
    )
    assert bad.status == "fail", bad
    assert (
        f"{broken} (transformer-engine-cu13): undefined symbol cublasLtGroupedMatrixLayoutInit_internal"
        in bad.detail
    )
    assert str(clean) not in bad.detail.split(" (ldd -r")[0]


@needs_gcc
def test_what_a_package_loads_itself_first_defines_its_modules_symbols(nl, tmp_path):
    """TransformerEngine loads its core library (and nvrtc) with ctypes, RTLD_GLOBAL, before its
    torch extension: the extension's transformer_engine::* symbols are defined at import though
    no DT_NEEDED names the core. The real-stack image failed the check on exactly that (164
    symbols); `preloads` in the table says so, and a symbol the preloaded library lacks still fails."""
    d = tmp_path / "wheel_lib"
    d.mkdir()
    _gcc(d, "libtransformer_engine.so", "int te_core(void) { return 1; }\n")
    ext = _gcc(d, "te_ext.so", "extern int te_core(void);\nint f(void) { return te_core(); }\n")
    other = _gcc(d, "te_other.so", "extern int te_gone(void);\nint f(void) { return te_gone(); }\n")
    env = {**os.environ, "LD_LIBRARY_PATH": ""}
    preloads = nl.read_table().preloads
    assert any(
        p.dist == "transformer-engine-torch" and "libtransformer_engine.so" in p.sonames for p in preloads
    )
    bare = nl.judge_links([("transformer-engine-torch", str(ext))], env, (), None)
    assert bare.status == "fail" and "undefined symbol te_core" in bare.detail, bare
    ok = nl.judge_links([("transformer-engine-torch", str(ext))], env, (), None, preloads=preloads)
    assert ok.status == "pass" and "load themselves first (libtransformer_engine.so)" in ok.detail, ok
    bad = nl.judge_links([("transformer-engine-torch", str(other))], env, (), None, preloads=preloads)
    assert bad.status == "fail" and "undefined symbol te_gone" in bad.detail, bad
    # another distribution's modules get no preload they did not ask for
    alien = nl.judge_links([("flash-attn", str(ext))], env, (), None, preloads=preloads)
    assert alien.status == "fail", alien


@needs_gcc
def test_a_missing_library_fails_and_the_drivers_comes_from_the_stubs(nl, tmp_path, monkeypatch):
    monkeypatch.setattr(nl, "STUB_DIRS", ())
    dep = _gcc(tmp_path, "libdep.so", "int dep(void) { return 1; }\n", "-Wl,-soname,libdep.so.1")
    (tmp_path / "libdep.so.1").symlink_to(dep)
    needs_dep = _gcc(
        tmp_path, "needs_dep.so", "extern int dep(void);\nint f(void) { return dep(); }\n", "-L.", "-ldep"
    )
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _gcc(stubs, "libcuda.so", "int cuInit(unsigned f) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    (tmp_path / "libcuda.so.1").symlink_to(stubs / "libcuda.so")  # to link against, then gone
    needs_cuda = _gcc(
        tmp_path,
        "needs_cuda.so",
        "extern int cuInit(unsigned);\nint f(void) { return cuInit(0); }\n",
        "-L.",
        "-l:libcuda.so.1",
    )
    (tmp_path / "libcuda.so.1").unlink()
    env = {**os.environ, "LD_LIBRARY_PATH": ""}
    v = nl.judge_links([("apex", str(needs_dep))], env, (), None)
    assert v.status == "fail" and "needs libdep.so.1, not found" in v.detail, v
    env_ok = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    assert nl.judge_links([("apex", str(needs_dep))], env_ok, (), None).status == "pass"

    driver = ("libcuda.so.1",)
    where = nl.LoaderPath((), (), ())
    # no driver and no stub: not judged (a pass that checked nothing: run_checks makes it a skip)
    with_nothing = nl.judge_links([("te", str(needs_cuda))], env, driver, None)
    assert with_nothing.status == "pass" and with_nothing.checked == 0, with_nothing
    # LIBRARY_PATH names the toolkit's stubs (as the real base sets it): ldd resolves libcuda.so.1
    (tmp_path / "made").mkdir()
    assert nl.stub_dir(driver, where, {}, str(tmp_path / "made")) is None  # no stub anywhere
    made = nl.stub_dir(driver, where, {"LIBRARY_PATH": str(stubs)}, str(tmp_path / "made"))
    assert made and os.path.islink(os.path.join(made, "libcuda.so.1"))
    v = nl.judge_links([("te", str(needs_cuda))], {**env, "LD_LIBRARY_PATH": made}, driver, made)
    assert v.status == "pass" and v.checked == 1 and "stubs" in v.detail, v


@needs_gcc
def test_the_extensions_modules_are_found_by_their_record(nl, tmp_path, monkeypatch):
    root = tmp_path / "site-packages"
    broken = _gcc(tmp_path, "broken_ext.so", BROKEN).read_bytes()
    _install(
        root,
        "flash-attn",
        "2.8.3",
        {"flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so": broken, "flash_attn/__init__.py": b""},
    )
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    found = nl.extension_modules(["flash-attn", "not-installed"])
    assert found == [
        ("flash-attn", str((root / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so").resolve()))
    ]


# ------------------------------------------------------------------------ as the image runs it
def _run_checks(tmp_path: Path, vector: dict, only: str, env: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "version.json"
    path.write_text(json.dumps(vector))
    full = {**os.environ, "MTP_VERSION_VECTOR": str(path), **env}
    return subprocess.run(
        [sys.executable, str(CHECKS / "run_checks.py"), "--json", "--only", only],
        capture_output=True,
        text=True,
        env=full,
        cwd="/",
    )


def _results(proc) -> dict:
    return {r["id"]: r for r in json.loads(proc.stdout)["results"]}


def test_run_checks_native_libs_catches_a_planted_second_nccl(tmp_path):
    site = tmp_path / "site-packages"
    _install(site, "nvidia-nccl-cu13", "2.28.9", {NCCL_WHEEL: b"nccl 2.28.9 from the wheel"})
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if "libnccl.so" in subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout:
        pytest.skip("this host's ldconfig cache has an NCCL of its own")
    clean = _run_checks(tmp_path, {}, "native-libs", {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": ""})
    nccl = _results(clean)["native-libs:nccl"]
    assert nccl["status"] == "pass" and nccl["group"] == "native-libs", nccl
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "libnccl.so.2.28.3").write_bytes(b"a system NCCL")
    bad = _run_checks(tmp_path, {}, "native-libs", {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(planted)})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    nccl = _results(bad)["native-libs:nccl"]
    assert nccl["status"] == "fail" and str(planted / "libnccl.so.2.28.3") in nccl["detail"], nccl
    assert str(site / NCCL_WHEEL) in nccl["detail"]


def test_the_sys_path_part_is_launch_envs_one_copy_check_and_catches_a_second_megatron(tmp_path):
    site = tmp_path / "site-packages"
    _install(site, "megatron-core", "0.19.1", {"megatron/core/__init__.py": b""})
    vector = {"components": [{"name": "megatron-lm", "package": "megatron-core"}], "packages": []}
    ok = _run_checks(tmp_path, vector, "launch-env", {"PYTHONPATH": str(site)})
    assert _results(ok)["launch-env:one-copy"]["status"] == "pass", ok.stdout + ok.stderr
    other = tmp_path / "Megatron-LM"  # what verl's docs have users put on PYTHONPATH
    (other / "megatron" / "core").mkdir(parents=True)
    (other / "megatron" / "core" / "__init__.py").write_text("")
    bad = _run_checks(tmp_path, vector, "launch-env", {"PYTHONPATH": f"{other}:{site}"})
    assert bad.returncode == 1
    one_copy = _results(bad)["launch-env:one-copy"]
    assert one_copy["status"] == "fail" and f"megatron.core comes first from {other}" in one_copy["detail"]
