"""verl's own Megatron trainers start in every shipped image (issue 34): what their path
imports at the first step is in the lock, the image sets what verl's launch scripts read,
and the in-image checks reach the import that was missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SHIPPED = sorted(p.stem for p in (MANIFESTS / "profiles").glob("mtp-*.yaml"))

# Found by running verl's sft_trainer with the Megatron engine on an H200 with the image's
# packages: each of these was imported on the way to the first step (shared docs,
# verl-trainer.md "What the path needs"). megatron-energon: Bridge training/config.py:53 ->
# data/builders/energon.py:25 -> data/energon/base_energon_datamodule.py:19.
TRAINER_PATH_DISTRIBUTIONS = (
    "megatron-energon",
    "multi-storage-client",
    "ray",
    "fastapi",
    "uvicorn",
    "orjson",
    "opentelemetry-api",
    "pydantic",
    "nvidia-modelopt",
    "pulp",
    "peft",
    "datasets",
    "diffusers",
    "tensordict",
    "torchdata",
    "codetiming",
)


def _lock() -> dict:
    return yaml.safe_load((MANIFESTS / "lock.yaml").read_text())


@pytest.mark.parametrize("profile", SHIPPED)
def test_every_import_of_the_trainer_path_is_in_the_profiles_python_set(profile):
    lock = _lock()
    python_set = lock["python_sets"][lock["profiles"][profile]["python_set"]]
    missing = [d for d in TRAINER_PATH_DISTRIBUTIONS if d not in python_set["packages"]]
    assert missing == [], f"{profile}: the lock lacks {missing}"


def _rendered(profile: str):
    return render(plan_for(manifest.load(MANIFESTS), profile, None), MANIFESTS)


@pytest.mark.parametrize("profile", SHIPPED)
def test_the_image_sets_verl_use_uv_and_checks_the_engine_path(profile):
    rendered = _rendered(profile)
    dockerfile = rendered.files["Dockerfile"].decode()
    assert 'ENV VERL_USE_UV="0"' in dockerfile
    # below the mode layer: it belongs to verl's pins, not to a profile
    assert dockerfile.index("VERL_USE_UV") < dockerfile.index("# ---- layer: mode")
    vector = json.loads(rendered.files["mtp/version.json"])
    (verl,) = [c for c in vector["components"] if c["name"] == "verl"]
    assert verl["runtime_env"] == {"VERL_USE_UV": "0"}
    engine = {e["id"]: e for e in verl["entry_checks"]}["verl-megatron-engine"]
    assert "create_ddp_config(" in engine["code"] and engine["needs"] == ["transformer-engine"]
