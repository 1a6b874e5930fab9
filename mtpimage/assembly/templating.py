"""The jinja2 environment of the templates under images/, and the quoting its filters apply.

Every manifest value reaching a RUN line goes through `q` (shell quoting); values in LABEL/ENV
go through `dq` (Dockerfile double quotes, `$` escaped). The install steps (steps.py) render
their commands in Python with the same `shell_quote`.
"""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path

import jinja2


def shell_quote(value) -> str:
    return shlex.quote(str(value))


def docker_quote(value) -> str:
    """A Dockerfile double-quoted string (LABEL/ENV): JSON escapes, `$` escaped."""
    text = json.dumps(str(value), ensure_ascii=True)
    return text.replace("$", "\\$")


@functools.lru_cache(maxsize=4)  # one Environment per template folder: its compiled templates are kept
def environment(images: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["dq"] = docker_quote
    return env
