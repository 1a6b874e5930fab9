#!/usr/bin/env python3
"""Build-time helper of the rendered Dockerfile (bind-mounted, never in a layer).

  patch-source     apply a component's vendored patches to its source tree (git apply -pN)
  patch-installed  apply them to an installed wheel, relative to site-packages
  record           write /opt/mtp/installed/<name>.json: the commit the source came from
                   (src/<name>/.mtp-source.json, written by the builder from the fetched
                   git object), the installed distribution's version, the patches' sha256

The in-image checks compare these records with /opt/mtp/version.json.
Standard library only: it runs on the bare base image's Python.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["patch-source", "patch-installed", "record"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--src", type=Path)
    ap.add_argument("--package")
    ap.add_argument("--source", choices=["git", "pypi"])
    ap.add_argument("--patch", action="append", default=[])
    args = ap.parse_args(argv)
    patches = _patches(args.patch)
    if args.action == "patch-source":
        _apply(patches, args.dir)
        return 0
    if args.action == "patch-installed":
        _apply(patches, Path(sysconfig.get_paths()["purelib"]))
        return 0
    record = {"name": args.name, "source": args.source, "package": args.package,
              "version": importlib.metadata.version(args.package),
              "patches": [{"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                          for p, _ in patches]}
    if args.source == "git":
        origin = json.loads((args.src / ".mtp-source.json").read_text())
        record["commit"] = origin["commit"]
        record["repo"] = origin["repo"]
        direct = importlib.metadata.distribution(args.package).read_text("direct_url.json")
        record["direct_url"] = json.loads(direct) if direct else None
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{args.name}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"mtp_install: recorded {args.name} {record.get('commit') or record['version']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
