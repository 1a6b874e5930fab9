"""Issue 49, items 1 and 2: the GPU generations an image serves, chosen as data, and a node's
GPUs held to them before the trainer starts.

- builds.cuda_archs per profile (its file, a parent's, or `--set builds.cuda_archs=90,100`)
  over the catalogue's, in the plan's digest and the wheel keys;
- the rule extension-cuda-archs, from the arch facts of each compiled extension's pin
  (rules.yaml gpu_archs): sm_90 and sm_100 pass, an arch flash-attn 2.8.3 skips silently or
  nvcc 13.0 cannot compile fails, a pin nobody read is unknown;
- the preflight: the real images/runtime/entrypoint.sh and driver-check.sh with a stub
  nvidia-smi reporting compute capability 10.0 (a B200) against the facts rendered for the
  shipped mtp-detach with sm_90 only (refused, one line with the fix) and with sm_90 + sm_100
  (goes on); the job scripts' preflight the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly import driver
from mtpimage.assembly.render import IMAGES_DIR, render
from mtpimage.commands.load import plan_for
from mtpimage.errors import InputError
from mtpimage.ext import extensions
from mtpimage.manifests import manifest
from mtpimage.outputs import preflight
from mtpimage.plan import rules

from .helpers import REPO, copy_manifests, edit_yaml, run_main

PROFILE = "mtp-detach"  # shipped, with the three compiled extensions
ENTRYPOINT = IMAGES_DIR / "runtime" / "entrypoint.sh"
CHECK = IMAGES_DIR / "runtime" / "driver-check.sh"
B200, H200 = "NVIDIA B200", "NVIDIA H200"
BOTH = ["builds.cuda_archs=90,100"]


def _plan(sets=None, root=None, profile=PROFILE):
    m = manifest.load(root)
    return plan_for(m, profile, sets)


def _rendered(sets=None, root=None, profile=PROFILE):
    m = manifest.load(root)
    return render(plan_for(m, profile, sets), m.root)


def _known_pins(plan):
    """The plan with each git-built extension (apex: its master moves weekly) at a commit the
    arch facts record, so a bump of the shipped pin changes no test here (docs/extending.md,
    "Bump a pin"); a bumped pin nobody read is `unknown` in `check`, as it should be."""
    known = rules.facts()["gpu_archs"]["extensions"]
    packages = tuple(
        dataclasses.replace(p, build=dataclasses.replace(p.build, commit=next(iter(known[p.name]))))
        if p.build is not None and p.build.source == "git"
        else p
        for p in plan.packages
    )
    return dataclasses.replace(plan, packages=packages)


def _verdict(sets=None, root=None, profile=PROFILE, f=None):
    plan = _known_pins(_plan(sets, root, profile))
    [r] = [r for r in rules.evaluate(plan, f=f) if r.rule.id == "extension-cuda-archs"]
    return r


# ------------------------------------------------------------------------ the setting
def test_the_catalogue_serves_hopper_and_a_profile_or_set_chooses_more():
    assert _plan().cuda_archs == ("90",)
    assert _plan(BOTH).cuda_archs == ("90", "100")
    assert _plan(BOTH).digest != _plan().digest  # another image, another identity


def test_a_profile_file_sets_it_and_its_children_inherit_it(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "profiles" / "base.yaml", lambda d: d.update(builds={"cuda_archs": ["90", "100"]}))
    assert _plan(root=root).cuda_archs == ("90", "100")  # mtp-detach extends base
    edit_yaml(root / "profiles" / f"{PROFILE}.yaml", lambda d: d.update(builds={"cuda_archs": ["100"]}))
    assert _plan(root=root).cuda_archs == ("100",)
    assert _plan(BOTH, root=root).cuda_archs == ("90", "100")  # --set over every file


def test_two_arch_sets_never_share_a_wheel():
    one = {b.name: b.key for b in _rendered().recipe.builders}
    two = {b.name: b.key for b in _rendered(BOTH).recipe.builders}
    assert set(one) == set(two) == {"transformer-engine-torch", "apex", "flash-attn"}
    assert all(one[n] != two[n] for n in one)
    flash = next(b for b in _rendered(BOTH).recipe.builders if b.name == "flash-attn")
    assert "FLASH_ATTN_CUDA_ARCHS=90;100" in flash.env


@pytest.mark.parametrize(
    "sets, says",
    [
        (["builds.cuda_archs=9"], "--set: builds.cuda_archs.0: got '9', which does not match"),
        (["builds.cuda_archs=90,90"], "--set: builds.cuda_archs"),
        (["builds.max_jobs=4"], "--set: builds.max_jobs: unknown key 'max_jobs'"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(sets, says):
    with pytest.raises(InputError) as err:
        _plan(sets)
    assert err.value.one_line().startswith(says), err.value.one_line()


def test_a_bad_profile_value_names_its_file_and_line(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "profiles" / f"{PROFILE}.yaml", lambda d: d.update(builds={"cuda_archs": ["sm_100"]}))
    proc = run_main("--manifests", str(root), "check", "--profile", PROFILE)
    assert proc.returncode != 0
    [line] = proc.stderr.strip().splitlines()
    assert f"{PROFILE}.yaml:" in line and "builds.cuda_archs.0" in line and "sm_100" in line, line


# ------------------------------------------------------------------------ the rule
def test_sm_90_and_sm_100_pass_with_each_extensions_reason():
    r = _verdict(BOTH)
    assert r.status == rules.PASS, r.detail
    assert r.detail.startswith("sm_90, sm_100: ")
    assert "flash-attn 2.8.3 (SASS only)" in r.detail
    assert "apex " in r.detail and "through TORCH_CUDA_ARCH_LIST" in r.detail
    assert "transformer-engine-torch 2.12.0 (no device code)" in r.detail
    assert _verdict().status == rules.PASS


@pytest.mark.parametrize(
    "archs, says",
    [
        # flash-attn 2.8.3's setup.py turns only 80/90/100/120 into -gencode: 103 would be dropped
        ("90,103", "flash-attn 2.8.3 targets sm_80, sm_90, sm_100, sm_120 only, not sm_103"),
        ("90a", "flash-attn 2.8.3 targets sm_80, sm_90, sm_100, sm_120 only, not sm_90a"),
        # CUDA 13.0 dropped offline compilation below sm_75
        ("70,90", "nvcc of CUDA 13.0 cannot compile sm_70"),
    ],
)
def test_an_arch_an_extension_or_nvcc_cannot_target_is_refused(archs, says):
    r = _verdict([f"builds.cuda_archs={archs}"])
    assert r.status == rules.FAIL and r.rule.severity == "error"
    assert says in r.detail, r.detail


def test_check_refuses_it_in_one_line_with_the_fix():
    proc = run_main("check", "--profile", PROFILE, "--set", "builds.cuda_archs=90,103")
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if "extension-cuda-archs" in x)
    assert line.strip().startswith("ERROR extension-cuda-archs: builds.cuda_archs sm_90, sm_103: flash-attn")
    assert "fix: keep builds.cuda_archs to what every compiled extension targets" in proc.stdout


def test_a_pin_nobody_read_is_unknown_not_passed():
    r = _verdict(["flash-attn.version=2.8.4"])
    assert r.status == rules.UNKNOWN, r.detail
    assert "flash-attn 2.8.4: no record of the architectures its build targets" in r.detail
    assert r in rules.warnings([r])


def test_a_site_fact_decides_a_new_pin(tmp_path):
    root = copy_manifests(tmp_path)
    (root / "facts.yaml").write_text(
        "schema_version: 1\nfacts:\n  gpu_archs:\n    extensions:\n      flash-attn:\n"
        '        "2.8.4": {archs: ["90"], ptx: false, ref: "read its setup.py", link: "https://x.invalid"}\n'
    )
    f = rules.facts_for(root)
    assert _verdict(["flash-attn.version=2.8.4"], root, f=f).status == rules.PASS
    r = _verdict(["flash-attn.version=2.8.4", *BOTH], root, f=f)
    assert r.status == rules.FAIL and "flash-attn 2.8.4 targets sm_90 only, not sm_100" in r.detail


def test_no_compiled_extensions_is_not_applicable():
    root = REPO / "tests" / "manifests"
    assert _verdict(root=root, profile="test-detach").status == rules.NA


def test_the_facts_name_a_reason_and_a_link_for_every_pin():
    facts = rules.facts()["gpu_archs"]
    assert "100" in facts["nvcc"]["13.0"]["archs"] and "70" not in facts["nvcc"]["13.0"]["archs"]
    for name, pins in facts["extensions"].items():
        for pin, fact in pins.items():
            assert fact["archs"] in ("torch", "none") or {"90", "100"} <= set(fact["archs"]), (name, pin)
            assert fact["ref"] and fact["link"].startswith("https://") and fact["ptx"] is False
    # every compiled extension the shipped profiles build has records (at which pins: `check`)
    assert {p.name for p in extensions.built(_plan())} == set(facts["extensions"])


# ------------------------------------------------------------------------ the image's record
@pytest.mark.parametrize("sets, archs", [(None, ["90"]), (BOTH, ["90", "100"])])
def test_the_image_records_its_archs_and_the_check_reads_the_same(sets, archs):
    r = _rendered(sets)
    vector = json.loads(r.files["mtp/version.json"])
    assert {tuple(e["archs"]) for e in vector["extensions"]} == {tuple(archs)}
    facts = r.files[driver.FACTS_FILE].decode().splitlines()
    assert f"cuda_archs={' '.join(archs)}" in facts and f"profile={PROFILE}" in facts
    assert driver.compiled_archs(vector["extensions"]) == tuple(archs)


def test_an_image_without_compiled_extensions_states_no_archs():
    r = _rendered(root=REPO / "tests" / "manifests", profile="test-detach")
    assert "extensions" not in json.loads(r.files["mtp/version.json"])
    facts = r.files[driver.FACTS_FILE].decode()
    assert "cuda_archs=" not in facts and facts == driver.facts_text(driver.need(r.plan.cuda))


# ------------------------------------------------------------------------ the preflight
class Node:
    """A stub GPU node: nvidia-smi answering the driver and the compute capability queries."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.facts = root / "driver.facts"

    def gpus(self, *gpus: tuple[str, str], driver_version: str = "580.159.04", caps: bool = True):
        names = "".join(f'echo "{driver_version}, {name}"\n' for name, _ in gpus)
        cc = "".join(f'echo "{cap}"\n' for _, cap in gpus) if caps else "exit 6\n"
        smi = self.bin / "nvidia-smi"
        smi.write_text(
            "#!/bin/sh\ncase $* in\n"
            f'"--query-gpu=driver_version,name --format=csv,noheader") {names};;\n'
            f'"--query-gpu=compute_cap --format=csv,noheader") {cc};;\n'
            "*) exit 9 ;;\nesac\n"
        )
        smi.chmod(0o755)

    def image(self, sets=None, root=None, profile=PROFILE):
        """The facts file of the rendered image, as /opt/mtp/runtime/driver.facts holds it."""
        self.facts.write_bytes(_rendered(sets, root, profile).files[driver.FACTS_FILE])

    def env(self, **extra) -> dict:
        return {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "MTP_DRIVER_FACTS": str(self.facts),
            "MTP_DRIVER_PROC": str(self.root / "no-proc"),
            "MTP_NVIDIA_ENTRYPOINT": str(self.root / "none"),
            **extra,
        }

    def entry(self, *argv: str, **extra):
        return subprocess.run(
            [str(ENTRYPOINT), *argv], capture_output=True, text=True, env=self.env(**extra), timeout=60
        )


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


RAN = ("sh", "-c", "echo command ran")


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_b200_is_refused_by_an_sm_90_image_in_one_line_with_the_fix(node):
    node.gpus((B200, "10.0"), (B200, "10.0"))
    node.image()
    proc = node.entry(*RAN)
    assert proc.returncode == 1 and "command ran" not in proc.stdout
    assert _one_line(proc.stderr) == (
        "mtp driver check: GPU 0 (NVIDIA B200) has compute capability 10.0: this image's compiled "
        "extensions carry code for sm_90 only, and none of it runs on an sm_100 GPU (fix: use an "
        'image built with builds.cuda_archs including "100" (python3 build.py --profile mtp-detach '
        "--set builds.cuda_archs=90,100), or run this one on GPUs of sm_90)"
    )


def test_a_b200_runs_an_sm_90_sm_100_image(node):
    node.gpus((B200, "10.0"), (B200, "10.0"))
    node.image(BOTH)
    proc = node.entry(*RAN)
    assert proc.returncode == 0 and proc.stdout.strip() == "command ran", proc.stderr
    assert _one_line(proc.stderr).endswith(
        "forward-compatibility libraries not used; every GPU here (compute capability 10.0) has code "
        "among the image's sm_90, sm_100"
    )


@pytest.mark.parametrize("sets", [None, BOTH])
def test_an_h200_runs_either_image(node, sets):
    node.gpus((H200, "9.0"))
    node.image(sets)
    proc = node.entry(*RAN)
    assert proc.returncode == 0 and "command ran" in proc.stdout, proc.stderr
    assert "(compute capability 9.0) has code among the image's sm_90" in _one_line(proc.stderr)


@pytest.mark.parametrize(
    "archs, cap, runs",
    [
        ("100", "10.3", True),  # B300: sm_100 SASS runs on 10.x, x >= 0 (binary compatibility)
        ("90,100", "12.0", False),  # RTX PRO 6000 Blackwell: another major
        ("90", "8.0", False),  # A100: an older GPU never runs newer SASS
        ("90", "9.0", True),
        ("100", "9.0", False),
    ],
)
def test_binary_compatibility_within_a_major(node, archs, cap, runs):
    node.gpus(("NVIDIA X", cap))
    node.image([f"builds.cuda_archs={archs}"])
    proc = node.entry(*RAN)
    assert (proc.returncode == 0) is runs, proc.stderr
    if not runs:
        want = cap.split(".")[0] + "0"
        assert f'builds.cuda_archs including "{want}"' in _one_line(proc.stderr)
        assert f"--set builds.cuda_archs={archs},{want})" in proc.stderr


def test_one_gpu_the_image_cannot_run_stops_the_node_and_is_named(node):
    node.gpus((H200, "9.0"), (H200, "9.0"), (B200, "10.0"))
    node.image()
    proc = node.entry(*RAN)
    assert proc.returncode == 1
    assert _one_line(proc.stderr).startswith(
        "mtp driver check: GPU 2 (NVIDIA B200) has compute capability 10.0"
    )


def test_an_image_without_compiled_extensions_is_not_refused_on_arch_grounds(node):
    node.gpus((B200, "10.0"))
    node.image(root=REPO / "tests" / "manifests", profile="test-detach")
    proc = node.entry(*RAN)
    assert proc.returncode == 0 and "command ran" in proc.stdout, proc.stderr
    assert _one_line(proc.stderr).endswith("forward-compatibility libraries not used")  # no arch word


def test_an_unreadable_compute_capability_goes_on_and_says_so(node):
    node.gpus((B200, "10.0"), caps=False)
    node.image()
    proc = node.entry(*RAN)
    assert proc.returncode == 0 and "command ran" in proc.stdout
    assert "the GPUs' compute capability could not be read" in _one_line(proc.stderr)


def test_the_escape_hatch_goes_on_and_says_what_will_fail(node):
    node.gpus((B200, "10.0"))
    node.image()
    proc = node.entry(*RAN, MTP_SKIP_ARCH_CHECK="1")
    assert proc.returncode == 0 and "command ran" in proc.stdout
    assert (
        "GPU 0 (NVIDIA B200) is sm_100 and the image's extensions carry code for sm_90 only: going on "
        "as MTP_SKIP_ARCH_CHECK=1 asks"
    ) in _one_line(proc.stderr)
    assert node.entry(*RAN, MTP_SKIP_ARCH_CHECK="0").returncode == 1  # only 1 opens it


def test_the_compat_path_checks_the_gpu_too(node):
    node.gpus((B200, "10.0"), driver_version="575.57.08")
    node.image()
    compat = node.root / "compat"
    compat.mkdir()
    (compat / "libcuda.so.1").write_text("")
    node.facts.write_text(node.facts.read_text().replace("/usr/local/cuda/compat", str(compat)))
    proc = node.entry(*RAN)
    assert proc.returncode == 1 and "none of it runs on an sm_100 GPU" in _one_line(proc.stderr)
    node.image(BOTH)
    node.facts.write_text(node.facts.read_text().replace("/usr/local/cuda/compat", str(compat)))
    ok = node.entry(*RAN)
    assert ok.returncode == 0 and "forward-compatibility libraries are used" in ok.stderr, ok.stderr


def test_the_job_preflight_stops_the_trainer_on_a_gpu_the_image_cannot_run(node, monkeypatch):
    monkeypatch.setattr(preflight, "DRIVER_CHECK", f"{CHECK} --job --")
    monkeypatch.setattr(preflight, "LAUNCH_ENV_CHECK", "true")
    marker = node.root / "trainer-ran"
    cmd = preflight.preflighted(f"touch {marker}")
    env = {**os.environ, **node.env()}
    node.gpus((B200, "10.0"))
    node.image()
    stopped = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    assert stopped.returncode == 1 and not marker.exists()
    assert "none of it runs on an sm_100 GPU" in _one_line(stopped.stderr)
    node.image(BOTH)
    ran = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    assert ran.returncode == 0 and marker.exists(), ran.stderr


def test_the_docs_table_names_both_generations():
    text = (REPO / "docs" / "extensions-and-wheel-cache.md").read_text()
    section = text.split("## GPU architectures", 1)[1].split("\n## ", 1)[0]
    for arch in ('"90"', '"100"'):
        assert f"| `{arch}`" in section, arch
    # measured since 2026-12-06 (issue 49): the numbers and where they came from, the
    # extrapolated ones said to be, and running on a B200 said to be unverified
    assert "to be measured" not in section
    assert "### sm_100 measured here" in section and "**Extrapolated, not measured:**" in section
    assert "running sm_100 code is unverified" in section
    facts = yaml.safe_load((REPO / "mtpimage" / "data" / "rules.yaml").read_text())["facts"]
    assert "gpu_archs" in facts


# ------------------------------------------------------------------------ explain and the heads
def test_explain_names_the_gpus_the_image_serves():
    proc = run_main("explain", "--profile", PROFILE, "--target", "rl", "--set", BOTH[0])
    assert proc.returncode == 0, proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("# GPUs: ")]
    assert line.startswith(
        "# GPUs: sm_90 (compute capability 9.0: H100, H200, H20, H800, GH200), "
        "sm_100 (compute capability 10.0, 10.3: B200, GB200, B300, GB300): "
    )
    data = json.loads(run_main("explain", "--profile", PROFILE, "--target", "rl", "--json").stdout)
    assert data["cuda_archs"] == ["90"]
    bare = run_main("--manifests", "tests/manifests", "explain", "--profile", "test-detach", "--target", "rl")
    assert bare.returncode == 0 and "# GPUs: " not in bare.stdout  # no compiled extensions


def test_the_job_scripts_heads_state_the_gpus():
    from mtpimage.outputs.jobscripts import job_script

    text = job_script(_plan(BOTH), "rl", "slurm", "ghcr.io", "acme/mtp-verl", "sha256:" + "ab" * 32)
    assert (
        "# prerequisite: GPUs the image's compiled extensions carry code for: sm_90 (compute "
        "capability 9.0: H100, H200, H20, H800, GH200), sm_100 (compute capability 10.0, 10.3: "
        "B200, GB200, B300, GB300); the preflight refuses any other"
    ) in text
    assert driver.served(("120", "90a")) == (
        "sm_120 (compute capability 12.0 or a later 12.x), sm_90a (compute capability 9.0 only)"
    )


def test_diff_shows_the_architectures_of_two_images(tmp_path):
    proc = run_main("diff", PROFILE, PROFILE, "--set", BOTH[0])
    assert proc.returncode == 0, proc.stderr
    assert "cuda_archs" in proc.stdout and '["90", "100"]' in proc.stdout, proc.stdout
    vector = tmp_path / "version.json"
    vector.write_bytes(_rendered(BOTH).files["mtp/version.json"])
    same = run_main("diff", PROFILE, str(vector), "--set-a", BOTH[0])  # a profile against an image's file
    assert same.returncode == 0 and "cuda_archs" not in same.stdout, same.stdout
