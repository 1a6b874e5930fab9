"""Checks of a HF config.json against an MTP profile (`explain --model-config`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage.errors import InputError
from mtpimage.manifests import inputfile
from mtpimage.plan.model import verl_facts

# a HF config.json is a few kB (the largest seen, multimodal ones, ~20 kB); more is not one
MAX_BYTES = 4 << 20
FIX = "pass the model's config.json"
_ABSENT = object()


def _get(config: dict, dotted: str):
    """A value of config.json by its dotted key (text_config.mtp_num_hidden_layers); _ABSENT
    where it (or a part of its path) is not there."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


@dataclass(frozen=True)
class MtpLayers:
    """What verl's _get_mtp_num_layers returns for this config, and where it read it."""

    count: int | float = 0  # 0: no MTP layers
    key: str | None = None  # the key the count came from
    seen: dict = field(default_factory=dict)  # every key of the order that is present: its value
    unreadable: str | None = None  # a present key verl cannot compare with 0 (TypeError there)

    @property
    def found(self) -> str | None:
        return f"MTP layers: {self.count} ({self.key})" if self.key else None


def mtp_layers(config: dict, keys: list[str]) -> MtpLayers:
    """As verl's _get_mtp_num_layers at the pin (megatron_utils.py): the keys in their order
    (mtpimage/data/verl.yaml model_config.mtp_layers_keys), the first present value > 0 is
    the count; a present value that is not a number (null, text) makes verl's `> 0` raise."""
    seen = {}
    for key in keys:
        value = _get(config, key)
        if value is _ABSENT:
            continue
        seen[key] = value
        if not isinstance(value, int | float):  # bool is an int, as in verl's comparison
            return MtpLayers(seen=seen, unreadable=key)
        if value > 0:
            return MtpLayers(int(value) if isinstance(value, bool) else value, key, seen)
    return MtpLayers(seen=seen)


def read_config(path: Path) -> dict:
    """config.json, a regular file of at most MAX_BYTES (inputfile.py), as a JSON object;
    anything else, a 100,000-deep nesting included, is one input error (exit 2)."""
    text = inputfile.read_text(Path(path), MAX_BYTES, "a model config", str(path), FIX)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), None, f"not a readable JSON file: {exc}", FIX) from None
    except RecursionError:  # json's decoder recurses per nesting level
        raise InputError(str(path), None, "JSON nested too deep to be a model config", FIX) from None
    if not isinstance(config, dict):
        raise InputError(str(path), None, "expected a JSON object", FIX)
    return config


@dataclass(frozen=True)
class ModelCheck:
    """What `explain --model-config` found: the MTP layers as verl counts them, failures (the
    run would fail: exit 1, said first) and warnings (it would run, not as likely wanted)."""

    layers: MtpLayers
    warnings: list[str]
    failures: list[str] = field(default_factory=list)


def model_warnings(path: Path) -> list[str]:
    """Every finding as one list (failures first)."""
    found = check_model(path)
    return found.failures + found.warnings


def check_model(path: Path) -> ModelCheck:
    config = read_config(path)
    facts = verl_facts()["model_config"]
    failures, out = [], []
    keys = facts["mtp_layers_keys"]
    layers = mtp_layers(config, keys)
    if layers.unreadable:
        value = layers.seen[layers.unreadable]
        out.append(
            f"{path}: {layers.unreadable} is {json.dumps(value)[:40]}, not a number: verl's "
            "_get_mtp_num_layers compares it with 0 and raises TypeError (fix: set it to the "
            "model's MTP layer count, or remove it)"
        )
    elif not layers.key:
        seen = ", ".join(f"{k} is {v}" for k, v in layers.seen.items() if v is not None) or (
            f"none of {', '.join(keys)} is set"
        )
        failures.append(
            f"{path}: {seen}: the model has no MTP layers, so every MTP setting is a no-op and "
            "verl's check_mtp_config raises ValueError('enable mtp while model has no mtp layer') "
            "when mtp.enable=True (fix: use a model with MTP weights, or drop the MTP overrides)"
        )
    mimo = facts["mimo"]
    archs = config.get("architectures")
    is_mimo = config.get("model_type") in mimo["model_types"] or any(
        a in mimo["architectures"] for a in (archs if isinstance(archs, list) else [])
    )
    want = mimo["max_position_embeddings"]
    if is_mimo and config.get("max_position_embeddings") != want:
        out.append(
            f"{path}: max_position_embeddings is {config.get('max_position_embeddings')}; "
            f"MiMo needs {want} before the upstream RL example runs "
            f'(fix: set "max_position_embeddings": {want} in config.json)'
        )
    return ModelCheck(layers, out, failures)
