"""Each compatibility rule: one plan that triggers it, one that does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpimage.manifests import manifest
from mtpimage.plan import rules
from mtpimage.plan.model import LockedRow, build_plan

from .helpers import copy_manifests, edit_yaml, run_main

BAD_018 = "ba7b5ebce12af60627a80985792a1449ce45f46c"
BAD_0182 = "571370c829ca768fe37244f4e2e7f28d8accc4ab"
GOOD_019 = "5be9626709af2722333bf54797c954c09edeada3"
ARRON_MBRIDGE = "6bf2d45a15dc4fb52d2f0c38ff546bee33447d10"


def verdicts(profile: str, sets: list[str] | None = None, root: Path | None = None) -> dict:
    m = manifest.load(root)
    plan = build_plan(m, manifest.resolve_profile(m, profile, sets))
    return {r.rule.id: r for r in rules.evaluate(plan)}


def status(profile, rule_id, sets=None, root=None) -> str:
    return verdicts(profile, sets, root)[rule_id].status


def test_every_rule_has_a_predicate_and_a_fix():
    ids = [r.id for r in rules.rules()]
    assert len(ids) == len(set(ids))
    assert {r.predicate for r in rules.rules()} == set(rules.PREDICATES)
    for r in rules.rules():
        assert r.severity in ("error", "warning")
        assert r.fix and r.message
    assert {
        "recompute-padding-mask",
        "mtp-needs-megatron-engine",
        "sglang-rollout-fix",
        "mimo-needs-bridge-2387",
        "mbridge-mcore-017",
        "python-312",
        "torch-cuda-match",
        "unpinned-ref",
        "rollout-throughput",
        "full-mode-changes-training",
    } <= set(ids)


# recompute-padding-mask -----------------------------------------------------------
@pytest.mark.parametrize("commit", [BAD_018, BAD_0182])
def test_recompute_padding_mask_triggers_on_known_bad_commits(commit):
    assert (
        status("mtp-cp-recompute", "recompute-padding-mask", [f"megatron-lm.commit={commit}"]) == rules.FAIL
    )


def test_recompute_padding_mask_passes_on_fixed_release():
    assert (
        status("mtp-cp-recompute", "recompute-padding-mask", [f"megatron-lm.commit={GOOD_019}"]) == rules.PASS
    )


def test_recompute_padding_mask_not_applicable_without_recompute():
    assert status("mtp-detach", "recompute-padding-mask", [f"megatron-lm.commit={BAD_018}"]) == rules.NA


def test_recompute_padding_mask_pypi_versions():
    bad = ["megatron-lm.source=pypi", "megatron-lm.version=0.18.2"]
    good = ["megatron-lm.source=pypi", "megatron-lm.version=0.19.2"]
    assert status("mtp-cp-recompute", "recompute-padding-mask", bad) == rules.FAIL
    assert status("mtp-cp-recompute", "recompute-padding-mask", good) == rules.PASS


def test_recompute_padding_mask_unknown_commit_is_reported_not_passed():
    r = verdicts("mtp-cp-recompute", ["megatron-lm.commit=" + "1" * 40])["recompute-padding-mask"]
    assert r.status == rules.UNKNOWN and "--probe-sources" in r.detail
    assert r in rules.warnings([r]) and not rules.errors([r])


def test_probe_verdict_overrides_known_lists():
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-cp-recompute"))
    res = rules.evaluate(plan, {"recompute-padding-mask": rules.Verdict(rules.FAIL, "probed")})
    r = next(r for r in res if r.rule.id == "recompute-padding-mask")
    assert (r.status, r.source) == (rules.FAIL, "probe")


# mtp-needs-megatron-engine ---------------------------------------------------------
def test_mtp_needs_megatron_engine(tmp_path):
    root = copy_manifests(tmp_path)
    assert status("mtp-full", "mtp-needs-megatron-engine", root=root) == rules.PASS
    edit_yaml(root / "profiles" / "mtp-full.yaml", lambda d: d.update(engine={"name": "fsdp"}))
    assert status("mtp-full", "mtp-needs-megatron-engine", root=root) == rules.FAIL


# sglang-rollout-fix ----------------------------------------------------------------
def test_sglang_rollout_fix_passes_with_vendored_patch():
    assert status("mtp-rollout", "sglang-rollout-fix") == rules.PASS


def test_sglang_rollout_fix_triggers_without_patch():
    assert status("mtp-rollout", "sglang-rollout-fix", ["sglang.patches="]) == rules.FAIL


def test_sglang_rollout_fix_triggers_on_old_sglang():
    assert status("mtp-rollout", "sglang-rollout-fix", ["sglang.version=0.5.5"]) == rules.FAIL


def test_sglang_rollout_fix_fork_commit_passes():
    sets = [
        "sglang.source=git",
        "sglang.repo=https://github.com/ArronHZG/sglang",
        "sglang.commit=99433255ca365028b6c36d892ac67ac155e3d021",
        "sglang.patches=",
        "sglang.subdir=python",
    ]
    assert status("mtp-rollout", "sglang-rollout-fix", sets) == rules.PASS


def test_sglang_rollout_fix_not_applicable_without_rollout():
    assert status("mtp-detach", "sglang-rollout-fix", ["sglang.patches="]) == rules.NA


# mimo-needs-bridge-2387 --------------------------------------------------------------
def test_mimo_needs_bridge_2387_known_good():
    assert status("mtp-detach", "mimo-needs-bridge-2387") == rules.PASS


def test_mimo_needs_bridge_2387_old_pypi_bridge_fails():
    sets = ["megatron-bridge.source=pypi", "megatron-bridge.version=0.4.2"]
    assert status("mtp-detach", "mimo-needs-bridge-2387", sets) == rules.FAIL


def test_mimo_needs_bridge_2387_not_applicable_without_mimo(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "profiles" / "mtp-detach.yaml", lambda d: d.update(models=["deepseek-v3"]))
    sets = ["megatron-bridge.source=pypi", "megatron-bridge.version=0.4.2"]
    assert status("mtp-detach", "mimo-needs-bridge-2387", sets, root) == rules.NA


# mbridge-mcore-017 ---------------------------------------------------------------------
def test_mbridge_mcore_017_arron_branch_with_new_megatron_fails():
    sets = [f"mbridge.commit={ARRON_MBRIDGE}", "mbridge.repo=https://github.com/ArronHZG/mbridge"]
    assert status("mtp-detach", "mbridge-mcore-017", sets) == rules.FAIL


def test_mbridge_mcore_017_pypi_0151_fails_with_019():
    sets = ["mbridge.source=pypi", "mbridge.version=0.15.1"]
    assert status("mtp-detach", "mbridge-mcore-017", sets) == rules.FAIL


def test_mbridge_mcore_017_arron_branch_with_old_megatron_passes():
    sets = [f"mbridge.commit={ARRON_MBRIDGE}", "megatron-lm.commit=23e092f41ec8bc659020e401ddac9576c1cfed7e"]
    assert status("mtp-detach", "mbridge-mcore-017", sets) == rules.PASS


def test_mbridge_mcore_017_default_passes():
    assert status("mtp-detach", "mbridge-mcore-017") == rules.PASS


# python-312 ----------------------------------------------------------------------------
def test_python_312(tmp_path):
    root = copy_manifests(tmp_path)
    assert status("mtp-detach", "python-312", root=root) == rules.PASS
    edit_yaml(root / "components.yaml", lambda d: d["platform"].update(python="3.10"))
    assert status("mtp-detach", "python-312", root=root) == rules.FAIL


# torch-cuda-match ----------------------------------------------------------------------
def test_torch_cuda_match_default_passes():
    assert status("mtp-detach", "torch-cuda-match") == rules.PASS


@pytest.mark.parametrize("version", ["2.11.0+cu128", "2.10.0", "2.11.0+cpu"])
def test_torch_cuda_match_mismatch_fails(version):
    # 2.10.0: a PyPI torch whose CUDA build the facts do not name
    assert status("mtp-detach", "torch-cuda-match", [f"torch.version={version}"]) == rules.FAIL


def test_pypi_torch_is_matched_by_the_facts_table_only_on_pypi(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(
        root / "components.yaml",
        lambda d: (
            d["indexes"].update({"other": "https://example.org/simple"}),
            d["packages"]["torch"].update(index="other"),
        ),
    )
    assert status("mtp-detach", "torch-cuda-match", root=root) == rules.FAIL


def test_torch_cuda_match_base_tag_mismatch_fails(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(
        root / "components.yaml", lambda d: d["platform"]["base_image"].update(tag="12.8.1-devel-ubuntu24.04")
    )
    assert status("mtp-detach", "torch-cuda-match", root=root) == rules.FAIL


# unpinned-ref ----------------------------------------------------------------------------
def test_unpinned_ref_passes_on_shipped():
    assert status("mtp-detach", "unpinned-ref") == rules.PASS


def test_unpinned_ref_base_without_digest(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "components.yaml", lambda d: d["platform"]["base_image"].pop("digest"))
    r = verdicts("mtp-detach", root=root)["unpinned-ref"]
    assert r.status == rules.FAIL and "digest" in r.detail


def test_unpinned_ref_git_source_without_commit():
    # Switching a PyPI component to git without naming a commit leaves it floating;
    # the schema catches the missing commit before the rule can.
    proc = run_main(
        "check",
        "--profile",
        "mtp-detach",
        "--set",
        "sglang.source=git",
        "--set",
        "sglang.repo=https://github.com/sgl-project/sglang",
        "--set",
        "sglang.ref=main",
    )
    assert proc.returncode == 2 and "sglang.commit" in proc.stderr


# warnings ----------------------------------------------------------------------------------
def test_rollout_throughput_warning():
    assert status("mtp-rollout", "rollout-throughput") == rules.FAIL
    assert status("mtp-detach", "rollout-throughput") == rules.NA


def test_full_mode_warning():
    assert status("mtp-full", "full-mode-changes-training") == rules.FAIL
    assert status("mtp-detach", "full-mode-changes-training") == rules.NA


def test_warnings_do_not_fail_check():
    proc = run_main("check", "--profile", "mtp-full")
    assert proc.returncode == 0
    assert "WARNING full-mode-changes-training" in proc.stdout


def _torch_plan(version: str, locked: tuple = ()):
    import dataclasses

    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-detach", [f"torch.version={version}"]))
    return dataclasses.replace(plan, locked=locked)


def _row(name: str, version: str) -> LockedRow:
    return LockedRow(name, version, "torch", "pypi", f"{name}-{version}.whl", "0" * 64)


def _torch_cuda(plan) -> rules.RuleResult:
    return next(r for r in rules.evaluate(plan) if r.rule.id == "torch-cuda-match")


@pytest.mark.parametrize(
    "version,status,needle",
    [
        ("2.10.0", rules.FAIL, "torch 2.10.0 is built for CUDA 12.8"),  # nvidia-cuda-runtime-cu12==12.8.90
        ("2.11.0", rules.PASS, "CUDA 13.0"),
        ("2.12.0", rules.PASS, "CUDA 13.0"),  # cuda-toolkit==13.0.2, like 2.11.0
        ("2.99.0", rules.UNKNOWN, "pypi_torch_cuda in mtpimage/data/rules.yaml"),
    ],
)
def test_torch_cuda_match_judges_pypi_torch_by_the_cuda_its_wheel_requires(version, status, needle):
    """#36 item 4: PyPI's torch has no +cuXYZ tag: not "a CPU or default build"."""
    r = _torch_cuda(_torch_plan(version))
    assert (r.status, needle in r.detail) == (status, True), r.detail
    assert "no +cuXYZ" not in r.detail
    assert "pypi_torch_cuda" in r.rule.fix


def test_torch_cuda_match_reads_the_locked_cuda_runtime_first():
    """A locked set says what the wheel required: a release no table knows is judged by it."""
    r = _torch_cuda(
        _torch_plan("2.99.0", (_row("cuda-toolkit", "13.0.2"), _row("nvidia-cuda-runtime", "13.0.96")))
    )
    assert r.status == rules.PASS and "the locked cuda-toolkit==13.0.2" in r.detail, r.detail
    r = _torch_cuda(_torch_plan("2.11.0", (_row("nvidia-cuda-runtime-cu12", "12.8.90"),)))
    assert r.status == rules.FAIL and "built for CUDA 12.8" in r.detail, r.detail
    r = _torch_cuda(
        _torch_plan("2.11.0", (_row("cuda-toolkit", "13.0.2"), _row("nvidia-cuda-runtime-cu12", "12.8.90")))
    )
    assert r.status == rules.FAIL and "mixes CUDA lines" in r.detail, r.detail


def test_an_inconclusive_probe_never_hides_a_known_verdict():
    """#36 item 5: sglang 0.5.12 from PyPI without its patch is a known FAIL; a probe that
    cannot decide (files moved in newer sglang) does not turn it into UNKNOWN (exit 0)."""
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-rollout", ["sglang.patches=[]"]))
    probes = {"sglang-rollout-fix": rules.Verdict(rules.UNKNOWN, "eagle_worker.py not in this sglang tree")}
    r = next(r for r in rules.evaluate(plan, probes) if r.rule.id == "sglang-rollout-fix")
    assert r.status == rules.FAIL and "the source probe was inconclusive" in r.detail, r.detail
    decided = {"sglang-rollout-fix": rules.Verdict(rules.PASS, "unwrap_ipc_tensors defined")}
    r = next(r for r in rules.evaluate(plan, decided) if r.rule.id == "sglang-rollout-fix")
    assert (r.status, r.source) == (rules.PASS, "probe")  # a decided probe still overrides


@pytest.mark.parametrize(
    "version,status",
    [("0.5.12", rules.FAIL), ("0.5.12.post1", rules.FAIL), ("0.5.17", rules.FAIL), ("0.5.18", rules.PASS)],
)
def test_mtp_rollout_warns_about_the_distributed_draft_sync(version, status):
    """#36 item 5: sglang 0.5.12-0.5.17 update_weights_from_distributed skips the draft model
    (sgl-project/sglang#27718): a warning for MTP rollout; not for profiles without rollout."""
    r = verdicts("mtp-rollout", [f"sglang.version={version}"])["sglang-distributed-draft-sync"]
    assert r.status == status and r.rule.severity == "warning", r.detail
    assert verdicts("mtp-detach")["sglang-distributed-draft-sync"].status == rules.NA


def test_the_locks_recorded_probe_verdicts_count_in_check(tmp_path):
    """#36 item 3: a commit no known list names is decided by the probe `lock` recorded for
    it: plain `check` and `--dry-run` say PASS (evidence: lock), not UNKNOWN; an edit that
    makes the lock disagree with the manifests drops them (the known lists decide again)."""
    import json
    import shutil

    from tests.unit.helpers import pin

    root = Path(shutil.copytree(manifest.load().root, tmp_path / "manifests"))
    old, new = pin("megatron-lm"), "ab" * 20  # a commit no known list names
    for name in ("components.yaml", "lock.yaml"):
        (root / name).write_text((root / name).read_text().replace(old, new))
    proc = run_main("check", "--manifests", str(root), "--profile", "mtp-cp-recompute", "--json")
    res = {r["id"]: r for r in json.loads(proc.stdout)[0]["rules"]}
    assert (res["recompute-padding-mask"]["status"], res["recompute-padding-mask"]["evidence"]) == (
        "pass",
        "lock",
    )
    assert "recorded in manifests/lock.yaml" in res["recompute-padding-mask"]["detail"]
    dry = run_main("--manifests", str(root), "--profile", "mtp-cp-recompute", "--dry-run")
    assert "UNKNOWN recompute-padding-mask" not in dry.stdout
    drifted = run_main(
        "check",
        "--manifests",
        str(root),
        "--profile",
        "mtp-cp-recompute",
        "--json",
        "--set",
        f"megatron-lm.commit={'cd' * 20}",
    )
    res = {r["id"]: r for r in json.loads(drifted.stdout)[0]["rules"]}
    assert (res["recompute-padding-mask"]["status"], res["recompute-padding-mask"]["evidence"]) == (
        "unknown",
        "known-pins",
    )


def test_mbridge_rule_does_not_pass_a_commit_it_does_not_know():
    """#36 item 3: d10f3c6b used ModelType.encoder_and_decoder and passed offline: an mbridge
    commit in no known list is UNKNOWN on megatron-core >= 0.17 (its probe decides)."""
    r = verdicts("mtp-detach", [f"mbridge.commit={'ef' * 20}"])["mbridge-mcore-017"]
    assert r.status == rules.UNKNOWN and "no known list" in r.detail, r.detail
    assert verdicts("mtp-detach")["mbridge-mcore-017"].status == rules.PASS  # the shipped pin is known good


@pytest.mark.parametrize(
    "commit,want",
    [
        ("c550cf6c41c31cd3ec72e05c25ea0c979f2b6631", rules.FAIL),  # core_v0.13.0 asserts CP == 1 with MTP
        ("ea651a3b78b9b0c1dfd83975ff28853e38e5abaa", rules.FAIL),  # core_v0.13.1
        (
            "23e00ed0963c35382dfe8a5a94fb3cda4d21e133",
            rules.PASS,
        ),  # core_v0.14.0: CP support for MTP (08abeedb)
        (GOOD_019, rules.PASS),
    ],
)
def test_mtp_with_context_parallelism_needs_megatron_core_014(commit, want):
    """#36 item 7: core_v0.13.0 with CP=2 passed every check."""
    assert status("mtp-cp-recompute", "mtp-context-parallel", [f"megatron-lm.commit={commit}"]) == want
    assert status("mtp-detach", "mtp-context-parallel") == rules.NA  # CP 1


def test_a_probe_that_probed_nothing_never_says_pass():
    """#38 item 4: asked to probe (evidence "probe"), a known-good pin whose source could not be
    read is UNKNOWN, the known list's word kept in the detail; a known FAIL still refuses."""
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-cp-recompute"))
    why = "not decided: the megatron-lm source could not be fetched (github.com unreachable)"
    probes = {"recompute-padding-mask": rules.Verdict(rules.UNKNOWN, why)}
    r = next(r for r in rules.evaluate(plan, probes) if r.rule.id == "recompute-padding-mask")
    assert r.status == rules.UNKNOWN and why in r.detail and "the known pins say: " in r.detail, r.detail
    # the lock's recorded verdicts keep the old reading: known lists decide an inconclusive one
    r = next(r for r in rules.evaluate(plan, probes, "lock") if r.rule.id == "recompute-padding-mask")
    assert r.status == rules.PASS


def test_an_unreachable_source_under_probe_sources_is_unfetched_not_passed(tmp_path, monkeypatch):
    """#38 item 4: `check --probe-sources` with github.com unreachable: every source rule is
    UNKNOWN, the source is listed as unfetched (so the exit is 3), with the mirror fix. A cache
    of its own: a patch this machine made earlier (a real-stack build) decided patches-apply."""
    from mtpimage import gitfetch
    from mtpimage.lock import probes as probes_mod
    from mtpimage.lock.sources import SourceSet

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))

    def fetch(repo, commit):
        raise gitfetch.GitError(
            repo,
            "git fetch",
            f"fatal: unable to access '{repo}/': Could not resolve host: github.com",
            commit,
        )

    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-cp-recompute"))
    ss = SourceSet(dict(plan.indexes), fetcher=fetch, keep_going=True)
    verdicts = probes_mod.probe_plan(plan, m.root, ss)
    assert verdicts and all(v.status == rules.UNKNOWN for v in verdicts.values()), verdicts
    assert set(ss.failed) >= {"megatron-lm"} and not ss.unavailable
    assert "url.<mirror>.insteadOf https://github.com/NVIDIA/Megatron-LM" in ss.failed["megatron-lm"]
    results = {r.rule.id: r for r in rules.evaluate(plan, verdicts)}
    assert results["recompute-padding-mask"].status == rules.UNKNOWN


def test_check_counts_unknown_apart_from_warnings_and_says_no_ok_over_them(capsys):
    """#38 item 5: an UNKNOWN is a rule nobody decided, not a warning."""
    from mtpimage.outputs import report

    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-cp-recompute"))
    probes = {"recompute-padding-mask": rules.Verdict(rules.UNKNOWN, "not decided: source unreachable")}
    report.print_check(plan, rules.evaluate(plan, probes), resolution=False)
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("mtp-cp-recompute: not decided (") and head.endswith(" warnings, 1 unknown)"), head
    report.print_check(plan, rules.evaluate(plan), resolution=False)
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("mtp-cp-recompute: ok (") and head.endswith(
        " 0 errors, 3 warnings)"
    )  # the CP and mtp_detach_heads hazards (issue 45), head


# patches-apply (#36 item 5) ----------------------------------------------------------
@pytest.mark.parametrize(
    "version,want", [("0.5.12", rules.PASS), ("0.5.12.post1", rules.PASS), ("0.5.13", rules.FAIL)]
)
def test_a_patch_is_judged_offline_by_the_versions_it_is_known_to_fit(version, want):
    """Without the lock's record (the pin moved) and without --probe-sources, the facts decide:
    the sglang patch fits 0.5.12 and 0.5.12.post1 only; a FAIL names both and the pin."""
    r = verdicts("mtp-detach", [f"sglang.version={version}"])["patches-apply"]
    assert (r.status, r.rule.severity) == (want, "error"), r.detail
    if want == rules.FAIL:
        assert "fits 0.5.12, 0.5.12.post1 only, not sglang 0.5.13" in r.detail, r.detail


def test_a_patch_no_fact_names_is_unknown_offline_never_pass(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(
        root / "components.yaml", lambda d: d["components"]["sglang"]["patches"][0].update(sha256="ab" * 32)
    )
    r = verdicts("mtp-detach", root=root)["patches-apply"]
    assert (
        r.status == rules.UNKNOWN and "in no known list" in r.detail and "check --probe-sources" in r.detail
    )


def test_the_locks_patch_record_decides_check(tmp_path):
    """Plain `check` on a lock that matches: each patch's verdict as `lock` applied it to the
    pinned wheel (evidence: lock), even where no fact names the patch; a record of a patch that
    did not apply, or was not checked, never passes."""
    import json
    import shutil

    import yaml

    root = Path(shutil.copytree(manifest.load().root, tmp_path / "manifests"))
    old = yaml.safe_load((root / "lock.yaml").read_text())["components"]["sglang"]["patches"][0]["sha256"]

    def rule(**record) -> dict:
        text = (root / "lock.yaml").read_text()
        doc = yaml.safe_load(text)
        doc["components"]["sglang"]["patches"][0].update(record)
        (root / "lock.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        proc = run_main("check", "--manifests", str(root), "--profile", "mtp-detach", "--json")
        return {r["id"]: r for r in json.loads(proc.stdout)[0]["rules"]}["patches-apply"]

    r = rule()
    assert (r["status"], r["evidence"]) == ("pass", "lock"), r
    assert (
        f"patch {old[:12]} applies to sglang 0.5.12 (patch --dry-run -p2 on the sglang 0.5.12 wheel)"
        in r["detail"]
    )
    # not checked at lock time: inconclusive, so the known facts decide and say so
    r = rule(applies=None, verified=False, reason="source not available to apply it to")
    assert (r["status"], r["evidence"]) == ("pass", "known-pins") and "inconclusive" in r["detail"], r
    assert "not checked: source not available" in r["detail"], r


def test_a_lock_that_records_a_misfit_patch_fails_check(tmp_path):
    """#36 items 1 and 5: a lock.yaml recording a patch that did not apply (an older tool wrote
    such locks) made plain `check` say ok, exit 0; it fails, naming the patch and the artifact."""
    import shutil

    import yaml

    root = Path(shutil.copytree(manifest.load().root, tmp_path / "manifests"))
    doc = yaml.safe_load((root / "lock.yaml").read_text())
    doc["components"]["sglang"]["patches"][0].update(applies=False, error="eagle_worker.py not in it")
    (root / "lock.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = run_main("check", "--manifests", str(root), "--profile", "mtp-detach")
    assert proc.returncode != 0, proc.stdout
    assert (
        "ERROR patches-apply" in proc.stdout
        and "does not apply to sglang 0.5.12: eagle_worker.py" in proc.stdout
    )
