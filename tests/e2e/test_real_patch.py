"""The shipped sglang patch made from the real ArronHZG/sglang commits. Needs them through git
(GitHub, or a mirror via url.insteadOf), so it runs only with MTP_REAL_SOURCES=1, never in CI;
what it checks is recorded in manifests/lock.yaml by `python build.py lock` (and that record
is checked in CI by tests/unit/test_patches.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from mtpimage.cli import plan_for
from mtpimage.manifests import manifest, patches

pytestmark = pytest.mark.skipif(
    os.environ.get("MTP_REAL_SOURCES") != "1",
    reason="needs the real ArronHZG/sglang commits (set MTP_REAL_SOURCES=1)",
)


def test_shipped_patch_is_made_from_its_commits_with_its_pinned_sha256():
    m = manifest.load()
    [p] = plan_for(m, "mtp-rollout", None).component("sglang").patches
    data = patches.patch_bytes("sglang", 0, p, m.root, "manifests/components.yaml")
    assert hashlib.sha256(data).hexdigest() == p.sha256
    text = data.decode()
    assert [line.split()[2] for line in text.splitlines() if line.startswith("diff --git ")] == [
        f"a/{path}" for path in p.paths
    ]
    assert "+def unwrap_ipc_tensors(" in text and text.count("unwrapped_tensors = unwrap_ipc_tensors(") == 2
