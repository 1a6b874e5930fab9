"""mtpimage/data/rules.yaml, read once: the rules and the facts about pinned commits and
versions that the rules' predicates and the mtp-only recipes (mtponly.py) decide from. Its own
module so that the Plan's builder can read the facts without importing the rules (which import
the Plan)."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml


@cache
def rules_data() -> dict:
    return yaml.safe_load(resources.files("mtpimage.data").joinpath("rules.yaml").read_text())


def tool_facts() -> dict:
    """The tool's own facts (a site's manifests/facts.yaml merges over them: sitefacts.py)."""
    return rules_data()["facts"]
