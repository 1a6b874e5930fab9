"""Versioned JSON Schemas for manifests, with defaults and one-line errors.

Schema-first input (as in stackinator): `additionalProperties: false` everywhere,
defaults injected during validation, and every error turned into
"file:line: key: what was expected".
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match

from mtpimage.errors import InputError
from mtpimage.manifests import modes
from mtpimage.manifests.yamlsource import SourceDoc

SCHEMA_VERSION = 1
_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


@cache
def load_schema(kind: str) -> dict:
    text = resources.files("mtpimage.schemas").joinpath(f"{kind}.v{SCHEMA_VERSION}.json").read_text()
    schema = json.loads(text)
    if kind == "profile":
        # the valid modes are the ones verl.yaml declares (mtpimage/manifests/modes.py), not a second list
        schema["properties"]["mode"]["enum"] = modes.names()
    return schema


def default(kind: str, *path: str) -> Any:
    """The schema's default at `path` ("builds", "against"; a `$defs` entry first: "$defs",
    "component", "index"), a fresh copy: the schema owns every default, and code that reads a
    field an unvalidated document may lack falls back to this, not to a second literal."""
    node = load_schema(kind)
    if path and path[0] == "$defs":
        node, path = node["$defs"][path[1]], path[2:]
    for key in path:
        node = node["properties"][key]
    return copy.deepcopy(node["default"])


def _drop_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_drop_required(v) for v in node]
    return node


def _with_defaults(cls):
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_DefaultingValidator = _with_defaults(Draft202012Validator)


def _describe(error: jsonschema.ValidationError) -> tuple[str, str | None]:
    """(problem, fix) in words a user can act on."""
    v, inst, schema = error.validator, error.instance, error.schema
    if v == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(inst) - set(allowed)) if isinstance(inst, dict) else []
        name = extra[0] if extra else "?"
        fix = f"remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
        return f"unknown key '{name}'", fix
    if v == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"missing required key '{missing}'", f"add '{missing}'"
    if v == "enum":
        return (f"expected one of {', '.join(map(str, error.validator_value))}; got {inst!r}", None)
    if v == "const":
        return f"expected {error.validator_value!r}; got {inst!r}", None
    if v == "type":
        want = error.validator_value
        want = [want] if isinstance(want, str) else want
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in want)
        return f"expected {words}; got {type(inst).__name__} {inst!r}", None
    if v == "pattern":
        desc = schema.get("description")
        if desc:  # `x-fix`: the schema's own word on how to write the value (not validated)
            return f"expected {desc}; got {inst!r}", schema.get("x-fix")
        return f"got {inst!r}, which does not match {error.validator_value}", None
    if v == "not":
        return f"value {inst!r} is not allowed here (no '..', absolute paths or unsafe characters)", None
    if v in ("minItems", "minProperties", "minLength"):
        return "must not be empty", None
    if v == "uniqueItems":
        return f"has duplicate entries: {inst!r}", "list each entry once"
    if v in ("minimum", "maximum", "exclusiveMinimum"):
        return f"{inst!r} is out of range ({v} {error.validator_value})", None
    if v == "oneOf":
        return f"{inst!r} matches none of the allowed forms", None
    return error.message, None


def _first_error(validator, instance) -> jsonschema.ValidationError | None:
    error = best_match(validator.iter_errors(instance))
    while error is not None and error.context:  # descend into oneOf/anyOf/if-then
        error = best_match(error.context)
    return error


def _key_path(error: jsonschema.ValidationError) -> tuple:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        if extra:
            return path + (extra[0],)
    if error.validator == "required" and "'" in error.message:
        return path + (error.message.split("'")[1],)
    return path


def _check(schema_doc: dict, instance: Any, partial: bool) -> tuple[Any, Any]:
    if partial:
        validator = Draft202012Validator(_drop_required(schema_doc))
    else:
        instance = copy.deepcopy(instance)
        validator = _DefaultingValidator(schema_doc)
    return instance, _first_error(validator, instance)


def validate(doc: SourceDoc, kind: str, *, partial: bool = False) -> Any:
    """Validate doc.data against schema `kind`; return it with defaults applied
    (unless partial). Raises InputError naming file:line and key."""
    instance, error = _check(load_schema(kind), doc.data, partial)
    if error is None:
        return instance
    path = _key_path(error)
    problem, fix = _describe(error)
    raise InputError(doc.where(path), ".".join(map(str, path)) or "(document)", problem, fix)


def validate_def(data: dict, kind: str, definition: str, where: str, key_prefix: str) -> dict:
    """Validate one `$defs` entry of schema `kind` (e.g. a component after overrides)."""
    full = load_schema(kind)
    sub = {"$schema": full["$schema"], "$ref": f"#/$defs/{definition}", "$defs": full["$defs"]}
    instance, error = _check(sub, data, partial=False)
    if error is None:
        return instance
    path = ".".join(map(str, _key_path(error)))
    problem, fix = _describe(error)
    raise InputError(where, f"{key_prefix}.{path}" if path else key_prefix, problem, fix)
