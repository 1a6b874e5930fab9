"""What a job script pulls (issue 48): the layer format in its comments and its one echo line,
the node's enroot or Apptainer held to the version those layers need (one line and exit 1
when older), and an Apptainer SIF made in zstd where the node's Apptainer can. The scripts
run for real under bash, with srun, enroot and apptainer as stand-ins that record their
arguments."""

from __future__ import annotations

import json
import subprocess

import pytest

from mtpimage.manifests import manifest
from mtpimage.outputs.jobscripts import Layers, job_script
from mtpimage.outputs.multinode import Layout
from mtpimage.plan.model import build_plan
from mtpimage.publish.registryclient import RegistryClient

from .helpers import run_cli, run_main

DIGEST = "sha256:" + "cd" * 32
STUBS = {
    "srun": 'echo "srun $*" >> "$STUB_LOG"\n',
    "enroot": '[ "$1" = version ] && [ -n "$STUB_VERSION" ] && echo "$STUB_VERSION"\n',
    "apptainer": (
        'if [ "$1" = --version ]; then [ -n "$STUB_VERSION" ] && echo "apptainer version $STUB_VERSION"; exit; fi\n'
        'echo "apptainer $*" >> "$STUB_LOG"\n'
    ),
}


def _plan():
    m = manifest.load()
    return build_plan(m, manifest.resolve_profile(m, "mtp-detach"))


def _run(tmp_path, cluster: str, layers: Layers, version: str) -> tuple[subprocess.CompletedProcess, str]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (stubs / name).write_text("#!/bin/bash\n" + body)
        (stubs / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(job_script(_plan(), "rl", cluster, "ghcr.io", "acme/mtp-verl", DIGEST, layers=layers))
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(log), "STUB_VERSION": version}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    return proc, log.read_text() if log.exists() else ""


ZSTD = Layers("zstd", "the registry's manifest")


@pytest.mark.parametrize(
    "cluster,old,new",
    [("slurm", "3.5.0", "4.0.1"), ("apptainer", "1.3.6", "1.4.0-1.el9")],
)
def test_a_runtime_too_old_for_zstd_layers_stops_in_one_line_before_srun(tmp_path, cluster, old, new):
    proc, calls = _run(tmp_path, cluster, ZSTD, old)
    assert proc.returncode == 1, proc.stderr
    title, need = ("enroot", "4.0.0") if cluster == "slurm" else ("Apptainer", "1.4.0")
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"error: {title} {old} cannot pull this image's zstd layers: they need {title} {need} or later "
        f"(fix: install {title} {need} or later on the nodes, or publish the image with --compression gzip "
        "and generate this script again)"
    )
    assert calls == ""  # nothing pulled, no step started
    proc, calls = _run(tmp_path, cluster, ZSTD, new)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"job image: {'ghcr.io#acme' if cluster == 'slurm' else 'docker://ghcr.io/acme'}/mtp-verl@{DIGEST} "
        in (proc.stderr)
    )
    assert f"(zstd layers; {title} {new.split('-')[0]} on this node)" in proc.stderr
    assert "srun " in calls


def test_gzip_layers_or_an_unreadable_version_never_stop_the_job(tmp_path):
    proc, calls = _run(tmp_path, "slurm", Layers("gzip", "--compression"), "2.0.0")
    assert proc.returncode == 0 and "(gzip layers; enroot 2.0.0 on this node)" in proc.stderr
    proc, calls = _run(tmp_path, "slurm", ZSTD, "")  # `enroot version` says nothing
    assert proc.returncode == 0 and "srun --container-image=" in calls
    assert proc.stderr.startswith(
        "warning: cannot read this node's enroot version (enroot version); this image's zstd layers "
        "need enroot 4.0.0 or later\n"
    )


@pytest.mark.parametrize(
    "version,made",
    [
        ("1.4.0", "apptainer build --mksquashfs-args -comp zstd -Xcompression-level 3 -b 1M "),
        ("1.3.6", "apptainer pull "),
        ("", "apptainer pull "),
    ],
)
def test_the_apptainer_sif_is_zstd_where_the_node_can_make_one(tmp_path, version, made):
    proc, calls = _run(tmp_path, "apptainer", Layers("gzip", "--compression"), version)
    assert proc.returncode == 0, proc.stderr
    first = calls.splitlines()[0]
    sif = f"mtp-verl-mtp-detach-{'cd' * 6}.sif"
    assert first == f"{made}{sif} docker://ghcr.io/acme/mtp-verl@{DIGEST}"
    (tmp_path / sif).write_text("made")  # a SIF already there is used as it is
    proc, calls = _run(tmp_path, "apptainer", Layers("gzip", "--compression"), version)
    assert proc.returncode == 0 and not calls.startswith("apptainer ")


def test_the_multinode_script_checks_before_ray_starts():
    text = job_script(
        _plan(), "rl", "slurm", "ghcr.io", "acme/mtp-verl", DIGEST, Layout(nodes=2), layers=ZSTD
    )
    check = text.index("elif ! at_least 4.0.0; then")
    assert check < text.index('HEAD_IP=$(on_node "$HEAD_NODE"')
    assert "# Layers: zstd (from the registry's manifest): enroot 4.0.0 or later pulls them" in text


def test_explain_takes_compression_with_digest():
    args = [
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--registry",
        "ghcr.io/acme",
        "--digest",
        DIGEST,
    ]
    proc = run_cli(*args, "--cluster", "apptainer", "--compression", "zstd")
    assert proc.returncode == 0, proc.stderr
    assert "# Layers: zstd (from --compression): Apptainer 1.4.0 or later pulls them" in proc.stdout
    unknown = run_cli(*args, "--cluster", "slurm")
    assert (
        "# Layers: not known when this script was written (--digest without --compression)" in unknown.stdout
    )
    assert "at_least" not in unknown.stdout  # nothing to hold the node to
    bad = run_cli(*args, "--cluster", "slurm", "--compression", "lz4")
    assert bad.returncode == 2 and "--compression" in bad.stderr


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("cluster", ["slurm", "apptainer"])
@pytest.mark.parametrize("layers", [ZSTD, Layers("gzip", "--compression"), Layers()])
def test_the_scripts_are_shellcheck_clean(tmp_path, cluster, layers, nodes):
    path = tmp_path / "job.sbatch"
    text = job_script(
        _plan(), "rl", cluster, "ghcr.io", "acme/mtp-verl", DIGEST, Layout(nodes=nodes), layers=layers
    )
    path.write_text(text)
    checked = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_the_registry_manifest_names_the_layers_and_a_contrary_compression_is_refused(monkeypatch):
    manifest = {"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd"}]}
    monkeypatch.setattr(
        RegistryClient, "manifest", lambda self, repo, ref, *a, **k: (json.dumps(manifest).encode(), DIGEST)
    )
    args = [
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--cluster",
        "slurm",
        "--registry",
        "ghcr.io/acme",
    ]
    proc = run_main(*args)
    assert proc.returncode == 0, proc.stderr
    assert "# Layers: zstd (from the registry's manifest): enroot 4.0.0 or later pulls them" in proc.stdout
    assert "elif ! at_least 4.0.0; then" in proc.stdout
    bad = run_main(*args, "--compression", "gzip")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--compression: gzip: the registry's manifest of ghcr.io/acme/mtp-verl:mtp-detach-" in bad.stderr
    assert "has zstd layers (fix: leave --compression out" in bad.stderr


def test_compression_without_digest_asks_for_that_formats_own_tag(monkeypatch):
    """--compression zstd without --digest pins the zstd image: its own tag <identity>.zstd
    (assembly/formattags.py), not the gzip image under the plain tag."""
    asked: list[str] = []
    manifest = {"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd"}]}

    def got(self, repo, ref, *a, **k):
        asked.append(ref)
        return json.dumps(manifest).encode(), DIGEST

    monkeypatch.setattr(RegistryClient, "manifest", got)
    args = ["explain", "--profile", "mtp-detach", "--target", "rl", "--cluster", "slurm"]
    proc = run_main(*args, "--registry", "ghcr.io/acme", "--compression", "zstd")
    assert proc.returncode == 0, proc.stderr
    assert len(asked) == 1 and asked[0].startswith("mtp-detach-") and asked[0].endswith(".zstd"), asked
    assert f"@{DIGEST}" in proc.stdout
