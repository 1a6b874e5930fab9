"""A source probe is described once (mtpimage/data/probes.yaml): the builder's probes read the
pinned sources by it, the version vector carries it into the image, and the in-image checks
(images/checks/run_checks.py, no mtpimage there) probe what is installed by the vector's entry
(issue 14 item 5)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from mtpimage.assembly.render import IMAGES_DIR, render
from mtpimage.cli import plan_for
from mtpimage.lock import probes
from mtpimage.lock.probetable import probe_specs
from mtpimage.manifests import manifest
from mtpimage.plan import rules


@pytest.fixture(scope="module")
def run_checks():
    spec = importlib.util.spec_from_file_location(
        "run_checks_under_test", IMAGES_DIR / "checks" / "run_checks.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_each_probe_decides_a_rule_and_reads_a_shipped_component():
    ids = {r.id for r in rules.rules()}
    components = manifest.load().catalogue.data["components"]
    for pid, spec in probe_specs().items():
        assert spec["rule"] in ids, pid
        assert spec["component"] in components, pid
        assert spec["file"].endswith(".py") and spec["expect"] and spec["fix"], pid
    assert probes.PROBED_RULES == tuple(s["rule"] for s in probe_specs().values()) + probes.SOURCE_ONLY_RULES
    assert probes.MTP_FILE == probe_specs()["recompute-padding-mask"]["file"]


def test_the_version_vector_carries_the_entries_the_image_repeats():
    m = manifest.load()
    vv = json.loads(render(plan_for(m, "mtp-cp-recompute", None), m.root).files["mtp/version.json"])
    assert vv["probes"] and vv["probes"] == {pid: probe_specs()[pid] for pid in vv["probes"]}


def test_every_probe_has_an_in_image_counterpart(run_checks):
    assert set(run_checks.PROBES) == set(probe_specs())


def test_in_image_probes_read_what_the_vector_entry_names(run_checks, tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bridge.py").write_text("class Thing:\n    pass\n\n\ndef unwrap(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mimo = {**probe_specs()["mimo-needs-bridge-2387"], "file": "fakepkg/bridge.py", "class": "Thing"}
    assert run_checks.probe_mimo(mimo)[0] == run_checks.PASS
    assert run_checks.probe_mimo({**mimo, "class": "Other"})[0] == run_checks.FAIL
    sglang = {**probe_specs()["sglang-ipc-unwrap"], "file": "fakepkg/bridge.py", "function": "unwrap"}
    assert run_checks.probe_sglang(sglang)[0] == run_checks.PASS
    status, detail = run_checks.probe_sglang({**sglang, "function": "unwrap_twice"})
    assert status == run_checks.FAIL and "unwrap_twice" in detail
    vector = {"components": [], "probes": {"mimo-needs-bridge-2387": mimo}}
    assert run_checks.check_probes(vector) == [
        run_checks.result(
            "probe:mimo-needs-bridge-2387",
            run_checks.PASS,
            "Megatron-Bridge has the MiMo MTP bridge (class Thing)",
        )
    ]
