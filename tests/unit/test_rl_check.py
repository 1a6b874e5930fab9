"""verl's main_ppo with SGLang rollout as an in-image check (issue 34, the RL part): the prompt
data and the reward made at test time, the run built from exactly the image's RL overrides (what
`explain --target rl` prints) plus test-size settings that touch nothing of the mode, the device
payload's integrity checks, and the mode's promises judged on recorded main_ppo logs."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from mtpimage.assembly.render import IMAGES_DIR, render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

from .helpers import run_main

CHECKS = IMAGES_DIR / "checks"
DEVICE = Path(__file__).resolve().parents[2] / "scripts" / "device"
LOGS = Path(__file__).parent / "trainer_logs"
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
RL_PROFILES = ["mtp-load-only", "mtp-full", "mtp-detach", "mtp-cp-recompute", "mtp-rollout"]


def _load(name: str, where: Path = CHECKS):
    spec = importlib.util.spec_from_file_location(name, where / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tm():
    return _load("tinymimo")


@pytest.fixture(scope="module")
def rl(tm):
    _load("trainer_check")
    return _load("rl_check")


def _rendered(profile: str) -> dict[str, bytes]:
    return render(plan_for(manifest.load(MANIFESTS), profile, None), MANIFESTS).files


# ------------------------------------------------------------------------------ data and reward
def test_the_prompts_are_in_verls_rl_format_and_the_model_folder_is_what_sglang_reads(tm, tmp_path):
    import pyarrow.parquet as pq

    model = tm.make(tmp_path)
    rows = pq.read_table(tmp_path / "data" / "rl.parquet").to_pylist()
    assert len(rows) == tm.RL_ROWS
    first = rows[0]
    # RLHFDataset reads data.prompt_key (prompt) as chat messages; the reward manager reads
    # data_source and reward_model.ground_truth (verl/experimental/reward_loop/reward_manager/naive.py)
    assert first["prompt"] == [{"role": "user", "content": "What is zero plus three?"}]
    assert first["reward_model"]["ground_truth"] == "zero plus three is three."
    assert first["data_source"] == tm.RL_SOURCE and first["extra_info"]["index"] == 0
    config = json.loads((model / "config.json").read_text())
    # SGLang serves MiMoForCausalLM and renames it MiMoMTP as the EAGLE draft (model_config.py)
    assert config["architectures"] == ["MiMoForCausalLM"]
    gen = json.loads((model / "generation_config.json").read_text())
    assert gen["eos_token_id"] == config["eos_token_id"] and set(gen) == {
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    }


def test_the_reward_is_graded_so_grpo_has_advantages_on_a_random_model():
    reward = _load("rl_reward")
    truth = "two plus three is five."
    exact = reward.compute_score(data_source="s", solution_str=truth, ground_truth=truth, extra_info={})
    assert exact == {"score": 1.0, "exact": 1.0}
    near = reward.compute_score("s", "two plus three is six.", truth)
    far = reward.compute_score("s", "zzzz", truth)
    assert 0.0 <= far["score"] < near["score"] < 1.0 and near["exact"] == 0.0
    # verl calls it with keywords and extra ones for reward models (naive.py run_single)
    assert reward.compute_score(
        data_source="s", solution_str="", ground_truth=truth, extra_info=None, reward_router_address=None
    )["score"] == pytest.approx(0.0)


# ------------------------------------------------------------------------------ the run
@pytest.mark.parametrize("profile", RL_PROFILES)
def test_the_run_uses_exactly_the_images_rl_overrides_and_only_test_size_settings_besides(
    rl, profile, tmp_path
):
    files = _rendered(profile)
    lines = files["mtp/verl/rl.overrides"].decode().splitlines()
    explain = run_main("explain", "--profile", profile, "--target", "rl")
    assert explain.returncode == 0
    assert lines == [ln for ln in explain.stdout.splitlines() if not ln.startswith("#")]
    vector = json.loads(files["mtp/version.json"])
    assert vector["verl_overrides"]["rl"] == lines
    fitted, _ = rl.tc.fit_to_node(lines, 1)
    stand, _ = rl.tc.stand_ins(False, False, rl.ACTOR_PREFIX)
    sglang, _ = rl.rollout_settings()
    argv = rl.command(fitted, stand + sglang, tmp_path, "grpo", 3, 1)
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert argv[3 : 3 + len(fitted)] == fitted, "the image's overrides go first, as they are"
    mode_keys = {rl.tc.setting_key(ln) for ln in lines}
    ours = [rl.tc.setting_key(ln) for ln in argv[3 + len(fitted) :]]
    assert not mode_keys & set(ours), "a test-size setting would override the mode's"
    assert not [k for k in ours if ".mtp." in k], "MTP settings are the mode's alone"
    assert "ray_kwargs.ray_init.runtime_env.py_executable" in ours  # VERL_USE_UV=0: plain python3
    assert f"reward.custom_reward_function.path={CHECKS / 'rl_reward.py'}" in argv


def test_the_expectation_comes_from_the_version_vector(rl):
    def expect(profile):
        return rl.Expect.of(json.loads(_rendered(profile)["mtp/version.json"]))

    assert expect("mtp-rollout") == rl.Expect(trains_mtp=True, speculative=True)
    assert expect("mtp-detach") == rl.Expect(trains_mtp=True, speculative=False)
    assert expect("mtp-load-only") == rl.Expect(trains_mtp=False, speculative=False)


def test_the_image_checks_run_main_ppo_where_the_image_has_sglang(tmp_path, monkeypatch):
    rc = _load("run_checks")
    assert rc.check_trainer(False, {"targets": ["rl"]})[0]["status"] == "skip"
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: None)
    got = rc.check_trainer(True, {"targets": ["rl"]})
    assert [(r["id"], r["status"]) for r in got] == [("trainer:rl", "skip")] and "no sglang" in got[0][
        "detail"
    ]
    monkeypatch.undo()
    report = {
        "ok": True,
        "notes": ["sglang attention_backend=fa3"],
        "results": [{"id": "speculative-rollout", "status": "pass", "detail": "spec_accept_length 1.2"}],
    }
    (tmp_path / "rl_check.py").write_text(f"import json\nprint(json.dumps({report!r}))\n")
    monkeypatch.setattr(rc, "HERE", tmp_path)
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: object())
    got = {r["id"]: r for r in rc.check_trainer(True, {"targets": ["rl"]})}
    assert got["trainer:rl:speculative-rollout"]["status"] == "pass"
    assert got["trainer:rl:notes"]["detail"] == "sglang attention_backend=fa3"


# ------------------------------------------------------------------------------ the device payload
def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel with a true RECORD (sha256 per file, urlsafe base64, as the wheel spec says)."""
    rows = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append("demo-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("demo-1.0.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


FILES = {
    "demo/__init__.py": b"X = 1\n",
    "demo-1.0.data/scripts/demo-tool": b"#!/bin/sh\n",
    "demo-1.0.dist-info/METADATA": b"Name: demo\n",
}


@pytest.mark.parametrize("kind", ["wheel", "wheel-zst"])
def test_the_device_installs_a_wheel_only_when_every_file_matches_its_record(kind, tmp_path):
    if kind == "wheel-zst" and shutil.which("zstd") is None:
        pytest.skip("zstd not installed here (the payload is made where it is)")
    pi = _load("payload_install", DEVICE)
    wheel = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES)
    carried = wheel
    if kind == "wheel-zst":
        payload = _load("trainer_payload", DEVICE)
        carried = payload.compress_wheel(wheel, tmp_path)
        assert carried.name == wheel.name + ".tar.zst"
    site = tmp_path / "site"
    assert pi.install_wheel(carried, kind, site) == (carried.name, 4)
    assert (site / "demo" / "__init__.py").read_bytes() == b"X = 1\n"
    assert (site / "bin" / "demo-tool").is_file()  # pip --target's place for *.data/scripts
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"X = 2\n" if info.filename == "demo/__init__.py" else data)
    with pytest.raises(SystemExit, match="does not match its RECORD"):
        pi.install_wheel(bad, "wheel", tmp_path / "site2")


def test_a_carried_file_must_have_the_payloads_sha256(tmp_path):
    pi = _load("payload_install", DEVICE)
    (tmp_path / "f.bin.part00").write_bytes(b"ab")
    (tmp_path / "f.bin.part01").write_bytes(b"cd")
    assert pi.reassemble(tmp_path, "f.bin", hashlib.sha256(b"abcd").hexdigest()).read_bytes() == b"abcd"
    with pytest.raises(SystemExit, match="sha256"):
        pi.reassemble(tmp_path, "f.bin", "0" * 64)
    with pytest.raises(SystemExit, match="missing"):
        pi.reassemble(tmp_path, "g.bin", "0" * 64)


def test_the_rl_closure_adds_sglangs_packages_and_leaves_the_devices_torch_stack(tmp_path):
    import yaml

    payload = _load("trainer_payload", DEVICE)
    lock = yaml.safe_load((MANIFESTS / "lock.yaml").read_text())
    pset = lock["python_sets"][lock["profiles"]["mtp-rollout"]["python_set"]]["packages"]
    device = payload.closure(pset, payload.DEVICE_HAS, ())
    sft = payload.closure(pset, payload.ROOTS, payload.NOT_ON_PATH) - device
    rl = payload.closure(pset, payload.ROOTS + payload.RL_ROOTS, ()) - device
    assert sft < rl and {"sglang", "sglang-kernel", "flashinfer-python", "flashinfer-cubin"} <= rl - sft
    assert {"ray", "transferqueue"} <= sft  # verl's trainer path reaches them without sglang
    assert not {"torch", "triton", "nvidia-cublas"} & rl


# ------------------------------------------------------------------------------ judging
def _recorded(rl, case: str):
    """A recorded rl_check run: LOGS/CASE.json holds the profile's expectation, the steps asked
    for and verl's file-logger lines (one per step) from the H200 run."""
    data = json.loads((LOGS / f"{case}.json").read_text())
    r = data["run"]
    result = rl.RlResult(
        r["name"], r["rc"], r["seconds"], tuple(r["metrics"]), r.get("gpu_peak_mib"), r.get("log_tail", "")
    )
    return rl.Expect(**data["expect"]), result, data["steps"]


def _verdicts(rl, case):
    expect, result, steps = _recorded(rl, case)
    return {f.id: f for f in rl.judge(expect, result, steps)}


RECORDED = sorted(p.stem for p in LOGS.glob("rl-*.json"))


@pytest.mark.parametrize("case", RECORDED)
def test_the_promises_judged_on_recorded_main_ppo_logs(rl, case):
    data = json.loads((LOGS / f"{case}.json").read_text())
    verdicts = _verdicts(rl, case)
    assert {k for k, f in verdicts.items() if f.status == "fail"} == set(data["failing"]), verdicts


def test_a_crashed_run_fails_with_its_error_line(rl):
    expect = rl.Expect(trains_mtp=True, speculative=True)
    tail = "Traceback (most recent call last):\n  File x\nValueError: Total available GPUs 0 is less than total desired GPUs 1\n"
    got = rl.judge(expect, rl.RlResult("grpo", 1, 12.0, (), None, tail), 3)
    assert [(f.id, f.status) for f in got] == [("run", "fail")]
    assert got[0].detail.endswith("ValueError: Total available GPUs 0 is less than total desired GPUs 1")


def test_carries_pack_split_parts_and_small_files_into_as_few_calls_as_fit():
    payload = _load("trainer_payload", DEVICE)
    mib = 2**20
    limit = 58 * mib
    sizes = {"big.tar.zst": 139 * mib, "mid.tar.zst": 40 * mib, "a": 15 * mib, "b": 3 * mib}
    bins = payload.pack(sizes, limit)
    # 197 MiB need 4 carries of 58; a split file's last part shares a carry with small files
    assert len(bins) == 4
    for group in bins:
        assert sum(p.end - p.start + payload.TAR_MEMBER for p in group) + payload.TAR_END <= limit
    parts = sorted((p for g in bins for p in g if p.file == "big.tar.zst"), key=lambda p: p.part)
    assert [p.name for p in parts] == ["big.tar.zst.part00", "big.tar.zst.part01", "big.tar.zst.part02"]
    assert parts[0].start == 0 and parts[-1].end == sizes["big.tar.zst"]
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    whole = {p.name for g in bins for p in g if p.part is None}
    assert whole == {"mid.tar.zst", "a", "b"}


def test_the_recorded_logs_fail_each_promise_somewhere_and_pass_it_somewhere(rl):
    # from the real H200 runs: a promise that no recorded case can fail would be a test that
    # cannot fail
    assert len(RECORDED) >= 6
    failed, passed = set(), set()
    for case in RECORDED:
        for k, f in _verdicts(rl, case).items():
            (failed if f.status == "fail" else passed).add(k)
    promises = {"steps-logged", "speculative-rollout", "plain-rollout", "mtp-loss-logged", "no-mtp-loss"}
    assert promises <= failed and promises - {"no-mtp-loss"} <= passed


def test_the_device_installs_the_images_compiled_wheels_over_the_locks(tmp_path, capsys):
    pi = _load("payload_install", DEVICE)
    stage = tmp_path / "stage"
    stage.mkdir()
    lock_wheel = _wheel(stage / "demo-1.0-py3-none-any.whl", FILES)
    ext = _wheel(
        stage / "demo_ext-1.0-cp312-cp312-linux_x86_64.whl", {**FILES, "demo/__init__.py": b"X = 'ext'\n"}
    )
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (lock_wheel, ext)}
    items = [{"file": lock_wheel.name, "kind": "wheel"}, {"file": ext.name, "kind": "ext-wheel"}]
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"sha256": sha, "items": items}))
    assert pi.main([str(payload), str(stage), str(tmp_path / "site")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ext_wheels"] == [ext.name] and report["wheel_files_checked"] == 8
    assert (tmp_path / "site" / "demo" / "__init__.py").read_bytes() == b"X = 'ext'\n"
