"""Load YAML while remembering where each key came from.

PyYAML's plain loader forgets line numbers and silently keeps the last of two
duplicate keys; both would make errors useless ("somewhere in this file").
We compose the node tree once, record the line of every mapping key and
sequence item by its path, and reject duplicate keys.

Manifests come from users and pull requests, so hostile YAML is bounded before anything
expands it: a file may hold at most MAX_BYTES, nest at most MAX_DEPTH collections deep,
and expand (aliases included) to at most MAX_NODES values; an alias that refers to the
collection it sits in is refused. Each is a one-line input error (exit 2) with the line,
found while composing, so a billion-laughs file or 5,000 nested brackets stop at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtpimage.errors import InputError
from mtpimage.manifests import inputfile

Path_ = tuple  # a path of keys/indices into the document

MAX_BYTES = 1 << 20  # the shipped manifests total ~50 kB
MAX_DEPTH = 64  # the shipped manifests nest 6 deep
MAX_NODES = 100_000  # values after alias expansion; the shipped files have < 2,000


@dataclass
class SourceDoc:
    """A parsed YAML document plus the line (1-based) of each path in it."""

    file: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def where(self, path: Path_ = ()) -> str:
        """'file:line' for the deepest prefix of `path` that has a line."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return f"{self.file}:{line}"
        return self.file


def _walk(node: yaml.Node, path: Path_, lines: dict, file: str) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError(
                    f"{file}:{key_node.start_mark.line + 1}", None, "mapping keys must be plain strings"
                )
            key = key_node.value
            if key in out:
                raise InputError(
                    f"{file}:{key_node.start_mark.line + 1}",
                    ".".join(map(str, path + (key,))),
                    "duplicate key",
                    "keep one of the two entries",
                )
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, path + (key,), lines, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, path + (i,), lines, file) for i, item in enumerate(node.value)]
    # Scalars: let the safe constructor decide the type (int, bool, str, ...).
    return _scalar(node)


_resolver_loader = yaml.SafeLoader("")


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses self-referencing aliases and bounds nesting depth
    and expanded size while it composes (PyYAML itself would recurse or expand without end)."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file = file
        self._open: list[str | None] = []  # anchors of the collections being composed
        self._stats: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, depth)

    def _refuse(self, mark, problem: str, fix: str) -> None:
        raise InputError(f"{self.file}:{mark.line + 1}", None, problem, fix)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                self._refuse(
                    event.start_mark,
                    f"alias *{event.anchor} refers to the collection it is part of (a cycle)",
                    f"write the value out instead of *{event.anchor}",
                )
            return super().compose_node(parent, index)
        if len(self._open) >= MAX_DEPTH:
            self._refuse(
                event.start_mark, f"nested more than {MAX_DEPTH} levels deep", "flatten the document"
            )
        self._open.append(getattr(event, "anchor", None))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open.pop()
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        size, depth = 1, 1
        for child in children:
            csize, cdepth = self._stats.get(id(child), (1, 1))
            size, depth = size + csize, max(depth, cdepth + 1)
        if size > MAX_NODES:
            self._refuse(
                node.start_mark,
                f"expands to more than {MAX_NODES} values (aliases included)",
                "write a smaller document; do not nest aliases of aliases",
            )
        if depth > MAX_DEPTH:
            self._refuse(
                node.start_mark,
                f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded",
                "flatten the document",
            )
        self._stats[id(node)] = (size, depth)
        return node


def _mark_line(text: str, mark) -> int:
    """1-based line of a mark; an error at the end of a file that ends in a line break is on
    its last line, not on the empty line after it."""
    line = mark.line + 1
    if mark.index >= len(text) and mark.column == 0 and line > 1:
        line -= 1
    return line


# Contexts that start where the typo is: a key that lost its colon ("while scanning a simple
# key"), an unclosed quote or bracket. PyYAML's problem mark is where it noticed, often the next
# line or the end of the file. A block collection's context is its first line (the file's top,
# maybe), so there the problem mark is the better line.
_TYPO_CONTEXTS = ("while scanning", "while parsing a flow")


def error_line(text: str, exc: yaml.MarkedYAMLError) -> int | None:
    """The 1-based line a person fixes for a YAML error in `text`, or None."""
    ctx = exc.context or ""
    if exc.context_mark is not None and ctx.startswith(_TYPO_CONTEXTS):
        return _mark_line(text, exc.context_mark)
    mark = exc.problem_mark or exc.context_mark
    return _mark_line(text, mark) if mark is not None else None


def error_text(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's problem and context without its marks, which name the parser's input
    (`"<unicode string>", line 3549`) rather than the file."""
    problem = exc.problem or ""
    context = exc.context or ""
    return f"{problem} ({context})" if problem and context else problem or context or "does not parse"


def _scalar(node: yaml.ScalarNode) -> Any:
    return _resolver_loader.construct_object(node, deep=True)


def load_text(text: str, file: str) -> SourceDoc:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_BYTES:
        raise InputError(
            file,
            None,
            f"{size} bytes; a manifest may have at most {MAX_BYTES}",
            "split it or remove what is not a manifest",
        )
    loader = None
    try:
        loader = _BoundedLoader(text, file)  # its reader refuses unprintable characters
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        line = error_line(text, exc)
        raise InputError(
            f"{file}:{line}" if line else file,
            None,
            f"invalid YAML: {error_text(exc)}",
            "fix the YAML syntax at that line",
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(file, None, f"invalid YAML: {exc}", "fix the YAML syntax") from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        return SourceDoc(file, None, {})
    lines: dict = {}
    data = _walk(node, (), lines, file)
    return SourceDoc(file, data, lines)


def load_file(path: Path, display: str | None = None) -> SourceDoc:
    """A manifest from disk: a regular file of at most MAX_BYTES, its size known before a
    byte is read (inputfile.py: a device, a FIFO or a directory is refused at once)."""
    display = display or str(path)
    text = inputfile.read_text(
        path, MAX_BYTES, "a manifest", display, "split it or remove what is not a manifest"
    )
    return load_text(text, display)
