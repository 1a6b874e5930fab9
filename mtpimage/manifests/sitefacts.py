"""A site's own facts for the rules: manifests/facts.yaml, in the schema of the `facts:` section
of mtpimage/data/rules.yaml (known-bad and known-good commits, version bounds), merged over
the tool's. A user who installed the tool with pipx cannot edit its data; a site that read a
commit's source (or hit a bug) records it next to its pins.

Validated like every manifest: a key the tool's facts do not have, or a value of another
shape (a mapping where the tool has a list), is one InputError naming file:line. Mappings
merge (a site's entry wins), lists extend, scalars replace. Each fact the site added says where
it came from: a description string gets ` (site fact, manifests/facts.yaml:LINE)`, and an
entry with a `ref` gets it in its ref, so the verdict that uses it names the file and line.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage.errors import InputError
from mtpimage.manifests.yamlsource import SourceDoc, load_file

FILE = "facts.yaml"


@dataclass
class SiteFacts:
    facts: dict  # the tool's facts with the site's merged in
    added: list[str] = field(default_factory=list)  # "key.path (file:line)" for each site fact


def load(root: Path | None, tool_facts: dict) -> SiteFacts:
    path = Path(root) / FILE if root is not None else None
    if path is None or not path.is_file():
        return SiteFacts(tool_facts)
    doc = load_file(path, f"{Path(root).name}/{FILE}")
    data = doc.data
    if not isinstance(data, dict) or set(data) - {"schema_version", "facts"} or "facts" not in data:
        raise InputError(
            doc.where(),
            None,
            "expected `schema_version: 1` and a `facts:` mapping",
            "write it in the schema of the facts section of mtpimage/data/rules.yaml",
        )
    if not isinstance(data["facts"], dict):
        raise InputError(doc.where(("facts",)), "facts", "expected a mapping", "see mtpimage/data/rules.yaml")
    out = SiteFacts(copy.deepcopy(tool_facts))
    _merge(out.facts, data["facts"], ("facts",), doc, out.added)
    return out


def _merge(base: dict, over: dict, path: tuple, doc: SourceDoc, added: list[str]) -> None:
    for key, value in over.items():
        key = str(key)
        here = path + (key,)
        dotted = ".".join(here)
        where = doc.where(here)
        if key not in base and not _open(base):
            raise InputError(
                where,
                dotted,
                "not a fact the rules use",
                f"use one of: {', '.join(sorted(map(str, base))) or '(none here)'}",
            )
        have = base.get(key)
        if have is None and _open(base):  # a new entry of a table (a commit, a version)
            _same_shape(base, value, where, dotted)
            base[key] = _labelled(value, where)
            added.append(f"{dotted} ({where})")
        elif isinstance(have, dict):
            if not isinstance(value, dict):
                raise InputError(where, dotted, f"expected a mapping, got {type(value).__name__}")
            _merge(have, value, here, doc, added)
        elif isinstance(have, list):
            if not isinstance(value, list):
                raise InputError(where, dotted, f"expected a list, got {type(value).__name__}")
            have.extend(v for v in value if v not in have)
            added.append(f"{dotted} ({where})")
        else:
            if isinstance(value, (dict, list)):
                raise InputError(
                    where, dotted, f"expected a value like {have!r}, got a {type(value).__name__}"
                )
            base[key] = value
            added.append(f"{dotted} ({where})")


def _same_shape(table: dict, value, where: str, dotted: str) -> None:
    """A new entry has the fields every entry of its table has (the predicates read them)."""
    entries = [v for v in table.values() if isinstance(v, dict)]
    if not entries:
        if isinstance(value, (dict, list)):
            raise InputError(where, dotted, "expected a value like the other entries of this table")
        return
    if not isinstance(value, dict):
        raise InputError(where, dotted, "expected a mapping like the other entries of this table")
    need = set.intersection(*(set(e) for e in entries)) - set(value)
    if need:
        raise InputError(
            where, dotted, f"missing {', '.join(sorted(need))}", f"add {', '.join(sorted(need))}"
        )


def _open(table: dict) -> bool:
    """A table keyed by data (commits, versions), not by the rules' field names: a site may
    add entries. Recognised by its keys: 40-hex commits, 64-hex patch sha256s or version numbers."""
    keys = [str(k) for k in table]
    return bool(keys) and all(_datum(k) for k in keys)


def _datum(key: str) -> bool:
    import re

    return bool(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}|\d+(\.\d+)+\w*", key))


def _labelled(value, where: str):
    tag = f"site fact, {where}"
    if isinstance(value, str):
        return f"{value} ({tag})"
    if isinstance(value, dict):
        value = dict(value)
        value["ref"] = f"{value.get('ref', 'a site fact')} ({tag})"
    return value
