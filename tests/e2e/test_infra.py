"""The end-to-end infrastructure is real: git over loopback with url.insteadOf, stand-ins
that behave like the upstreams, the HTTP server, the registry and a BuildKit build + push."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import requests

from mtpimage.demo.gitrepos import MTP_PATH, SGLANG_FIX_PATHS, build_fixture_repos
from tests.fixtures.gitrepos import advance_branch, export_tree

ROOT = Path(__file__).resolve().parents[2]


def run_git(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """git with the caller's environment (so GIT_CONFIG_GLOBAL from git_env applies)."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


def run_python(tree: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


# ----------------------------------------------------------------------------- git


def test_shallow_fetch_of_exact_broken_commit_through_insteadof(git_env, fixture_repos, git_daemon, tmp_path):
    mega = fixture_repos.megatron
    url = "https://github.com/NVIDIA/Megatron-LM.git"
    assert ok(run_git("ls-remote", "--get-url", url)) == f"{git_daemon.url}NVIDIA/Megatron-LM.git"

    work = tmp_path / "clone"
    ok(run_git("init", "-q", str(work)))
    broken = mega.commits["broken"]
    ok(run_git("fetch", "-q", "--depth", "1", url, broken, cwd=work))
    assert ok(run_git("rev-parse", "FETCH_HEAD", cwd=work)) == broken
    assert ok(run_git("rev-parse", "--is-shallow-repository", cwd=work)) == "true"
    assert ok(run_git("rev-list", "--count", "FETCH_HEAD", cwd=work)) == "1"
    source = ok(run_git("show", f"FETCH_HEAD:{MTP_PATH}", cwd=work))
    layer = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.ClassDef) and n.name == "MultiTokenPredictionLayer"
    )
    methods = {f.name: f.args for f in layer.body if isinstance(f, ast.FunctionDef)}
    assert "padding_mask" in [a.arg for a in methods["forward"].args]
    assert "padding_mask" not in [a.arg for a in methods["_checkpointed_forward"].args]
    assert methods["_checkpointed_forward"].kwarg is None

    tags = ok(run_git("ls-remote", "--tags", url))
    assert f"{broken}\trefs/tags/core_v0.18.0-standin^{{}}" in tags
    assert f"{mega.commits['fixed']}\trefs/tags/core_v0.19.0-standin^{{}}" in tags


def test_fork_urls_reach_the_same_stand_ins(git_env, fixture_repos):
    out = ok(
        run_git("ls-remote", "https://github.com/ArronHZG/sglang.git", "fix_mtp_update_weights_from_tensor")
    )
    assert out.split()[0] == fixture_repos.sglang.commits["with_fix"]
    out = ok(run_git("ls-remote", "https://github.com/ArronHZG/mbridge", "refs/heads/feature/verl_mtp"))
    assert out.split()[0] == fixture_repos.mbridge.commits["uses_encoder_and_decoder"]
    out = ok(run_git("ls-remote", "https://github.com/volcengine/verl", "HEAD"))
    assert out.split()[0] == fixture_repos.verl.commits["mtp_patch"]


def test_commit_hashes_are_stable_across_builds(fixture_repos, tmp_path):
    again = build_fixture_repos(tmp_path / "again")
    for first, second in zip(fixture_repos.all(), again.all()):
        assert (first.commits, first.refs) == (second.commits, second.refs), first.name


def test_moved_branch_head_and_server_going_away(private_git_world, tmp_path):
    world = private_git_world
    sglang = world.repos.sglang
    url = "https://github.com/sgl-project/sglang.git"
    before = dict(sglang.refs)
    old_main = before["refs/heads/main"]

    new_main = advance_branch(sglang, "main")
    assert new_main != old_main
    assert ok(run_git("ls-remote", url, "refs/heads/main")).split()[0] == new_main
    assert (
        sglang.refs["refs/heads/fix_mtp_update_weights_from_tensor"]
        == before["refs/heads/fix_mtp_update_weights_from_tensor"]
    )
    assert ok(run_git("--git-dir", str(sglang.path), "rev-parse", f"{new_main}^")) == old_main
    # Deterministic: advancing a fresh copy gives the same commit.
    other = build_fixture_repos(tmp_path / "other")
    assert advance_branch(other.sglang, "main") == new_main

    world.daemon.stop()
    gone = run_git("ls-remote", url, timeout=30)
    assert gone.returncode != 0
    world.daemon.start()
    assert ok(run_git("ls-remote", url, "refs/heads/main")).split()[0] == new_main


# ----------------------------------------------------------------------------- stand-ins


@pytest.mark.parametrize("key, raises", [("generic", False), ("broken", True), ("fixed", False)])
def test_megatron_stand_in_recompute_behaviour(fixture_repos, tmp_path, key, raises):
    tree = export_tree(fixture_repos.megatron, fixture_repos.megatron.commits[key], tmp_path / key)
    proc = run_python(
        tree,
        """
        import inspect
        from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer
        from megatron.core.transformer.transformer_config import TransformerConfig
        layer = MultiTokenPredictionLayer(TransformerConfig(recompute_granularity="full"))
        kwargs = {"padding_mask": "pm"} if "padding_mask" in inspect.signature(layer.forward).parameters else {}
        try:
            out = layer.forward("ids", "pos", "hidden", "mask", **kwargs)
            if kwargs:
                layer._checkpointed_forward(hidden_states="hidden", attention_mask="mask", padding_mask="pm")
        except TypeError as e:
            print("TypeError:", e)
        else:
            print("ok", out)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    if raises:
        assert proc.stdout.strip() == (
            "TypeError: MultiTokenPredictionLayer._checkpointed_forward() got an "
            "unexpected keyword argument 'padding_mask'"
        )
    else:
        assert proc.stdout.strip() == "ok hidden"


def test_megatron_model_type_and_versions(fixture_repos, tmp_path):
    code = """
        import megatron.core
        from megatron.core.enums import ModelType
        print(megatron.core.__version__, hasattr(ModelType, "encoder_and_decoder"))
    """
    seen = {}
    for key in ("generic", "broken", "fixed"):
        tree = export_tree(fixture_repos.megatron, fixture_repos.megatron.commits[key], tmp_path / key)
        seen[key] = ok(run_python(tree, code))
    assert seen == {"generic": "0.16.0rc0 True", "broken": "0.18.0 False", "fixed": "0.19.0 False"}


def test_sglang_stand_in_with_and_without_fix(fixture_repos, tmp_path):
    sg = fixture_repos.sglang
    code = """
        import inspect
        import sglang
        from sglang.srt.model_executor import model_runner
        from sglang.srt.model_executor.model_runner import SharedTensor
        from sglang.srt.speculative.eagle_worker import EAGLEWorker
        t = SharedTensor([1.0])
        EAGLEWorker().update_weights_from_tensor([("w", t)])
        print(sglang.__version__, hasattr(model_runner, "unwrap_ipc_tensors"),
              "unwrap_ipc_tensors(" in inspect.getsource(EAGLEWorker.update_weights_from_tensor), t.opened)
    """
    without = export_tree(sg, sg.commits["without_fix"], tmp_path / "without")
    with_fix = export_tree(sg, sg.commits["with_fix"], tmp_path / "with")
    assert ok(run_python(without / "python", code)) == "0.5.12 False False 2"  # each runner opens it
    assert ok(run_python(with_fix / "python", code)) == "0.5.12 True True 1"

    # The fork's branch: main is its merge-base, the fix and a test on top; the fix's files
    # are exactly what manifests pin by reference (the test is left out).
    git_dir = ["--git-dir", str(sg.path)]
    assert (
        ok(run_git(*git_dir, "merge-base", "main", "fix_mtp_update_weights_from_tensor"))
        == sg.commits["without_fix"]
    )
    changed = ok(run_git(*git_dir, "diff", "--name-only", sg.commits["without_fix"], sg.commits["with_fix"]))
    assert changed.splitlines() == [*SGLANG_FIX_PATHS, "test/test_unwrap_once.py"]
    fix = run_git(
        *git_dir, "diff", sg.commits["without_fix"], sg.commits["with_fix"], "--", *SGLANG_FIX_PATHS
    ).stdout
    p = tmp_path / "fix.patch"
    p.write_text(fix)
    assert ok(run_git("apply", "--check", str(p), cwd=without)) == ""
    assert run_git("apply", "--check", str(p), cwd=with_fix).returncode != 0


def test_bridge_stand_ins(fixture_repos):
    mb, mbr = fixture_repos.mbridge, fixture_repos.megatron_bridge

    def grep(repo, rev, pattern):
        return run_git("--git-dir", str(repo.path), "grep", "-q", pattern, rev).returncode == 0

    assert grep(mb, mb.commits["uses_encoder_and_decoder"], "ModelType.encoder_and_decoder")
    assert not grep(mb, mb.commits["no_encoder_and_decoder"], "ModelType.encoder_and_decoder")

    def has_mimo(rev):
        return (
            run_git(
                "--git-dir",
                str(mbr.path),
                "cat-file",
                "-e",
                f"{rev}:megatron/bridge/models/mimo/mimo_bridge.py",
            ).returncode
            == 0
        )

    assert has_mimo(mbr.commits["with_mimo"]) and not has_mimo(mbr.commits["without_mimo"])
    assert mbr.refs["refs/tags/v0.5.0-standin"] == mbr.commits["with_mimo"]


# ----------------------------------------------------------------------------- HTTP


def test_http_server_serves_files_and_injects_failures(http_server):
    url = http_server.add_file("patches/fix.patch", "diff --git a/x b/x\n")
    r = requests.get(url, timeout=5)
    assert r.status_code == 200 and r.text == "diff --git a/x b/x\n"
    http_server.fail_next(1, 503)
    assert requests.get(url, timeout=5).status_code == 503
    assert requests.get(url, timeout=5).status_code == 200
    http_server.fail_next(1, None)
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)
    assert requests.get(http_server.url_for("missing.patch"), timeout=5).status_code == 404
    http_server.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)


# ----------------------------------------------------------------------------- docker


def test_registry_answers_v2(registry):
    r = requests.get(f"http://{registry}/v2/", timeout=5)
    assert r.status_code == 200
    assert r.headers.get("Docker-Distribution-Api-Version") == "registry/2.0"


def test_buildkit_build_install_run_and_push(docker_host, registry, fixture_repos, tmp_path):
    """A BuildKit build FROM the local base: a secret mount, an offline pip install of the
    broken Megatron stand-in, the real TypeError in a container, a push to the registry."""
    ctx = tmp_path / "ctx"
    export_tree(fixture_repos.megatron, fixture_repos.megatron.commits["broken"], ctx / "megatron")
    secret_value = f"not-in-any-layer-{uuid.uuid4().hex}"
    (tmp_path / "secret").write_text(secret_value)
    secret_sha = hashlib.sha256(secret_value.encode()).hexdigest()
    (ctx / "Dockerfile").write_text(
        textwrap.dedent(f"""\
        FROM {docker_host.base_image}
        RUN --mount=type=secret,id=token echo "{secret_sha}  /run/secrets/token" | sha256sum -c -
        COPY megatron /src/megatron
        RUN python3 -m venv --system-site-packages /opt/venv \\
         && /opt/venv/bin/pip install --no-build-isolation --no-deps --no-index --no-cache-dir /src/megatron
        """)
    )
    name = f"mtp-infra-test-{uuid.uuid4().hex[:8]}"
    tag = f"{registry}/infra/{name}:v1"
    proc = docker_host.build(ctx, tag, "--secret", f"id=token,src={tmp_path / 'secret'}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    try:
        history = docker_host.docker("history", "--no-trunc", tag).stdout
        assert secret_value not in history

        run = docker_host.docker(
            "run",
            "--rm",
            tag,
            "/opt/venv/bin/python",
            "-c",
            "import importlib.metadata as m; print(m.version('megatron-core'));"
            "from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer as L;"
            "from megatron.core.transformer.transformer_config import TransformerConfig as C;"
            "L(C(recompute_granularity='full')).forward(1, 2, 'h', 'm', padding_mask=0)",
            check=False,
        )
        assert run.returncode == 1
        assert run.stdout.strip() == "0.18.0"
        assert "unexpected keyword argument 'padding_mask'" in run.stderr

        docker_host.docker("push", tag)
        accept = ", ".join(
            [
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json",
                "application/vnd.oci.image.index.v1+json",
            ]
        )
        head = requests.head(
            f"http://{registry}/v2/infra/{name}/manifests/v1", headers={"Accept": accept}, timeout=10
        )
        assert head.status_code == 200
        assert head.headers["Docker-Content-Digest"].startswith("sha256:")
        missing = requests.head(
            f"http://{registry}/v2/infra/{name}/manifests/nope", headers={"Accept": accept}, timeout=10
        )
        assert missing.status_code == 404
    finally:
        docker_host.docker("image", "rm", "-f", tag, check=False)
