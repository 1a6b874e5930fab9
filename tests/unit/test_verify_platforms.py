"""`verify` of a multi-arch index walks its platforms, each against the plan with that
builds.platform (commands/verify.py), and one image is verified on the manifest read once.
The rebuilds themselves are faked here; tests/e2e/test_multiarch_e2e.py verifies a real index."""

from __future__ import annotations

from mtpimage import cli
from mtpimage.assembly import verify
from mtpimage.commands import verify as verify_cmd
from mtpimage.imageref import ImageRef

INDEX = "127.0.0.1:1/ns/mtp-verl@sha256:" + "1" * 64
AMD64 = "127.0.0.1:1/ns/mtp-verl@sha256:" + "a" * 64
ARM64 = "127.0.0.1:1/ns/mtp-verl@sha256:" + "b" * 64


def _fake(monkeypatch, targets):
    calls = []
    monkeypatch.setattr(verify, "per_platform", lambda image, platform: targets(platform))
    monkeypatch.setattr(
        verify_cmd,
        "_verify_one",
        lambda _v, _m, plan, image, _args, read=None: calls.append((plan.platform, image, read)) or 0,
    )
    return calls


def _index(platform):
    listed = [("linux/amd64", AMD64), ("linux/arm64", ARM64)]
    return INDEX, [e for e in listed if platform in (None, e[0])]


def test_an_index_is_verified_platform_by_platform_each_against_its_own_plan(monkeypatch, capsys):
    calls = _fake(monkeypatch, _index)
    assert cli.main(["verify", "--profile", "mtp-detach", "--image", INDEX]) == 0
    assert calls == [("linux/amd64", AMD64, None), ("linux/arm64", ARM64, None)]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"platform linux/amd64: {AMD64} (listed by the index {INDEX})"
    assert out[-1].startswith(
        "identical: every platform the index lists was checked (linux/amd64, linux/arm64)"
    )


def test_platform_picks_one_entry_of_the_index(monkeypatch, capsys):
    calls = _fake(monkeypatch, _index)
    assert cli.main(["verify", "--profile", "mtp-detach", "--image", INDEX, "--platform", "linux/arm64"]) == 0
    assert calls == [("linux/arm64", ARM64, None)]
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"identical: linux/arm64 of {INDEX}")


def test_one_image_is_verified_on_the_manifest_already_read(monkeypatch):
    read = verify.ManifestRead(ImageRef.parse(AMD64, flag="--image"), b"{}", "sha256:" + "a" * 64)
    calls = _fake(monkeypatch, lambda platform: read)
    assert cli.main(["verify", "--profile", "mtp-detach", "--image", AMD64]) == 0
    assert calls == [("linux/amd64", AMD64, read)]
