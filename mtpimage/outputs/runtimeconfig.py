"""The files a runtime reads an image's environment from, written into an exported rootfs.

A container's filesystem (`docker export`) has no image config: its ENV (PATH with the venv,
NVIDIA_VISIBLE_DEVICES, the CUDA paths, MTP_*) would be lost. Each runtime's own import
writes it into the rootfs, and the export does the same, in that runtime's own format:

- enroot: /etc/environment, one `NAME=value` per ENV entry, as `enroot import` writes it
  (docker::configure, src/docker.sh); enroot builds a container's environment from it
  (src/runtime.sh), and its NVIDIA hook mounts the driver only when NVIDIA_VISIBLE_DEVICES
  is there (conf/hooks/98-nvidia.sh): without it a job has no GPU.
- Apptainer: /.singularity.d/env/10-docker2singularity.sh, as `apptainer build` from a docker
  source writes it (internal/pkg/build/sources/conveyorPacker_oci.go insertEnv); its action
  script sources it (internal/pkg/util/fs/files/action_script.sh).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Apptainer skips names that are not shell variables; so does this
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RootfsFile:
    path: str  # relative to the rootfs
    text: str
    mode: int


def _enroot(env: list[str]) -> list[RootfsFile]:
    return [RootfsFile("etc/environment", "".join(f"{e}\n" for e in env), 0o644)]


def _escape(value: str) -> str:
    # Apptainer's shell.Escape (internal/pkg/util/shell/escape.go): inside double quotes
    for ch in ("\\", '"', "`", "$"):
        value = value.replace(ch, "\\" + ch)
    return value


def _apptainer(env: list[str]) -> list[RootfsFile]:
    lines = ["#!/bin/sh"]
    for entry in env:
        name, eq, value = entry.partition("=")
        if not _NAME.fullmatch(name):
            continue
        if not eq:
            lines.append(f'export {name}="${{{name}:-}}"')
        elif name == "PATH":  # the image's PATH wins over the host's, as Apptainer's own
            lines.append(f'export {name}="{_escape(value)}"')
        else:  # the host's value wins where it set one, as Apptainer's own
            lines.append(f'export {name}="${{{name}:-"{_escape(value)}"}}"')
    return [RootfsFile(".singularity.d/env/10-docker2singularity.sh", "\n".join(lines) + "\n", 0o755)]


WRITERS = {"enroot": _enroot, "apptainer": _apptainer}


def files_for(runtime: str, env: list[str]) -> list[RootfsFile]:
    """The files `runtime` reads the image config's Env from."""
    return WRITERS[runtime](env)
