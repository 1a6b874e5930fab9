"""#36 item 9: no rule or probe text in mtpimage/data/*.yaml is cut at ` #` (YAML takes the rest
of a plain scalar's line as a comment: "...Megatron-Bridge PR #2387" loads as "...Bridge PR")."""

from __future__ import annotations

from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parents[2] / "mtpimage" / "data"


def cut_texts(text: str, name: str) -> list[str]:
    """Plain scalars of prose (they hold a space) followed on their last line by a comment."""
    lines = text.splitlines()
    out = []

    def walk(node):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                walk(k)
                walk(v)
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                walk(v)
        elif node.style is None and " " in node.value:
            rest = (
                lines[node.end_mark.line][node.end_mark.column :] if node.end_mark.line < len(lines) else ""
            )
            if rest.lstrip().startswith("#"):
                out.append(f"{name}:{node.end_mark.line + 1}: {node.value!r} loses {rest.strip()!r}")

    walk(yaml.compose(text))
    return out


def test_no_text_of_the_data_files_is_cut_at_a_comment():
    found = [c for p in sorted(DATA.glob("*.yaml")) for c in cut_texts(p.read_text(), p.name)]
    assert found == [], "\n".join(found)


def test_the_check_sees_a_cut_text():
    assert cut_texts("fix: use Megatron-Bridge PR #2387\nok: plain # comment is no text\n", "t") == [
        "t:1: 'use Megatron-Bridge PR' loses '#2387'"
    ]
