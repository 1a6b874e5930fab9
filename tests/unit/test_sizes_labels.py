"""The per-layer size table names each install layer of the rendered Dockerfile."""

from __future__ import annotations

from pathlib import Path

from mtpimage.build import sizes
from mtpimage.build.render import render
from mtpimage.manifests import manifest
from mtpimage.plan.load import plan_for

REPO = Path(__file__).resolve().parents[2]


def test_every_locked_install_layer_gets_a_name():
    m = manifest.load(REPO / "manifests")
    text = render(plan_for(m, "mtp-detach", None), m.root).dockerfile
    runs = ["RUN" + block.split("\n# ")[0] for block in text.split("\nRUN")[1:]]
    labels = [
        sizes._short("/bin/bash -o pipefail -euc " + run[4:])
        for run in runs
        if "/tmp/mtp-build/requirements/" in run or "mtp_install.py record" in run
    ]
    assert "RUN install torch dependencies" in labels
    assert "RUN install sglang dependencies" in labels
    assert "RUN install sglang" in labels and "RUN install verl" in labels
    assert all(label.startswith("RUN install ") for label in labels), labels
