#!/usr/bin/env python3
"""Which of lock.yaml's pins have a linux/arm64 (manylinux aarch64) wheel (issue 49 item 3).

    .venv/bin/python scripts/arm64_survey.py [MANIFESTS]   # prints the `wheels:` rows of
                                                          # mtpimage/data/platforms.yaml

For every row of each python set that installs a platform wheel (an x86_64 file in the lock;
a `py3-none-any` wheel or an sdist is the same file on any CPU, and a git source or compiled
extension is built on the platform), it reads the package's PEP 691 page on PyPI
(https://pypi.org/simple/NAME/) and chooses, with the lock's own choice (resolver.choose_file),
the aarch64 wheel of the same version for CPython 3.12 among the files uploaded before the
lock's resolution cutoff; `none` where there is none. It resolves nothing and writes nothing:
the rows it prints are pasted into platforms.yaml, whose header says when.
Packages that only the aarch64 resolution adds (platform markers) are found with
`uv pip compile --python-platform aarch64-manylinux_2_39` on the lock's inputs (docs/arm64.md).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml
from packaging.tags import compatible_tags, cpython_tags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mtpimage.lock.resolver import choose_file  # noqa: E402 - after the checkout is on sys.path

# Ubuntu 24.04 (the base) has glibc 2.39 on arm64 as on amd64 (pydeps.GLIBC)
PLATFORMS = [f"manylinux_2_{m}_aarch64" for m in range(39, 16, -1)] + [
    "manylinux2014_aarch64",
    "linux_aarch64",
]
PAGE = "https://pypi.org/simple/{name}/"


def tags(python: str) -> list:
    v = tuple(int(x) for x in python.split("."))
    cp = f"cp{v[0]}{v[1]}"
    return list(cpython_tags(v, abis=[cp, "abi3", "none"], platforms=PLATFORMS)) + list(
        compatible_tags(v, interpreter=cp, platforms=PLATFORMS)
    )


def files(name: str) -> list[dict]:
    r = requests.get(
        PAGE.format(name=name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60
    )
    r.raise_for_status()
    return r.json()["files"]


def platform_specific(row: dict) -> bool:
    return bool(row.get("file")) and not row.get("sdist") and not row["file"].endswith("-none-any.whl")


def main(manifests: Path) -> int:
    lock = yaml.safe_load((manifests / "lock.yaml").read_text())
    cutoff = lock["resolution_cutoff"]
    rows = {}  # (name, version) -> its lock row: the image's packages and the build backends
    for pset in lock["python_sets"].values():
        backends = [r for per_build in pset.get("build_requires", {}).values() for r in per_build.items()]
        for name, row in list(pset["packages"].items()) + backends:
            if platform_specific(row):
                rows[(name, str(row["version"]))] = row
    want = tags(lock["target"]["python"])

    def one(key):
        name, version = key
        limit = cutoff.get("exclude_newer_package", {}).get(name, cutoff["exclude_newer"])
        inside = [f for f in files(name) if f.get("upload-time", "9")[:19] <= limit[:19]]
        chosen = choose_file(inside, name, version, want)
        return f"{name}=={version}", chosen["file"] if chosen else "none"

    with ThreadPoolExecutor(8) as pool:
        found = dict(pool.map(one, sorted(rows)))
    for pin, file in found.items():
        print(f"      {pin}: {file}")
    missing = [pin for pin, file in found.items() if file == "none"]
    print(
        f"# {len(found)} platform wheels; without an aarch64 wheel: {', '.join(missing) or 'none'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "manifests")
    )
