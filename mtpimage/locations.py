"""Where the tool finds the files it reads at run time that are not Python data modules:
the image files render.py packs into every build context, and the manifests directory used
when --manifests is not given.

Run from a checkout (`python3 build.py`), both sit next to the package: images/ and manifests/.
Installed (pip, pipx: pyproject.toml ships images/ inside the package as mtpimage/images),
there is no checkout: the image files come from the package, and the manifests from the
current directory's ./manifests, because a project's manifests live with that project, not
with the tool (as a Makefile or a pyproject.toml does). mtpimage/data, schemas and templates
are read with importlib.resources, the same way in both cases.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

# The packaged copy exists only in an installed tool; a checkout has images/ beside the package.
INSTALLED = (PACKAGE / "images" / "Dockerfile.j2").is_file()
CHECKOUT: Path | None = None if INSTALLED else PACKAGE.parent

IMAGES_DIR = PACKAGE / "images" if INSTALLED else PACKAGE.parent / "images"
# Relative on purpose when installed: resolved against the directory the command runs in.
DEFAULT_MANIFESTS = Path("manifests") if INSTALLED else PACKAGE.parent / "manifests"
