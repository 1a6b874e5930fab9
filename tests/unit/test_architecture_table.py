"""The architecture table (docs/architecture.md, "Modules") is true to the code: every module of
the package has a row, and every path a row names exists (a renamed or moved module fails here
until the table moves)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_PACKAGES = {"data", "schemas", "templates"}  # importable only to find their files


PAGE = REPO / "docs" / "architecture.md"


def _table() -> str:
    text = PAGE.read_text()
    start = text.index("\n## Modules\n")
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


def _missing(table: str) -> list[str]:
    named = _named_paths(table)
    # a package's __init__ is covered by its bold header row (`mtpimage/ext/`), except the
    # engine's, which holds the seam's code and has a row of its own; every other module needs
    # its own row (a header row covers no module but its __init__)
    headers = {n + "__init__.py" for n in named if n.endswith("/")} - {"mtpimage/engine/__init__.py"}
    return sorted(m for m in _modules() if m not in named and m not in headers)


def test_every_module_has_a_row():
    missing = _missing(_table())
    assert not missing, f"{PAGE.relative_to(REPO)}: the architecture table has no row for {missing}"


def test_every_path_in_the_table_exists():
    # mtpimage/images exists only in an installed tool (images/ is packaged under that name)
    named = _named_paths(_table()) - {"mtpimage/images"}
    gone = sorted(p for p in named if "*" not in p and not (REPO / p).exists())
    assert not gone, f"{PAGE.relative_to(REPO)}: the architecture table names paths that do not exist: {gone}"


def test_the_table_check_can_fail():
    table = _table()
    assert "mtpimage/assembly/render.py" in _named_paths(table)
    assert "mtpimage/nowhere.py" not in _named_paths(table)
    # a module whose row is gone is reported, and only the table's section counts: the same
    # path named in "The path of a build" above does not cover it
    without = "\n".join(line for line in table.splitlines() if "`mtpimage/assembly/fastpath.py`" not in line)
    assert _missing(without) == ["mtpimage/assembly/fastpath.py"]
    assert "mtpimage/assembly/fastpath.py" in PAGE.read_text().split("\n## Modules\n", 1)[0]
