"""mtpimage/data/platforms.yaml, read once and typed: the CPU platforms lock.yaml can hold files
for (issue 49 item 3: linux/arm64 for GH200/GB200), and what a plan's locked set lacks on its
platform. Rule `platform-wheels` (rules.py) judges a plan with it; `lock` resolves per platform."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

SOURCE = "https://pypi.org/simple/{name}/"  # where a missing wheel can be seen (PEP 691 page)


@dataclass(frozen=True)
class PlatformFacts:
    platform: str  # os/architecture, as OCI indexes and builds.platform name it
    arch: str  # the wheels' CPU: x86_64, aarch64
    why: str


@cache
def known() -> dict[str, PlatformFacts]:
    data = yaml.safe_load(resources.files("mtpimage.data").joinpath("platforms.yaml").read_text())
    return {
        platform: PlatformFacts(platform, str(p["arch"]), " ".join(str(p["why"]).split()))
        for platform, p in data["platforms"].items()
    }


def arch_of(platform: str) -> str:
    return known()[platform].arch
