"""The SBOM (mtpimage/assembly/sbom.py): valid CycloneDX 1.5 by the official schema (the one
cyclonedx-python-lib ships, read offline), exactly the lock's set for a profile, the same
bytes for the same plan, patches and compiled extensions where CycloneDX puts them; and
the OCI artifact that attaches it (sbomattach.py) against an in-memory registry."""

from __future__ import annotations

import hashlib
import json

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from mtpimage.assembly import sbom
from mtpimage.assembly.recipe import recipe_of
from mtpimage.assembly.render import render
from mtpimage.assembly.sbom import BuiltWheel
from mtpimage.commands.load import load, plan_for
from mtpimage.imageref import Registry
from mtpimage.publish import sbomattach
from tests.unit.helpers import REPO, run_main

PROFILE = "mtp-detach"  # locked, with git sources, a patched wheel and compiled extensions


@pytest.fixture(scope="module")
def rendered():
    m = load()
    plan = plan_for(m, PROFILE, None)
    assert plan.locked, "the shipped lock.yaml must match the shipped manifests"
    return render(plan, m.root)


def _valid(data: bytes) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(data.decode())
    assert error is None, str(error)[:3000]


def _prop(comp: dict, name: str) -> list[str]:
    return [p["value"] for p in comp.get("properties", []) if p["name"] == f"{sbom.NS}:{name}"]


def _sha(comp: dict) -> str | None:
    return next((h["content"] for h in comp.get("hashes", []) if h["alg"] == "SHA-256"), None)


def _wheels(rendered, known: bool) -> dict:
    return {
        e["name"]: BuiltWheel(
            e["key"], *((f"{e['name']}-{e['version']}-cp312-x.whl", "ab" * 32) if known else ())
        )
        for e in rendered.extensions
    }


def test_the_document_validates_against_the_cyclonedx_schema(rendered):
    for known in (False, True):
        _valid(sbom.dumps(sbom.document(rendered.recipe, rendered.identity, _wheels(rendered, known))))


def test_an_unlocked_and_a_substituted_plan_validate_too(tmp_path):
    m = load(REPO / "tests" / "manifests")
    for name in m.names():
        plan = plan_for(m, name, None, omit=())
        assert not plan.locked
        _valid(sbom.dumps(sbom.document(recipe_of(plan), "x")))
    real = load()
    sub = plan_for(real, PROFILE, None, base="stand-in/base:1@sha256:" + "0" * 64, omit=("apex",))
    doc = sbom.document(recipe_of(sub), "x")
    _valid(sbom.dumps(doc))
    assert "apex" not in {c["name"] for c in doc["components"]}
    subs = [p["value"] for p in doc["metadata"]["properties"] if p["name"] == f"{sbom.NS}:substitution"]
    assert any(s.startswith("base_image: ") for s in subs) and any("apex==" in s for s in subs), subs
    assert doc["components"][0]["purl"].startswith("pkg:oci/base@sha256%3A" + "0" * 64)


def test_it_lists_exactly_the_locks_set(rendered):
    plan = rendered.plan
    doc = sbom.document(rendered.recipe, rendered.identity, _wheels(rendered, True))
    comps = doc["components"]
    built = {canonicalize_name(p.name): p for p in plan.packages if p.build}
    git = [c for c in plan.components if c.source == "git"]

    # every locked wheel file: name, version, sha256, and each layer that installs it
    rows = [r for r in plan.locked if r.file]
    expected = {(canonicalize_name(r.name), r.version, r.sha256) for r in rows}
    listed = {
        (canonicalize_name(c["name"]), c["version"], _sha(c))
        for c in comps
        if c["purl"].startswith("pkg:pypi/") and canonicalize_name(c["name"]) not in built
    }
    assert listed == expected
    for r in rows:
        (comp,) = [
            c
            for c in comps
            if (canonicalize_name(c["name"]), c["version"], _sha(c))
            == (canonicalize_name(r.name), r.version, r.sha256)
        ]
        assert r.layer in _prop(comp, "layer") and _prop(comp, "file") == [r.file], (r, comp)
        assert PackageURL.from_string(comp["purl"]).qualifiers["file_name"] == r.file
        shipped = any(not x.startswith("build:") for x in _prop(comp, "layer"))
        assert comp["scope"] == ("required" if shipped else "excluded"), comp
    # the locked rows without a file are exactly the compiled extensions
    assert {canonicalize_name(r.name) for r in plan.locked if not r.file} == set(built)

    # every git source by commit, every compiled extension, the base; nothing else
    commits = {_prop(c, "git:commit")[0]: c for c in comps if _prop(c, "git:commit")}
    assert set(commits) == {c.commit for c in git}
    for c in git:
        assert commits[c.commit]["name"] == c.package
        assert {"type": "vcs", "url": c.repo} in commits[c.commit]["externalReferences"]
    exts = [c for c in comps if _prop(c, "wheel_key")]
    assert {canonicalize_name(c["name"]) for c in exts} == set(built)
    bases = [c for c in comps if c["type"] == "container"]
    assert [b["version"] for b in bases] == [plan.base_digest]
    assert len(comps) == len(expected) + len(git) + len(built) + 1
    assert len({c["bom-ref"] for c in comps}) == len(comps)


def test_purls_parse_and_name_what_they_describe(rendered):
    doc = sbom.document(rendered.recipe, rendered.identity, _wheels(rendered, True))
    for c in doc["components"]:
        purl = PackageURL.from_string(c["purl"])
        if purl.type == "pypi":
            assert (purl.name, purl.version) == (canonicalize_name(c["name"]), c["version"])
        elif purl.type == "github":
            assert purl.version == _prop(c, "git:commit")[0]
        else:
            assert purl.type == "oci" and purl.version == rendered.plan.base_digest


def test_compiled_extensions_carry_their_source_and_their_wheel(rendered):
    plan = rendered.plan
    unknown = {
        c["name"]: c for c in sbom.document(recipe_of(plan), "x", _wheels(rendered, False))["components"]
    }
    known = {c["name"]: c for c in sbom.document(recipe_of(plan), "x", _wheels(rendered, True))["components"]}
    for pkg in (p for p in plan.packages if p.build):
        (ancestor,) = unknown[pkg.name]["pedigree"]["ancestors"]
        if pkg.build.source == "sdist":
            assert _sha(ancestor) == pkg.build.sha256
            assert {"type": "distribution", "url": pkg.build.url} in ancestor["externalReferences"]
        else:
            assert ancestor["version"] == pkg.build.commit
        assert "hashes" not in unknown[pkg.name] and _prop(unknown[pkg.name], "file")[0].startswith("unknown")
        assert _sha(known[pkg.name]) == "ab" * 32
        wheel = _wheels(rendered, True)[pkg.name].filename
        assert _prop(known[pkg.name], "file") == [wheel]
        assert PackageURL.from_string(known[pkg.name]["purl"]).qualifiers["file_name"] == wheel
        assert _prop(known[pkg.name], "wheel_key") == [
            dict((e["name"], e["key"]) for e in rendered.extensions)[pkg.name]
        ]


def test_patches_are_the_patched_components_pedigree(rendered):
    plan = rendered.plan
    doc = sbom.document(rendered.recipe, rendered.identity)
    by_name = {canonicalize_name(c["name"]): c for c in doc["components"]}
    patched = [c for c in plan.components if c.patches]
    assert patched, "the profile should carry a patch"
    for c in patched:
        comp = by_name[canonicalize_name(c.package)]
        assert len(comp["pedigree"]["patches"]) == len(c.patches)
        for p, entry in zip(c.patches, comp["pedigree"]["patches"]):
            assert p.base in entry["diff"]["url"] and p.head in entry["diff"]["url"]
            assert entry["resolves"][0]["source"]["url"] == p.url
            assert _prop(comp, f"patch:{p.name}:sha256") == [p.sha256]
    unpatched = [c for c in doc["components"] if "patches" in c.get("pedigree", {})]
    assert len(unpatched) == len(patched)


def test_same_plan_same_bytes_and_another_plan_another_serial(rendered):
    m = load()
    a = sbom.for_rendered(rendered)
    again = render(plan_for(m, PROFILE, None), m.root)
    assert sbom.for_rendered(again) == a
    assert b"timestamp" not in a
    other = render(plan_for(m, PROFILE, ["megatron-lm.commit=" + "1" * 40]), m.root)
    b = sbom.for_rendered(other)
    serial = json.loads(a)["serialNumber"]
    assert serial != json.loads(b)["serialNumber"]
    body = json.loads(a)
    del body["serialNumber"]
    h = hashlib.sha256(sbom.dumps(body)).digest()[:16]
    assert serial.removeprefix("urn:uuid:").replace("-", "")[:8] == h.hex()[:8]


def test_the_cli_prints_and_writes_the_same_document(rendered, tmp_path):
    env = {"MTP_CACHE_DIR": str(tmp_path / "cache")}
    printed = run_main("sbom", "--profile", PROFILE, env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.encode() == sbom.for_rendered(rendered)
    out = tmp_path / "x" / "s.cdx.json"
    wrote = run_main("sbom", "--profile", PROFILE, "--out", str(out), env=env)
    assert wrote.returncode == 0 and out.read_bytes() == printed.stdout.encode()
    assert f"{len(json.loads(out.read_bytes())['components'])} components" in wrote.stdout


def test_known_wheels_come_from_the_wheel_cache(rendered, tmp_path, monkeypatch):
    from mtpimage.ext.wheelcache import WheelCache
    from tests.fixtures.wheels import make_wheel

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path))
    first = rendered.extensions[0]
    entry = WheelCache().put(first["key"], make_wheel(tmp_path / "src"), {"built_by": "test"})
    wheels = sbom.known_wheels(rendered)
    assert wheels[first["name"]] == BuiltWheel(first["key"], entry.filename, entry.sha256)
    assert all(w.sha256 is None for n, w in wheels.items() if n != first["name"])


# ----------------------------------------------------------------------------- the artifact
class FakeRegistry:
    """The registry API calls sbomattach makes, in memory; `referrers_api` as a registry
    with (True) or without (False, distribution 2.8) the OCI 1.1 referrers API."""

    def __init__(self, referrers_api: bool):
        self.registry = Registry("127.0.0.1:1", "ns")
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}  # tag or digest -> bytes
        self.referrers_api = referrers_api

    def manifest(self, repository, reference, accept=None):
        body = self.manifests.get(reference)
        return None if body is None else (body, "sha256:" + hashlib.sha256(body).hexdigest())

    def manifest_digest(self, repository, tag):
        got = self.manifest(repository, tag)
        return got and got[1]

    def blob_exists(self, repository, digest):
        return digest in self.blobs

    def upload_blob(self, repository, digest, body):
        assert digest == "sha256:" + hashlib.sha256(body).hexdigest()
        self.blobs[digest] = body

    def put_manifest(self, repository, reference, body, media_type):
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.manifests[reference] = self.manifests[digest] = body
        return digest

    def delete_manifest(self, repository, digest):
        body = self.manifests.get(digest)
        for ref in [r for r, b in self.manifests.items() if b == body]:
            del self.manifests[ref]
        return True

    def referrers(self, repository, digest):
        if not self.referrers_api:
            return None
        return [
            json.loads(b)
            for b in self.manifests.values()
            if json.loads(b).get("subject", {}).get("digest") == digest
        ]


def _image(reg: FakeRegistry) -> str:
    body = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    ).encode()
    return reg.put_manifest("mtp-verl", "img", body, "")


def test_the_artifact_names_the_image_as_its_subject_under_the_sbom_tag():
    reg = FakeRegistry(referrers_api=False)
    image = _image(reg)
    data = b'{"bomFormat": "CycloneDX"}\n'
    ref = sbomattach.attach(reg, "mtp-verl", image, data, "p.sbom.cdx.json")
    tag = "sha256-" + image.split(":")[1] + ".sbom"
    assert ref.startswith(f"127.0.0.1:1/ns/mtp-verl:{tag}@sha256:")
    m = json.loads(reg.manifests[tag])
    assert m["subject"] == {
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "digest": image,
        "size": len(reg.manifests[image]),
    }
    assert m["artifactType"] == sbomattach.MEDIA_TYPE and m["config"]["mediaType"] == sbomattach.EMPTY_TYPE
    (layer,) = m["layers"]
    assert reg.blobs[layer["digest"]] == data and layer["size"] == len(data)
    assert layer["annotations"][sbomattach.TITLE] == "p.sbom.cdx.json"
    assert reg.blobs[m["config"]["digest"]] == b"{}"
    assert sbomattach.attached(reg, "mtp-verl", image) == ref.rsplit("@", 1)[1]


def test_without_the_referrers_api_the_referrers_tag_lists_it_beside_the_others():
    reg = FakeRegistry(referrers_api=False)
    image = _image(reg)
    index_tag = "sha256-" + image.split(":")[1]
    signature = {"mediaType": sbomattach.OCI_MANIFEST, "digest": "sha256:" + "5" * 64, "size": 9}
    reg.put_manifest(
        "mtp-verl",
        index_tag,
        json.dumps(
            {"schemaVersion": 2, "mediaType": sbomattach.OCI_INDEX, "manifests": [signature]}
        ).encode(),
        "",
    )
    first = sbomattach.attach(reg, "mtp-verl", image, b"one\n", "p.sbom.cdx.json").rsplit("@", 1)[1]
    second = sbomattach.attach(reg, "mtp-verl", image, b"two\n", "p.sbom.cdx.json").rsplit("@", 1)[1]
    listed = json.loads(reg.manifests[index_tag])["manifests"]
    assert [d["digest"] for d in listed] == [signature["digest"], first, second]
    assert listed[-1]["artifactType"] == sbomattach.MEDIA_TYPE


def test_with_the_referrers_api_no_referrers_tag_is_written():
    reg = FakeRegistry(referrers_api=True)
    image = _image(reg)
    sbomattach.attach(reg, "mtp-verl", image, b"x\n", "p.sbom.cdx.json")
    assert "sha256-" + image.split(":")[1] not in reg.manifests


def test_an_image_that_is_not_there_gets_no_sbom():
    from mtpimage.errors import EnvironmentProblem

    reg = FakeRegistry(referrers_api=False)
    with pytest.raises(EnvironmentProblem, match="push the image first"):
        sbomattach.attach(reg, "mtp-verl", "sha256:" + "7" * 64, b"x\n", "p.sbom.cdx.json")


def test_detach_removes_the_artifact_and_only_its_referrers_entry():
    reg = FakeRegistry(referrers_api=False)
    image = _image(reg)
    index_tag = "sha256-" + image.split(":")[1]
    mine = sbomattach.attach(reg, "mtp-verl", image, b"x\n", "p.sbom.cdx.json").rsplit("@", 1)[1]
    sbomattach.detach(reg, "mtp-verl", image, mine)
    assert mine not in reg.manifests and index_tag not in reg.manifests
    assert "sha256-" + image.split(":")[1] + ".sbom" not in reg.manifests
    # another referrer in the index stays listed
    other = {"mediaType": sbomattach.OCI_MANIFEST, "digest": "sha256:" + "5" * 64, "size": 9}
    reg.put_manifest(
        "mtp-verl",
        index_tag,
        json.dumps({"mediaType": sbomattach.OCI_INDEX, "manifests": [other]}).encode(),
        "",
    )
    mine = sbomattach.attach(reg, "mtp-verl", image, b"y\n", "p.sbom.cdx.json").rsplit("@", 1)[1]
    sbomattach.detach(reg, "mtp-verl", image, mine)
    assert [m["digest"] for m in json.loads(reg.manifests[index_tag])["manifests"]] == [other["digest"]]
