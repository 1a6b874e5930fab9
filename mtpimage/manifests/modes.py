"""The MTP modes, declared in one place: `modes` in mtpimage/data/verl.yaml.

A mode is declared by the verl MtpConfig fields it sets (upstream's own switches). What this
tool says about a mode is derived from those fields here, never listed again elsewhere:
whether it trains MTP (enable_train), whether the MTP loss reaches the trunk (trained without
detach_encoder), whether it drafts tokens in rollout (enable_rollout), the training contract
the in-image GPU check asserts, and the profile schema's list of valid modes. So adding a mode
is one entry in verl.yaml (see docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml


@cache
def verl_facts() -> dict:
    return yaml.safe_load(resources.files("mtpimage.data").joinpath("verl.yaml").read_text())


@dataclass(frozen=True)
class Mode:
    name: str
    mtp_config: tuple[tuple[str, str], ...]  # MtpConfig (field, value), upstream's order
    targets: tuple[str, ...] | None = None  # the verl targets it runs for; None: every target

    def _on(self, field: str) -> bool:
        return dict(self.mtp_config).get(field) == "True"

    @property
    def trains_mtp(self) -> bool:
        return self._on("enable_train")

    @property
    def loss_reaches_trunk(self) -> bool:
        """The MTP loss updates trunk parameters: trained without detach_encoder."""
        return self.trains_mtp and not self._on("detach_encoder")

    @property
    def rollout(self) -> bool:
        """MTP drafts tokens for speculative decoding in rollout."""
        return self._on("enable_rollout")

    @property
    def contract(self) -> str:
        """What images/checks/gpu_check.py asserts for the mode: load-only (MTP weights kept,
        not trained), full (the MTP loss reaches the trunk) or mtp-only (it does not)."""
        if not self.trains_mtp:
            return "load-only"
        return "full" if self.loss_reaches_trunk else "mtp-only"


def _fields(name: str) -> list[tuple[str, str]]:
    """MtpConfig (field, value) pairs for a mode, following `extends`."""
    spec = verl_facts()["modes"][name]
    base = _fields(spec["extends"]) if "extends" in spec else []
    return base + [(str(k), str(v)) for k, v in spec["overrides"]]


@cache
def get(name: str) -> Mode:
    targets = verl_facts()["modes"][name].get("targets")
    return Mode(name, tuple(_fields(name)), tuple(targets) if targets is not None else None)


def names() -> list[str]:
    return list(verl_facts()["modes"])


def mode_overrides(name: str) -> list[tuple[str, str]]:
    return list(get(name).mtp_config)
