"""#37 item 5 against a real registry: a real two-platform index (linux/amd64, linux/arm64)
pushed to the session's registry is the base. `lock` records its amd64 manifest beside the
index digest; the tag pushed again with another amd64 image moves nothing (the pin is a
digest); a lock that records another amd64 manifest for the pinned index, and a mirror that
answers the pinned digest with other bytes, are refused by `check` and by the build before
anything is built. Git is the loopback stand-in world and PyPI a loopback index (lock_fixtures)."""

from __future__ import annotations

import yaml

from mtpimage import cli
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.lock_fixtures import fast_net, serve_index, standin_manifests  # noqa: F401 (fixture)
from tests.fixtures.multiarch import push_index

PROFILE = "mtp-cp-recompute"
PATH = "mtp-test/multi-platform"
TAG = "13.0.2-devel-ubuntu24.04"  # the CUDA rule reads the base's tag


def _pin_base(root, pushed) -> None:
    path = root / "components.yaml"
    cat = yaml.safe_load(path.read_text())
    cat["platform"]["base_image"] = {"name": pushed.repository, "tag": pushed.tag, "digest": pushed.digest}
    path.write_text(yaml.safe_dump(cat, sort_keys=False))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_platform_manifest_is_locked_and_a_lock_or_mirror_naming_another_is_refused(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch, registry, capsys
):
    first = push_index(registry, PATH, TAG, "first")
    amd64 = first.platforms["linux/amd64"]
    m = standin_manifests(tmp_path / "m", fixture_repos, serve_index(http_server, monkeypatch))
    _pin_base(m, first)
    lock = m / "lock.yaml"

    # lock records the manifest a linux/amd64 build pulls, beside the index digest
    code, out, err = _run(capsys, "lock", "--manifests", m, "--profile", PROFILE)
    assert code == 0, out + err
    assert yaml.safe_load(lock.read_text())["base_image"] == {
        "name": first.repository,
        "tag": TAG,
        "digest": first.digest,
        "platform": "linux/amd64",
        "manifest": "index",
        "platform_digest": amd64,
        "verified": True,
        # builds.lock_platforms names linux/arm64 too: its manifest is recorded the same way
        "platforms": {
            "linux/arm64": {
                "manifest": "index",
                "platform_digest": first.platforms["linux/arm64"],
                "verified": True,
            }
        },
    }
    assert f"linux/amd64 manifest {amd64} (index) recorded beside {first.digest}" in out
    code, out, err = _run(capsys, "check", "--manifests", m, "--profile", PROFILE)
    assert code == 0, out + err
    assert f"linux/amd64 manifest {amd64} (index): verified in registry {registry}" in out

    # the tag pushed again with another amd64 image: the pinned index is the same bytes, so
    # neither the lock nor the check moves; lock says the tag moved
    second = push_index(registry, PATH, TAG, "second")
    assert second.digest != first.digest and second.platforms["linux/amd64"] != amd64
    locked = lock.read_bytes()
    code, out, err = _run(capsys, "lock", "--manifests", m, "--profile", PROFILE)
    assert code == 0, out + err
    assert lock.read_bytes() == locked
    assert f"now names {second.digest} in registry {registry}; the pin stays {first.digest}" in out
    code, out, err = _run(capsys, "check", "--manifests", m, "--profile", PROFILE)
    assert code == 0 and f"manifest {amd64} (index): verified" in out, out + err

    # what can happen: the lock records another amd64 manifest for this pin (a merge took
    # platform_digest from a branch locked at the re-pushed tag). check and the build refuse,
    # in one line, before anything is printed or built
    lock.write_text(lock.read_text().replace(amd64, second.platforms["linux/amd64"]))
    for argv in (("check",), ()):
        code, out, err = _run(capsys, *argv, "--manifests", m, "--profile", PROFILE)
        assert code == 2, out + err
        [line] = err.strip().splitlines()
        assert line.startswith(f"error: {lock}: base_image.platform_digest: records ")
        assert f"but registry {registry} lists {amd64} (index)" in line
        assert line.endswith(f"(fix: run `python3 build.py lock --manifests {m}` and review the diff)")
        assert out == ""
    lock.write_bytes(locked)

    # a mirror that answers the pinned digest with other bytes (here: the re-pushed index)
    with FaultProxy(registry) as proxy:
        proxy.add("GET", f"/manifests/{first.digest}", f"path:/v2/{PATH}/manifests/{second.digest}", times=-1)
        code, out, err = _run(
            capsys,
            "check",
            "--manifests",
            m,
            "--profile",
            PROFILE,
            "--registry-mirror",
            f"{registry}={proxy.address}",
        )
    assert code == 3, out + err
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: base image {first.ref} through its registry mirror (MTP_REGISTRY_MIRROR")
    assert f"answered the pinned digest {first.digest} with other bytes (sha256 {second.digest})" in line
