"""A git source's own packaging metadata (name, version, Requires-Dist), read without running it.

Building metadata (PEP 517 `prepare_metadata_for_build_wheel`) would install each project's
build backend, and Megatron-Bridge's declares torch as one: gigabytes for a name and a list of
strings. The four pinned sources declare their metadata statically enough to read it:
  - pyproject.toml `[project]` (name, dependencies, optional-dependencies, version);
  - a dynamic version from `[tool.setuptools.dynamic] version = {attr = ...}` (a module
    constant, read with `ast`: Megatron's package_info MAJOR/MINOR/PATCH/PRE_RELEASE) or
    `{file = ...}` (verl/version/version);
  - dynamic dependencies from setup.py's `install_requires=` (a list literal, or the name of a
    module-level list literal: verl's setup.py).
Anything else is refused with the fix (declare it in components.yaml), never guessed.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class MetadataUnreadable(Exception):
    pass


@dataclass(frozen=True)
class SourceMetadata:
    name: str
    version: str
    requires: tuple[str, ...]
    extras: dict = field(default_factory=dict)  # extra -> tuple of requirements
    where: str = ""  # which files said so


def _literal(node: ast.AST, scope: dict[str, ast.AST]):
    if isinstance(node, ast.Name) and node.id in scope:
        return _literal(scope[node.id], scope)
    return ast.literal_eval(node)


def _module_scope(mod: ast.Module) -> dict[str, ast.AST]:
    scope: dict[str, ast.AST] = {}
    for stmt in mod.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            scope[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            scope[stmt.target.id] = stmt.value
    return scope


def _attr_version(tree: Path, attr: str, package_dirs: dict) -> str:
    """`pkg.mod.__version__` -> the constant, following Megatron's MAJOR.MINOR.PATCH style."""
    module, _, name = attr.rpartition(".")
    base = Path(package_dirs.get("", "."))
    rel = Path(*module.split("."))
    for cand in (
        tree / base / rel.with_suffix(".py"),
        tree / base / rel / "__init__.py",
        tree / "src" / rel.with_suffix(".py"),
    ):
        if cand.is_file():
            mod = ast.parse(cand.read_text(encoding="utf-8"))
            scope = _module_scope(mod)
            if name not in scope:
                break
            node = scope[name]
            try:
                return str(_literal(node, scope))
            except ValueError:
                pass
            # Megatron/Bridge: __version__ = __shortversion__ (+ PRE_RELEASE), from VERSION parts
            parts = {
                k: _literal(scope[k], scope) for k in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE") if k in scope
            }
            if {"MAJOR", "MINOR", "PATCH"} <= set(parts):
                return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE') or ''}"
            raise MetadataUnreadable(
                f"{cand.relative_to(tree)}: {name} is computed in a way this reader does not follow"
            )
    raise MetadataUnreadable(f"version attribute {attr} not found")


def _setup_py_requires(tree: Path) -> tuple[list[str], dict]:
    path = tree / "setup.py"
    if not path.is_file():
        raise MetadataUnreadable("dependencies are dynamic and there is no setup.py")
    mod = ast.parse(path.read_text(encoding="utf-8"))
    scope = _module_scope(mod)
    for node in ast.walk(mod):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            if "install_requires" not in kw:
                return [], {}
            try:
                return list(_literal(kw["install_requires"], scope)), {}
            except ValueError as exc:
                raise MetadataUnreadable(f"setup.py install_requires is not a literal list: {exc}") from None
    raise MetadataUnreadable("setup.py has no setup() call")


def read(tree: Path) -> SourceMetadata:
    tree = Path(tree)
    path = tree / "pyproject.toml"
    if not path.is_file():
        raise MetadataUnreadable("no pyproject.toml")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise MetadataUnreadable(f"pyproject.toml does not parse: {exc}") from None
    proj = data.get("project") or {}
    if "name" not in proj:
        raise MetadataUnreadable("pyproject.toml has no [project] name")
    dynamic = set(proj.get("dynamic") or [])
    setuptools = (data.get("tool") or {}).get("setuptools") or {}
    dyn = setuptools.get("dynamic") or {}
    where = ["pyproject.toml"]
    if "version" in dynamic:
        spec = dyn.get("version") or {}
        if "attr" in spec:
            version = _attr_version(tree, spec["attr"], setuptools.get("package-dir") or {})
            where.append(spec["attr"])
        elif "file" in spec:
            files = spec["file"] if isinstance(spec["file"], list) else [spec["file"]]
            version = (tree / files[0]).read_text(encoding="utf-8").strip()
            where.append(files[0])
        else:
            raise MetadataUnreadable("dynamic version without a setuptools attr/file")
    else:
        version = str(proj.get("version") or "")
    if not version:
        raise MetadataUnreadable("no version")
    if "dependencies" in dynamic:
        requires, _ = _setup_py_requires(tree)
        where.append("setup.py install_requires")
    else:
        requires = list(proj.get("dependencies") or [])
    extras = {k: tuple(v) for k, v in (proj.get("optional-dependencies") or {}).items()}
    return SourceMetadata(proj["name"], version, tuple(requires), extras, ", ".join(where))
