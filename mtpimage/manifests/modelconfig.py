"""Checks of a HF config.json against an MTP profile (`explain --model-config`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mtpimage.errors import InputError
from mtpimage.plan.model import verl_facts


def _get(config: dict, dotted: str):
    """A value of config.json by its dotted key (text_config.mtp_num_hidden_layers); None if absent."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class ModelCheck:
    """What `explain --model-config` found: failures (the run would fail: exit 1, said first)
    and warnings (it would run, but not as the user likely wants)."""

    failures: list[str]
    warnings: list[str]


def model_warnings(path: Path) -> list[str]:
    """Every finding as one list (failures first)."""
    found = check_model(path)
    return found.failures + found.warnings


def check_model(path: Path) -> ModelCheck:
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), None, "model config not found", "pass the model's config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            str(path), None, f"not a readable JSON file: {exc}", "pass the model's config.json"
        ) from None
    if not isinstance(config, dict):
        raise InputError(str(path), None, "expected a JSON object", "pass the model's config.json")
    facts = verl_facts()["model_config"]
    failures, out = [], []
    keys = facts["mtp_layers_keys"]
    found = {k: _get(config, k) for k in keys}
    if not any(_positive(v) for v in found.values()):
        seen = ", ".join(f"{k} is {v}" for k, v in found.items() if v is not None) or (
            f"none of {', '.join(keys)} is set"
        )
        failures.append(
            f"{path}: {seen}: the model has no MTP layers, so every MTP setting is a no-op and "
            "verl's check_mtp_config raises ValueError('enable mtp while model has no mtp layer') "
            "when mtp.enable=True (fix: use a model with MTP weights, or drop the MTP overrides)"
        )
    mimo = facts["mimo"]
    is_mimo = config.get("model_type") in mimo["model_types"] or any(
        a in mimo["architectures"] for a in config.get("architectures") or []
    )
    want = mimo["max_position_embeddings"]
    if is_mimo and config.get("max_position_embeddings") != want:
        out.append(
            f"{path}: max_position_embeddings is {config.get('max_position_embeddings')}; "
            f"MiMo needs {want} before the upstream RL example runs "
            f'(fix: set "max_position_embeddings": {want} in config.json)'
        )
    return ModelCheck(failures, out)
