"""Load YAML while remembering where each key came from.

PyYAML's plain loader forgets line numbers and silently keeps the last of two
duplicate keys; both would make errors useless ("somewhere in this file").
We compose the node tree once, record the line of every mapping key and
sequence item by its path, and reject duplicate keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError

Path_ = tuple  # a path of keys/indices into the document


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
                raise InputError(f"{file}:{key_node.start_mark.line + 1}", None,
                                 "mapping keys must be plain strings")
            key = key_node.value
            if key in out:
                raise InputError(f"{file}:{key_node.start_mark.line + 1}",
                                 ".".join(map(str, path + (key,))),
                                 "duplicate key", "keep one of the two entries")
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, path + (key,), lines, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, path + (i,), lines, file) for i, item in enumerate(node.value)]
    # Scalars: let the safe constructor decide the type (int, bool, str, ...).
    return _scalar(node)


_resolver_loader = yaml.SafeLoader("")


def _scalar(node: yaml.ScalarNode) -> Any:
    return _resolver_loader.construct_object(node, deep=True)


def load_text(text: str, file: str) -> SourceDoc:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{file}:{mark.line + 1}" if mark else file
        raise InputError(where, None, f"invalid YAML: {exc.problem or exc.context}",
                         "fix the YAML syntax at that line") from None
    except yaml.YAMLError as exc:
        raise InputError(file, None, f"invalid YAML: {exc}", "fix the YAML syntax") from None
    if node is None:
        return SourceDoc(file, None, {})
    lines: dict = {}
    data = _walk(node, (), lines, file)
    return SourceDoc(file, data, lines)


def load_file(path: Path, display: str | None = None) -> SourceDoc:
    display = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(display, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(display, None, f"cannot read: {exc}") from None
    return load_text(text, display)
