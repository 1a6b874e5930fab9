"""The generated RayJob against KubeRay's own RayJob CRD at the pinned version
(mtpimage/data/multinode.yaml: version, URL, sha256).

The CRD is not in the repository (upstream text) and no package registry ships it: it is read
from MTP_TEST_KUBERAY_CRD, or from where scripts/setup-test-host.sh stores it after checking its
sha256 (over HTTPS, or through git from KubeRay's repository or a mirror of it). Its openAPIV3Schema is applied the way
`kubectl apply --validate=strict` does: unknown fields are errors, int-or-string fields take
either, preserve-unknown-fields objects take anything.
"""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from mtpimage.commands.load import plan_for
from mtpimage.imageref import ImageRef
from mtpimage.manifests import manifest
from mtpimage.outputs import multinode
from mtpimage.outputs.rayjob import rayjob

DIGEST = "sha256:" + "ef" * 32


def _crd_text() -> str:
    pin = multinode.facts()["kuberay"]
    state = Path(os.environ.get("MTP_TEST_STATE_DIR", "/var/lib/mtp-test-host"))
    path = Path(os.environ.get("MTP_TEST_KUBERAY_CRD") or state / "kuberay" / f"{pin['crd_sha256']}.yaml")
    if not path.is_file():
        pytest.skip(f"KubeRay {pin['version']} RayJob CRD not here ({path}; it comes from {pin['crd_url']})")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == pin["crd_sha256"], (
        f"{path} is not KubeRay {pin['version']}'s CRD"
    )
    return data.decode()


def strict(schema: dict) -> dict:
    """A CRD's structural schema as JSON Schema, as strict as kubectl's field validation."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in out:
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    return out


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(_crd_text())
    pin = multinode.facts()["kuberay"]
    group, version = pin["api_version"].split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == "RayJob"
    served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
    schema = strict(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's, not the CRD's
    return jsonschema.Draft7Validator(schema)


def _plan(profile="mtp-detach"):
    return plan_for(manifest.load(), profile, None)  # with lock.yaml's versions: rayVersion is set


def _errors(validator, doc) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize(
    "layout",
    [
        multinode.Layout(nodes=1),
        multinode.Layout(nodes=2, nccl_socket_ifname="eth0", gloo_socket_ifname="eth0", ib_hca="mlx5_0"),
        multinode.Layout(nodes=8, gpus_per_node=4, rollout_nodes=4),
    ],
)
def test_rayjob_is_valid_against_the_pinned_crd(validator, layout):
    doc = rayjob(_plan(), "rl", ImageRef("ghcr.io", "acme/mtp-verl", digest=DIGEST), layout)
    assert _errors(validator, doc) == []
    assert doc["spec"]["rayClusterSpec"]["rayVersion"] == "2.60.0"
    assert doc["apiVersion"] == multinode.facts()["kuberay"]["api_version"]


def test_the_crd_check_can_fail(validator):
    doc = rayjob(
        _plan(), "rl", ImageRef("ghcr.io", "acme/mtp-verl", digest=DIGEST), multinode.Layout(nodes=2)
    )
    bad = copy.deepcopy(doc)
    bad["spec"]["rayClusterSpec"]["workerGroupSpec"] = bad["spec"]["rayClusterSpec"].pop("workerGroupSpecs")
    assert any("workerGroupSpec" in e for e in _errors(validator, bad))
    bad = copy.deepcopy(doc)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "one"
    assert any("replicas" in e for e in _errors(validator, bad))
    bad = copy.deepcopy(doc)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 8  # strings only
    assert any("num-gpus" in e for e in _errors(validator, bad))
