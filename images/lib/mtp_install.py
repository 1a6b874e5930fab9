#!/usr/bin/env python3
"""Build-time helper of the rendered Dockerfile (bind-mounted, never in a layer).

  patch-source     apply a component's vendored patches to its source tree (git apply -pN)
  patch-installed  apply them to an installed wheel, relative to site-packages
  build-source     patch a git source, build its wheel in a throwaway venv holding only its
                   locked build backends (hash-checked, fetched through the site's index
                   mirrors when the build has them: mtp_pip.py), install it with --no-deps
  pip-check        `pip check`, accepting only what lock.yaml's overrides/excludes and the
                   sources installed without their declared dependencies explain
  record           write /opt/mtp/installed/<name>.json: the commit the source came from
                   (src/<name>/.mtp-source.json, written by the builder from the fetched
                   git object), the paths a partial mirror lacked, the installed
                   distribution's version, the patches' sha256; for a git source, also
                   rewrite its PEP 610 direct_url.json to the repository and commit

The in-image checks compare these records with /opt/mtp/version.json.
Standard library only: it runs on the bare base image's Python.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

RECORDS = Path("/opt/mtp/installed")


def _patches(specs: list[str]) -> list[tuple[Path, int]]:
    out = []
    for spec in specs or []:
        path, _, strip = spec.rpartition(":")
        out.append((Path(path), int(strip)))
    return out


def _apply(patches: list[tuple[Path, int]], where: Path) -> None:
    for path, strip in patches:
        print(f"mtp_install: applying {path.name} (-p{strip}) in {where}", flush=True)
        subprocess.run(["git", "apply", "--verbose", f"-p{strip}", str(path)], cwd=where, check=True)


def _source_root(src: Path) -> Path:
    """A git source's repository root (where the builder wrote .mtp-source.json): its
    patches' paths are repository paths, also when the package lives in a subdirectory."""
    return next((p for p in (src, *src.parents) if (p / ".mtp-source.json").is_file()), src)


def _through_mirrors(pip_args: list[str]) -> list[str]:
    """pip's arguments through the build's index mirrors (mtp_pip.py, beside this file)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from mtp_pip import rewrite

    return rewrite(pip_args)


def _build_source(args, patches) -> int:
    _apply(patches, _source_root(args.src))
    venv = Path(f"/tmp/mtp-bv-{args.name}")
    wheels = Path(f"/tmp/mtp-wheels-{args.name}")
    # Without locked build backends (test stand-ins) the build sees the OS's setuptools.
    flags = [] if args.build_requirements else ["--system-site-packages"]
    subprocess.run([sys.executable, "-m", "venv", *flags, str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    if args.build_requirements:
        install = [
            "install",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--index-url",
            args.index_url,
            "-r",
            str(args.build_requirements),
        ]
        subprocess.run([*pip, *_through_mirrors(install)], check=True)
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(args.src)],
        check=True,
    )
    built = sorted(wheels.glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", *map(str, built)], check=True
    )
    for path in (venv, wheels):
        subprocess.run(["rm", "-rf", str(path)], check=True)
    return 0


def vcs_direct_url(origin: dict) -> dict:
    """PEP 610's record of a VCS install for a git source (.mtp-source.json's fields)."""
    info = {"vcs": "git", "commit_id": origin["commit"]}
    if origin.get("ref"):
        info["requested_revision"] = origin["ref"]
    out = {"url": origin["repo"], "vcs_info": info}
    if origin.get("subdir") not in (None, "", "."):
        out["subdirectory"] = origin["subdir"]
    return out


def _dist_info(dist) -> Path:
    for f in dist.files or []:
        if f.name == "METADATA" and f.parent.name.endswith(".dist-info"):
            return Path(dist.locate_file(f)).parent
    raise SystemExit(f"mtp_install: {dist.metadata['Name']} has no .dist-info/METADATA in its RECORD")


def set_direct_url(package: str, data: dict) -> None:
    """Replace the installed distribution's direct_url.json, and its line in RECORD so RECORD
    stays true. pip wrote the URL it installed from, the throwaway wheel or the bind-mounted
    source (file:///tmp/mtp-...), a path that exists nowhere in the image; this makes `pip
    freeze` and `pip inspect` name the repository and commit instead."""
    info = _dist_info(importlib.metadata.distribution(package))
    body = (json.dumps(data, sort_keys=True) + "\n").encode()
    (info / "direct_url.json").write_bytes(body)
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    entry = f"{info.name}/direct_url.json"
    rows = list(csv.reader(io.StringIO((info / "RECORD").read_text(encoding="utf-8"))))
    rows = [r for r in rows if r and r[0] != entry] + [[entry, f"sha256={digest}", str(len(body))]]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    (info / "RECORD").write_text(text.getvalue(), encoding="utf-8")


def _pip_check(allowed_file: Path) -> int:
    allowed = json.loads(allowed_file.read_text())
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad, accepted = [], []
    for line in proc.stdout.splitlines():
        words = line.replace(",", " ").split()
        if not words or line.startswith("No broken"):
            continue
        dependent = words[0].lower()
        needed = next(
            (
                w
                for w in words[2:]
                if w.lower() not in ("requires", "has", "requirement", "which", "is", "not", "installed.")
            ),
            "",
        )
        needed = re.split(r"[<>=!~\[; ]", needed, maxsplit=1)[0].lower()
        if dependent in allowed["dependents"] or needed in allowed["required"]:
            accepted.append(line)
        else:
            bad.append(line)
    for line in accepted:
        print(f"mtp_install: pip check (declared override): {line}", flush=True)
    for line in bad:
        print(f"mtp_install: pip check FAILED: {line}", flush=True)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "action", choices=["patch-source", "patch-installed", "record", "build-source", "pip-check"]
    )
    ap.add_argument("--build-requirements", type=Path)
    ap.add_argument("--index-url")
    ap.add_argument("--allowed", type=Path)
    ap.add_argument("--name", default="")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--src", type=Path)
    ap.add_argument("--package")
    ap.add_argument("--source", choices=["git", "pypi"])
    ap.add_argument("--patch", action="append", default=[])
    args = ap.parse_args(argv)
    patches = _patches(args.patch)
    if args.action == "build-source":
        return _build_source(args, patches)
    if args.action == "pip-check":
        return _pip_check(args.allowed)
    if args.action == "patch-source":
        _apply(patches, args.dir)
        return 0
    if args.action == "patch-installed":
        _apply(patches, Path(sysconfig.get_paths()["purelib"]))
        return 0
    record = {
        "name": args.name,
        "source": args.source,
        "package": args.package,
        "version": importlib.metadata.version(args.package),
        "patches": [
            {"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p, _ in patches
        ],
    }
    if args.source == "git":
        origin = json.loads((args.src / ".mtp-source.json").read_text())
        record["commit"] = origin["commit"]
        record["repo"] = origin["repo"]
        if origin.get("missing_from_mirror"):
            record["missing_from_mirror"] = origin["missing_from_mirror"]
        record["direct_url"] = vcs_direct_url(origin)
        set_direct_url(args.package, record["direct_url"])
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{args.name}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"mtp_install: recorded {args.name} {record.get('commit') or record['version']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
