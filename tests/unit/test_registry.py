"""The one registry / image-reference model: parsing tables, docker.io defaults, http for
loopback, and the pull strings every printer (CLI, job summary, cluster scripts) shares."""

from __future__ import annotations

import pytest

from mtpimage.errors import InputError
from mtpimage.imageref import ImageRef, Registry
from mtpimage.outputs import workflow

D = "sha256:" + "c" * 64


@pytest.mark.parametrize(
    "text, host, namespace, url",
    [
        ("127.0.0.1:5000/mtp", "127.0.0.1:5000", "mtp", "http://127.0.0.1:5000"),
        ("127.0.0.1:5000", "127.0.0.1:5000", "", "http://127.0.0.1:5000"),
        ("localhost:5000/a/b", "localhost:5000", "a/b", "http://localhost:5000"),
        ("localhost/team", "localhost", "team", "http://localhost"),
        ("ghcr.io/my-org", "ghcr.io", "my-org", "https://ghcr.io"),
        ("ghcr.io/org/team/", "ghcr.io", "org/team", "https://ghcr.io"),
        (
            "registry.example.com:8443/ml_team",
            "registry.example.com:8443",
            "ml_team",
            "https://registry.example.com:8443",
        ),
        ("docker.io/acme", "docker.io", "acme", "https://registry-1.docker.io"),
        ("Registry.Example.com/acme", "Registry.Example.com", "acme", "https://Registry.Example.com"),
    ],
)
def test_registry_parse_table(text, host, namespace, url):
    reg = Registry.parse(text)
    assert (reg.host, reg.namespace, reg.base_url) == (host, namespace, url)
    assert reg.insecure == url.startswith("http:")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "noport",
        "noport/ns",
        "host:5000/UPPER",
        "https://ghcr.io/ns",
        "ghcr.io/ns;rm",
        "ghcr.io//ns",
        "ghcr.io/{owner}",
        "-bad.io/ns",
    ],
)
def test_registry_parse_rejects(bad):
    with pytest.raises(InputError) as exc:
        Registry.parse(bad)
    assert "HOST[:PORT]/NAMESPACE" in exc.value.one_line()


def test_owner_placeholder_only_where_asked():
    assert Registry.parse("ghcr.io/{owner}/x", owner_placeholder=True).namespace == "{owner}/x"


@pytest.mark.parametrize(
    "text, host, path, tag, digest, explicit",
    [
        ("ubuntu", "docker.io", "library/ubuntu", None, None, False),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None, False),
        (
            "nvidia/cuda:13.0.2-devel-ubuntu24.04@" + D,
            "docker.io",
            "nvidia/cuda",
            "13.0.2-devel-ubuntu24.04",
            D,
            False,
        ),
        ("docker.io/nvidia/cuda:13.0.2", "docker.io", "nvidia/cuda", "13.0.2", None, True),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu", None, None, True),
        (
            "mtp-verl:mtp-detach-0123456789ab",
            "docker.io",
            "library/mtp-verl",
            "mtp-detach-0123456789ab",
            None,
            False,
        ),
        ("127.0.0.1:5000/mtp/mtp-verl:tag", "127.0.0.1:5000", "mtp/mtp-verl", "tag", None, True),
        ("localhost/x@" + D, "localhost", "x", None, D, True),
        ("ghcr.io/acme/mtp-verl", "ghcr.io", "acme/mtp-verl", None, None, True),
    ],
)
def test_image_ref_parse_table(text, host, path, tag, digest, explicit):
    ref = ImageRef.parse(text)
    assert (ref.host, ref.path, ref.tag, ref.digest, ref.explicit_host) == (host, path, tag, digest, explicit)


@pytest.mark.parametrize("bad", ["", "UPPER/x", "a b", "ghcr.io/acme/x@sha256:short", "x:", "/x"])
def test_image_ref_rejects(bad):
    with pytest.raises(InputError):
        ImageRef.parse(bad)


def test_image_ref_urls_and_printing():
    assert ImageRef.parse("ubuntu").base_url == "https://registry-1.docker.io"
    assert ImageRef.parse("127.0.0.1:5000/a/b").base_url == "http://127.0.0.1:5000"
    assert str(ImageRef.parse("127.0.0.1:5000/a/b:t").pinned(D)) == f"127.0.0.1:5000/a/b@{D}"
    assert str(Registry.parse("ghcr.io/acme").image("mtp-verl", "t")) == "ghcr.io/acme/mtp-verl:t"
    assert Registry.parse("ghcr.io/acme").ref("mtp-verl") == "ghcr.io/acme/mtp-verl"
    assert Registry.parse("127.0.0.1:5000").ref("mtp-verl", "t") == "127.0.0.1:5000/mtp-verl:t"


def test_pull_strings_by_digest():
    p = Registry.parse("127.0.0.1:5000/mtp").image("mtp-verl", digest=D).pull_strings()
    assert p == {
        "docker": f"docker pull 127.0.0.1:5000/mtp/mtp-verl@{D}",
        "pyxis": f"srun --container-image=127.0.0.1:5000#mtp/mtp-verl@{D}",
        "enroot": f"enroot import docker://127.0.0.1:5000#mtp/mtp-verl@{D}",
        "apptainer": f"apptainer pull docker://127.0.0.1:5000/mtp/mtp-verl@{D}",
    }


def test_docker_hub_goes_unnamed_for_enroot_and_pyxis():
    p = ImageRef.parse("docker.io/acme/mtp-verl").pinned(D).pull_strings()
    assert p["pyxis"] == f"srun --container-image=acme/mtp-verl@{D}"
    assert p["enroot"] == f"enroot import docker://acme/mtp-verl@{D}"
    assert p["docker"] == f"docker pull docker.io/acme/mtp-verl@{D}"


def test_cli_summary_and_cluster_script_agree():
    """The job summary (from a pushed reference) and the CLI (from the registry) print the
    same strings, and the Slurm script uses the same pyxis reference."""
    from mtpimage.manifests import manifest
    from mtpimage.outputs.jobscripts import job_script
    from mtpimage.plan.model import build_plan

    reg = Registry.parse("registry.example.com:5000/ml")
    from_cli = reg.image("mtp-verl", digest=D).pull_strings()
    from_summary = workflow.pull_strings(reg.ref("mtp-verl", "mtp-detach-0123456789ab"), D)
    assert from_cli == from_summary
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-detach"))
    script = job_script(plan, "rl", "slurm", reg.host, reg.repo_path("mtp-verl"), D)
    assert f"IMAGE='{from_cli['pyxis'].split('=', 1)[1]}'" in script


@pytest.mark.parametrize(
    "value, ok",
    [
        ("ghcr.io/{owner}", True),
        ("localhost:5000/mtp", True),
        ("nvcr.io/{owner}/images", True),
        ("ghcr.io", False),
        ("ghcr.io/ns/", False),
        ("GHCR.io/owner", False),
        ("myregistry/ns", False),
    ],
)
def test_workflow_registry_is_the_model_held_stricter(value, ok):
    if ok:
        assert str(workflow.parse_registry(value)) == value
    else:
        with pytest.raises(InputError):
            workflow.parse_registry(value)
