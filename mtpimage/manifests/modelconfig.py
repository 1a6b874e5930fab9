"""Checks of a HF config.json against an MTP profile (`explain --model-config`)."""

from __future__ import annotations

import json
from pathlib import Path

from mtpimage.errors import InputError
from mtpimage.plan.model import verl_facts


def model_warnings(path: Path) -> list[str]:
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
    out = []
    key = facts["mtp_layers_key"]
    layers = config.get(key)
    if not layers:
        out.append(
            f"{path}: {key} is {'absent' if layers is None else layers}: the model has no MTP "
            "layers, so every MTP setting is a no-op and verl's check_mtp_config raises "
            "ValueError('enable mtp while model has no mtp layer') when mtp.enable=True "
            "(fix: use a model with MTP weights, or drop the MTP overrides)"
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
    return out
