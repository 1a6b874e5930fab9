"""The demo's manifests directory: one small profile, `demo`, pinning the stand-ins.

It is written, not shipped: the base image's digest exists only once testbase.py has pushed
it (a debootstrapped image differs per machine), and the pins are read from the stand-in
repositories just built (their named commits), so the manifests cannot name a commit the
git daemon does not serve. The catalogue is tests/manifests/'s (the same components, refs,
versions and patch; tests/unit/test_demo.py holds the two together), with one concrete
profile instead of three: MTP-only training with verl's detach_encoder, upstream's
recommendation and the shipped default's mode.

Repository URLs stay the real GitHub ones: the demo's git config sends them to the loopback
daemon (gitserver.py), as a site's config would send them to its mirror.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from mtpimage.demo.gitrepos import SGLANG_FIX_PATHS, SGLANG_FIX_SHA256, FixtureRepos
from mtpimage.demo.testbase import PushedBase

PROFILE = "demo"
COMPONENTS = ("megatron-lm", "megatron-bridge", "mbridge", "sglang", "verl")

HEADER = """\
# Written by `build.py demo` (mtpimage/demo/manifests.py) for this run only: the stand-ins
# of mtpimage/demo/gitrepos.py, served by a git daemon on loopback (the URLs stay GitHub's; the
# run's git config rewrites them), on a small Debian base pushed to a loopback registry, whose
# digest is pinned below. The real stack's catalogue is manifests/components.yaml.
"""


@dataclass(frozen=True)
class Pin:
    """One stand-in component: where it is, which named commit of the stand-in it pins."""

    name: str
    package: str
    repo: str  # owner/name on GitHub (served on loopback)
    ref: str
    commit_key: str  # a key of FixtureRepo.commits
    version: str  # what the stand-in's pyproject.toml says at that commit
    layer: str


PINS = (
    Pin(
        "megatron-lm",
        "megatron-core",
        "NVIDIA/Megatron-LM",
        "core_v0.19.0-standin",
        "fixed",
        "0.19.0",
        "megatron",
    ),
    Pin(
        "megatron-bridge",
        "megatron-bridge",
        "NVIDIA-NeMo/Megatron-Bridge",
        "v0.5.0-standin",
        "with_mimo",
        "0.5.0",
        "bridges",
    ),
    Pin("mbridge", "mbridge", "ISEEKYAN/mbridge", "main", "no_encoder_and_decoder", "0.15.2.dev0", "bridges"),
    Pin("sglang", "sglang", "sgl-project/sglang", "main", "without_fix", "0.5.12", "sglang"),
    Pin("verl", "verl", "verl-project/verl", "main", "mtp_patch", "0.9.1.dev0", "verl"),
)


def catalogue(repos: FixtureRepos, base: PushedBase) -> dict:
    """components.yaml as data."""
    by_name = {
        "megatron-lm": repos.megatron,
        "megatron-bridge": repos.megatron_bridge,
        "mbridge": repos.mbridge,
        "sglang": repos.sglang,
        "verl": repos.verl,
    }
    components = {}
    for pin in PINS:
        entry = {
            "source": "git",
            "package": pin.package,
            "repo": f"https://github.com/{pin.repo}",
            "ref": pin.ref,
            "commit": by_name[pin.name].commits[pin.commit_key],
            "version": pin.version,
        }
        if pin.name == "sglang":
            entry["subdir"] = "python"  # its package lives in python/, as upstream's does
            # the fix pinned by reference, as the shipped sglang patch is: the fork's head
            # against its merge-base, without the branch's test file
            entry["patches"] = [
                {
                    "repo": "https://github.com/ArronHZG/sglang",
                    "base": repos.sglang.commits["without_fix"],
                    "head": repos.sglang.commits["with_fix"],
                    "paths": list(SGLANG_FIX_PATHS),
                    "sha256": SGLANG_FIX_SHA256,
                    "url": "https://github.com/sgl-project/sglang/pull/17870",
                    "strip": 1,
                    "provides": ["sglang-ipc-unwrap"],
                }
            ]
        entry["layer"] = pin.layer
        components[pin.name] = entry
    return {
        "schema_version": 1,
        "platform": {
            "python": "3.12",  # the base links python3.12 to Debian's python3 (testbase.py)
            "cuda": "13.0.2",
            "base_image": {"name": base.name, "tag": base.tag, "digest": base.digest},
            "os_packages": ["ca-certificates", "git", "python3", "python3-venv", "python3-pip"],
            # the demo's base holds a stand-in of the real base's held libnccl2 (testbase.py)
            "os_remove": [
                {"package": "libnccl2", "why": "the base's held NCCL beside the lock's; one NCCL per process"}
            ],
        },
        "indexes": {"pypi": "https://pypi.org/simple"},
        "layers": ["megatron", "bridges", "sglang", "verl"],
        "packages": {},
        "components": components,
    }


def profile() -> dict:
    """profiles/demo.yaml as data."""
    return {
        "schema_version": 1,
        "name": PROFILE,
        "summary": "demo: MTP-only training (detach_encoder) on loopback stand-ins",
        "mode": "mtp-only",
        "targets": ["rl", "sft"],
        "models": ["mimo"],
        "engine": {
            "name": "megatron",
            "bridge": "megatron-bridge",
            "context_parallel_size": 1,
            "recompute": None,
        },
        "rollout": {"engine": "sglang"},
        "stack": {"components": list(COMPONENTS), "packages": []},
    }


def write(dest: Path, repos: FixtureRepos, base: PushedBase) -> Path:
    """Write the manifests directory at `dest` (created) and return it."""
    dest = Path(dest)
    (dest / "profiles").mkdir(parents=True, exist_ok=True)
    (dest / "components.yaml").write_text(HEADER + yaml.safe_dump(catalogue(repos, base), sort_keys=False))
    (dest / "profiles" / f"{PROFILE}.yaml").write_text(yaml.safe_dump(profile(), sort_keys=False))
    return dest
