"""The README stays a guide and the docs stay reachable (#39 item 5): the README is short, every
docs/ page is in its table of pages, and every link or `docs/...md` path in the README, the
docs and the code leads to a page that exists, at a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 250  # issue 39: what a user needs in the first ten minutes; the rest is in docs/
# pages the README may link before they land (none now)
PENDING: set[str] = set()
# the team's shared notes, kept outside this repository (docs/gpu.md cites them as such)
SHARED = {"docs/mtp-stack.md", "docs/mtp-gradients.md"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")
CODE_DIRS = ("mtpimage", "tests", "bench", "scripts")


def _pages() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def _outside_code(text: str) -> str:
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append(line)
    return "\n".join(out)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", _outside_code(page.read_text()), re.M)}


def _broken_links(page: Path, text: str | None = None) -> list[str]:
    broken = []
    for target in LINK.findall(_outside_code(page.read_text() if text is None else text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if rel in PENDING:
            continue
        if not dest.exists():
            broken.append(f"{target} (no {rel})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel})")
    return broken


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the reference into a docs/ page "
        "and link it from the README's table of pages"
    )


def test_every_docs_page_is_in_the_readmes_table():
    linked = set(LINK.findall(README.read_text().split("## Where the rest is", 1)[1]))
    missing = [
        p.relative_to(REPO).as_posix() for p in _pages() if p.relative_to(REPO).as_posix() not in linked
    ]
    assert not missing, f"README.md, 'Where the rest is': no row for {missing}"


def test_every_link_in_the_readme_and_the_docs_leads_somewhere():
    broken = {p.relative_to(REPO).as_posix(): _broken_links(p) for p in [README, *_pages()]}
    broken = {k: v for k, v in broken.items() if v}
    assert not broken, f"links to pages or headings that do not exist: {broken}"


def test_every_docs_path_named_in_text_or_code_exists():
    sources = [README, *_pages(), REPO / "build.py"]
    for top in CODE_DIRS:
        sources += [p for p in (REPO / top).rglob("*") if p.suffix in {".py", ".sh", ".md", ".yaml", ".j2"}]
    gone = sorted(
        f"{src.relative_to(REPO)}: {name}"
        for src in sources
        if "golden" not in src.parts and src != Path(__file__).resolve()
        for name in set(DOC_PATH.findall(src.read_text(errors="replace")))
        if name not in PENDING | SHARED and not (REPO / name).exists()
    )
    assert not gone, f"docs pages named that do not exist: {gone}"


def test_the_link_checks_can_fail():
    page = REPO / "docs" / "checks.md"
    assert "in-image-checks" in _anchors(page)
    assert (
        _slug("The GPU check and verl's own trainer (`test --gpu`)")
        == "the-gpu-check-and-verls-own-trainer-test---gpu"
    )
    text = "[a](nowhere.md) [b](../README.md#no-such-heading) [c](https://example.com) [d](gpu.md) [e](#in-image-checks)\n"
    assert _broken_links(page, text) == [
        "nowhere.md (no docs/nowhere.md)",
        "../README.md#no-such-heading (no heading #no-such-heading in README.md)",
    ]
    assert not DOC_PATH.findall("see README.md") and DOC_PATH.findall("see docs/checks.md.") == [
        "docs/checks.md"
    ]
