"""The README's architecture table is true to the code: every module of the package has a row,
and every path a row names exists (a renamed or moved module fails here until the table moves)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_PACKAGES = {"data", "schemas", "templates"}  # importable only to find their files


def _table() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Architecture")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _named_paths(table: str) -> set[str]:
    return set(re.findall(r"`(mtpimage/[\w/*.]+)`", table))


def _modules() -> set[str]:
    out = set()
    for path in (REPO / "mtpimage").rglob("*.py"):
        rel = path.relative_to(REPO)
        if len(rel.parts) > 2 and rel.parts[1] in DATA_PACKAGES:
            continue
        if rel.name == "__init__.py" and rel.parent.name in {"mtpimage"}:
            continue
        out.add(rel.as_posix())
    return out


def test_every_module_has_a_row():
    named = _named_paths(_table())
    covered = {m for m in _modules() if m in named or any(m.startswith(n) for n in named if n.endswith("/"))}
    # a package's __init__ is covered by its bold header row (`mtpimage/ext/`), except the
    # engine's, which holds the seam's code
    missing = sorted(
        m
        for m in _modules() - covered
        if not (m.endswith("/__init__.py") and m != "mtpimage/engine/__init__.py")
    )
    assert not missing, f"README architecture table has no row for {missing}"


def test_every_path_in_the_table_exists():
    # mtpimage/images exists only in an installed tool (images/ is packaged under that name)
    named = _named_paths(_table()) - {"mtpimage/images"}
    gone = sorted(p for p in named if "*" not in p and not (REPO / p).exists())
    assert not gone, f"README architecture table names paths that do not exist: {gone}"


def test_the_table_check_can_fail(tmp_path):
    assert "mtpimage/build/render.py" in _named_paths(_table())
    assert "mtpimage/nowhere.py" not in _named_paths(_table())
