"""What each source probe reads and expects (mtpimage/data/probes.yaml), loaded once.

The one description of a probe: probes.py reads the pinned sources by it, versionvector.py
copies the entries of the probes an image repeats into its version vector, and
images/checks/run_checks.py (inside the image, without mtpimage) reads them from there.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml


@cache
def probe_specs() -> dict[str, dict]:
    """{probe id: its entry}, in the file's order."""
    text = resources.files("mtpimage.data").joinpath("probes.yaml").read_text()
    return {
        pid: {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in spec.items()}
        for pid, spec in yaml.safe_load(text)["probes"].items()
    }


@cache
def source_probe_specs() -> dict[str, dict]:
    """{probe id: its entry} of the probes of the pinned sources alone (`source_probes`)."""
    text = resources.files("mtpimage.data").joinpath("probes.yaml").read_text()
    return {
        pid: {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in spec.items()}
        for pid, spec in (yaml.safe_load(text).get("source_probes") or {}).items()
    }


def spec(pid: str) -> dict:
    return probe_specs()[pid]


def component_of(plan, pid: str):
    """The plan's component whose code probe `pid` reads (its `component` in probes.yaml), or
    None when the plan has none of that name: the file names it, no caller does."""
    return plan.component(spec(pid)["component"])
