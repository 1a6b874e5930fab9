"""Source probes (lock issue): decide rules from the pinned sources' code."""
from __future__ import annotations

from .errors import BuilderError


def probe_plan(plan):
    raise BuilderError("source probes are not available in this version yet")
