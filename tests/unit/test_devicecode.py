"""The GPU code in a compiled extension's wheel (mtpimage/ext/devicecode.py, `wheels archs`,
issue 49): cuobjdump's listing read into archs, and a cached wheel whose module lacks one of
its key's archs refused in one line. cuobjdump is faked by a script that answers as the real
one does (its lines and its "does not contain device code" exit); the real one, where a CUDA
toolkit is here, reads an object nvcc compiled for sm_90 and sm_100."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mtpimage.ext import devicecode
from mtpimage.ext.wheelcache import WheelCache, cache_key
from tests.fixtures.wheels import make_wheel

from .helpers import assert_one_line_error, run_cli

LISTING = """\
ELF file    1: flash_attn_2_cuda.1.sm_90.cubin
ELF file    2: flash_attn_2_cuda.2.sm_100.cubin
ELF file    3: flash_attn_2_cuda.3.sm_90.cubin
"""

# A stand-in cuobjdump: a module's bytes say what it carries (SASS:90,100 / PTX:90), as the
# real tool reads it from the fat binary; a module without either has no device code.
FAKE = r"""#!/bin/sh
flag=$1; file=$2
sass=$(grep -ao 'SASS:[0-9,]*' "$file" | head -1 | cut -d: -f2)
ptx=$(grep -ao 'PTX:[0-9,]*' "$file" | head -1 | cut -d: -f2)
if [ -z "$sass$ptx" ]; then
  echo "cuobjdump info    : File '$file' does not contain device code" >&2; exit 255
fi
stem=$(basename "$file" .so); i=0
if [ "$flag" = --list-elf ]; then
  for a in $(echo "$sass" | tr , ' '); do i=$((i+1)); echo "ELF file    $i: $stem.$i.sm_$a.cubin"; done
else
  [ -n "$ptx" ] || { echo "cuobjdump info    : No PTX file found to extract from '$file'." >&2; exit 1; }
  for a in $(echo "$ptx" | tr , ' '); do i=$((i+1)); echo "PTX file    $i: $stem.$i.sm_$a.ptx"; done
fi
"""


def test_the_listing_names_each_cubins_arch_in_order():
    sass, ptx = devicecode.parse(LISTING + "PTX file    1: x.1.sm_90a.ptx\nsome other line\n")
    assert sass == ["90", "100", "90"] and ptx == ["90a"]


def test_a_cubin_whose_arch_cannot_be_read_is_refused_not_skipped():
    with pytest.raises(devicecode.CuobjdumpFailed, match="x.1.cubin"):
        devicecode.parse("ELF file    1: x.1.cubin\n")


@pytest.fixture
def fake_cuobjdump(tmp_path) -> Path:
    path = tmp_path / "bin" / "cuobjdump"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def _so(marker: str) -> bytes:
    return b"\x7fELF" + marker.encode() + b"\0" * 16


def _cache_wheel(tmp_path: Path, name: str, archs: list[str], modules: dict[str, bytes]) -> str:
    inputs = {"schema": 1, "name": name, "version": "0.1", "archs": archs}
    key = cache_key(inputs)
    wheel = make_wheel(tmp_path / "w" / name, name=name, tag="cp312-cp312-linux_x86_64", extra=modules)
    WheelCache(tmp_path / "c" / "ext-wheels").put(key, wheel, {"inputs": inputs})
    return key


def test_every_module_with_device_code_carries_every_arch_of_its_key(tmp_path, fake_cuobjdump):
    key = _cache_wheel(
        tmp_path,
        "good_ext",
        ["90", "100"],
        {
            "good_ext_cuda.cpython-312-x86_64-linux-gnu.so": _so("SASS:90,100"),
            "good_ext_cpp.cpython-312-x86_64-linux-gnu.so": _so(""),  # a CppExtension: no device code
        },
    )
    env = {"MTP_CACHE_DIR": str(tmp_path / "c")}
    proc = run_cli("wheels", "archs", "--cuobjdump", str(fake_cuobjdump), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = json.loads(proc.stdout)["wheels"]
    assert wheel["key"] == key and wheel["missing"] == []
    by_name = {m["module"]: m for m in wheel["modules"]}
    assert by_name["good_ext_cuda.cpython-312-x86_64-linux-gnu.so"]["sass"] == ["90", "100"]
    assert by_name["good_ext_cpp.cpython-312-x86_64-linux-gnu.so"]["sass"] == []
    text = run_cli("wheels", "archs", "--cuobjdump", str(fake_cuobjdump), env=env).stdout
    assert "SASS sm_90, sm_100; PTX none" in text and "SASS none; PTX none" in text


def test_a_module_without_one_of_its_keys_archs_fails_in_one_line(tmp_path, fake_cuobjdump):
    # flash-attn's setup.py skips an arch it does not know without a word: the wheel then
    # holds sm_90 only under a key that promises sm_100 too
    key = _cache_wheel(
        tmp_path,
        "short_ext",
        ["90", "100"],
        {"short_ext_cuda.cpython-312-x86_64-linux-gnu.so": _so("SASS:90 PTX:90")},
    )
    proc = run_cli(
        "wheels",
        "archs",
        key[:12],
        "--cuobjdump",
        str(fake_cuobjdump),
        env={"MTP_CACHE_DIR": str(tmp_path / "c")},
    )
    assert_one_line_error(proc, key[:12], "short_ext_cuda", "no sm_100 code", "wheels remove", code=3)
    assert "SASS sm_90; PTX compute_90" in proc.stdout


def test_no_cuobjdump_is_one_line_naming_the_fix(tmp_path):
    proc = run_cli(
        "wheels", "archs", "--cuobjdump", str(tmp_path / "none"), env={"MTP_CACHE_DIR": str(tmp_path / "c")}
    )
    assert_one_line_error(proc, "--cuobjdump", "nvidia-cuda-cuobjdump", code=3)


NVCC = Path("/usr/local/cuda/bin/nvcc")


@pytest.mark.skipif(not NVCC.is_file() or not shutil.which("cuobjdump"), reason="needs nvcc and cuobjdump")
def test_the_real_cuobjdump_reads_an_object_nvcc_compiled_for_both_archs(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    obj = tmp_path / "k.o"
    gencode = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_100,code=sm_100"]
    subprocess.run([str(NVCC), "-c", *gencode, str(src), "-o", str(obj)], check=True)
    code = devicecode.listing(obj, devicecode.find_cuobjdump())
    assert code.sass_archs == {"90", "100"} and code.ptx == ()
    sizes = devicecode.cubin_bytes(obj, devicecode.find_cuobjdump())
    assert set(sizes) == {"90", "100"} and all(n > 0 for n in sizes.values())
