"""lock, --frozen and source probes against real git repositories served on loopback.

Manifests keep the real https://github.com/... URLs; a temporary global git config
rewrites them to the loopback git daemon with url.<daemon>.insteadOf (mtpimage/demo/gitserver.py).
Nothing here fakes git.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtpimage import cli, gitfetch
from mtpimage.plan import rules
from tests.fixtures.gitrepos import advance_branch
from tests.fixtures.lock_fixtures import fast_net, serve_index, standin_manifests  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "mtp-cp-recompute"
# one fixed cutoff for locks compared byte for byte (a lock without one gets `now`)
CUTOFF = ("--exclude-newer", "2026-01-01T00:00:00Z")


def build(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=300,
    )


def test_probe_finds_broken_signature_in_unknown_commit(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    broken = fixture_repos.megatron.commits["broken"]
    known = rules.facts()["megatron"]["commits"]
    assert broken not in known  # only the probe can find it
    m = standin_manifests(
        tmp_path / "m", fixture_repos, serve_index(http_server, monkeypatch), megatron="broken"
    )

    plain = build("check", "--manifests", str(m), "--profile", PROFILE)
    assert plain.returncode == 0, plain.stdout + plain.stderr  # known lists: only "unknown"

    probed = build("check", "--manifests", str(m), "--profile", PROFILE, "--probe-sources")
    assert probed.returncode == 1, probed.stdout + probed.stderr
    assert "recompute-padding-mask" in probed.stdout
    assert "_checkpointed_forward() declares explicit parameters without padding_mask" in probed.stdout

    fixed = fixture_repos.megatron.commits["fixed"]
    ok = build(
        "check",
        "--manifests",
        str(m),
        "--profile",
        PROFILE,
        "--probe-sources",
        "--set",
        f"megatron-lm.commit={fixed}",
        "--json",
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    res = {r["id"]: r for r in __import__("json").loads(ok.stdout)[0]["rules"]}
    assert res["recompute-padding-mask"]["status"] == "pass"
    assert res["recompute-padding-mask"]["evidence"] == "probe"
    assert res["mimo-needs-bridge-2387"]["status"] == "pass"
    assert res["mimo-needs-bridge-2387"]["evidence"] == "probe"
    # the cache holds exactly-that-commit trees, keyed by repository and commit
    trees = list((fast_net / "git").glob("*/*"))
    assert any(t.name == broken for t in trees) and any(t.name == fixed for t in trees)


def test_probe_sources_keeps_going_past_a_source_that_cannot_be_fetched(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    """A pinned commit that is not upstream: the other sources are still fetched and their
    probes decided and shown; the rule needing the missing one is UNKNOWN with git's reason;
    stderr has one error line naming it; exit 3 at the end."""
    m = standin_manifests(tmp_path / "m", fixture_repos, serve_index(http_server, monkeypatch))
    absent = "1234567" * 5 + "12345"  # 40 hex, in no stand-in repository
    proc = build(
        "check",
        "--manifests",
        str(m),
        "--profile",
        PROFILE,
        "--probe-sources",
        "--set",
        f"megatron-lm.commit={absent}",
        "--json",
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    [report] = __import__("json").loads(proc.stdout)
    res = {r["id"]: r for r in report["rules"]}
    assert res["recompute-padding-mask"]["status"] == "unknown", res["recompute-padding-mask"]
    assert "could not be fetched" in res["recompute-padding-mask"]["detail"]
    assert absent[:12] in res["recompute-padding-mask"]["detail"]
    # the sources that were fetched were probed and decided
    for rid in ("mimo-needs-bridge-2387", "mbridge-mcore-017"):
        assert res[rid]["status"] == "pass" and res[rid]["evidence"] == "probe", res[rid]
    assert set(report["unfetched_sources"]) == {"megatron-lm"}
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: check --probe-sources: could not fetch megatron-lm (") and "(fix:" in line

    text = build(
        "check",
        "--manifests",
        str(m),
        "--profile",
        PROFILE,
        "--probe-sources",
        "--set",
        f"megatron-lm.commit={absent}",
    )
    assert text.returncode == 3
    assert (
        "UNKNOWN recompute-padding-mask: not decided: the megatron-lm source could not be fetched"
        in text.stdout
    )
    assert f"{PROFILE}: not decided (" in text.stdout and " unknown)" in text.stdout  # megatron-lm's rules


def test_lock_identical_upgrade_and_frozen(private_git_world, fast_net, tmp_path, http_server, monkeypatch):
    repos = private_git_world.repos
    m = standin_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    lock = m / "lock.yaml"

    first = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "NOT verified" in first.stdout and "transformer-engine" in first.stdout  # unreachable index named
    a = lock.read_bytes()
    doc = yaml.safe_load(a)
    assert doc["components"]["megatron-lm"]["verified"] is True
    assert doc["packages"]["torch"] == {"version": "2.11.0", "index": "pypi"}
    pyset = doc["python_sets"][doc["profiles"][PROFILE]["python_set"]]
    assert pyset["resolved"] is True
    # every file from a reachable index is pinned by sha256 (a plain directory listing is hashed)
    assert pyset["packages"]["sglang-kernel"]["sha256"] and pyset["packages"]["torch"]["sha256"]
    assert pyset["packages"]["torch"]["layer"] == "torch"
    assert pyset["packages"]["verl"]["source"] == "git (verl)"
    # a package from an index that answers is locked by sha256; one the tool compiles is
    # recorded by its pinned source (an unreachable index fails the lock: test_lock_hashless.py)
    assert len(pyset["packages"]["transformer-engine"]["sha256"]) == 64
    assert pyset["packages"]["flash-attn"]["source"] == "built"
    assert pyset["packages"]["flash-attn"]["built_from"]["kind"] == "sdist"

    again = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert again.returncode == 0, again.stderr
    assert lock.read_bytes() == a
    assert again.stdout.startswith("unchanged")

    old_sglang = repos.sglang.commits["with_fix"]
    new_head = advance_branch(repos.sglang, "fix_mtp_update_weights_from_tensor")
    up = build("lock", "--manifests", str(m), "--profile", PROFILE, "--upgrade", "sglang")
    assert up.returncode == 0, up.stdout + up.stderr
    after = yaml.safe_load(lock.read_bytes())
    assert after["components"]["sglang"]["commit"] == new_head != old_sglang
    changed = {k for k in doc["components"] if doc["components"][k] != after["components"][k]}
    assert changed == {"sglang"}
    for key in ("target", "base_image", "packages", "profiles", "python_sets"):
        assert after[key] == doc[key], key
    assert new_head in (m / "components.yaml").read_text()

    # frozen: the lock matches, then a hand edit of a manifest is caught by name
    ok = build("--manifests", str(m), "--profile", PROFILE, "--frozen", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    from mtpimage.lock import lockfile
    from mtpimage.manifests import manifest

    mm = manifest.load(m)
    lockfile.check_frozen(mm, cli.plan_for(mm, PROFILE, None))  # no exception
    cat = m / "components.yaml"
    cat.write_text(cat.read_text().replace(repos.verl.commits["mtp_patch"], repos.verl.commits["initial"]))
    mm = manifest.load(m)
    with pytest.raises(Exception) as exc:
        lockfile.check_frozen(mm, cli.plan_for(mm, PROFILE, None))
    assert "verl" in str(exc.value) and "drifted" in str(exc.value)
    code = cli.main(["--manifests", str(m), "--profile", PROFILE])  # the build stops before any image stage
    assert code == 2


def test_server_goes_away_mid_lock(private_git_world, fast_net, tmp_path, http_server, monkeypatch, capsys):
    repos = private_git_world.repos
    m = standin_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    assert cli.main(["lock", "--manifests", str(m), "--profile", PROFILE]) == 0
    before = (m / "lock.yaml").read_bytes()
    capsys.readouterr()

    cache = tmp_path / "cache2"
    monkeypatch.setenv("MTP_CACHE_DIR", str(cache))
    real_fetch = gitfetch.fetch
    calls = []

    def fetch_then_stop(repo, commit):
        tree = real_fetch(repo, commit)
        calls.append(repo)
        if len(calls) == 1:
            private_git_world.daemon.stop()  # the upstream goes away mid-lock
        return tree

    monkeypatch.setattr(gitfetch, "fetch", fetch_then_stop)
    code = cli.main(["lock", "--manifests", str(m), "--profile", PROFILE])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "lock.yaml left unchanged" in err and "git says" in err
    assert "github.com/" in err and "commit " in err
    assert (m / "lock.yaml").read_bytes() == before
    # only the completed tree is in the cache: no half-fetched directories
    entries = [p for p in (cache / "git").glob("*/*")]
    assert len(entries) == 1 and (entries[0] / ".git").is_dir()
    assert not [p for p in (cache / "git").glob("*/.*")]


def test_lock_holds_at_its_cutoff_while_the_index_publishes(
    private_git_world, fast_net, tmp_path, monkeypatch
):
    """#21 item 1: the index publishes a newer dependency after the lock; `lock` with unchanged
    inputs writes the same bytes, and moving the cutoff takes it and says what changed."""
    from tests.fixtures.dated_index import DatedIndex
    from tests.fixtures.lock_fixtures import PYTORCH, UNREACHABLE, WHEELHOUSE

    with DatedIndex(tmp_path / "index") as index:
        for name, version in (("torch", "2.11.0"), ("torchvision", "0.26.0"), ("torchaudio", "2.11.0")):
            index.add(name, version, "2020-01-01T00:00:00Z")
        index.add(
            "transformer-engine", "2.12.0", "2020-01-01T00:00:00Z", extras={"pytorch": [], "core-cu13": []}
        )
        index.add("sglang-kernel", "0.4.2.post2", "2020-01-01T00:00:00Z", ["mtp-demo-dep"])
        index.add("mtp-demo-dep", "1.0", "2020-06-01T00:00:00Z")
        monkeypatch.setenv(
            "MTP_INDEX_REWRITE",
            f"https://pypi.org/simple={index.url};{PYTORCH}={UNREACHABLE};{WHEELHOUSE}={UNREACHABLE}",
        )
        m = standin_manifests(tmp_path / "m", private_git_world.repos, index.url)
        lock = m / "lock.yaml"
        first = build(
            "lock", "--manifests", str(m), "--profile", PROFILE, "--exclude-newer", "2021-01-01T00:00:00Z"
        )
        assert first.returncode == 0, first.stdout + first.stderr
        assert "resolution cutoff moved: none -> 2021-01-01T00:00:00Z" in first.stdout
        a = lock.read_bytes()
        doc = yaml.safe_load(a)
        assert doc["resolution_cutoff"] == {"exclude_newer": "2021-01-01T00:00:00Z"}
        pyset = doc["python_sets"][doc["profiles"][PROFILE]["python_set"]]
        assert pyset["packages"]["mtp-demo-dep"]["version"] == "1.0"

        index.add("mtp-demo-dep", "2.0", "2022-06-01T00:00:00Z")  # published after the lock
        again = build("lock", "--manifests", str(m), "--profile", PROFILE)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.startswith("unchanged") and lock.read_bytes() == a
        assert "resolution cutoff: 2021-01-01T00:00:00Z (as recorded)" in again.stdout

        moved = build("lock", "--manifests", str(m), "--profile", PROFILE, "--exclude-newer", "now")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "resolution cutoff moved: 2021-01-01T00:00:00Z -> " in moved.stdout
        assert "changed: mtp-demo-dep 1.0 -> 2.0" in moved.stdout
        after = yaml.safe_load(lock.read_bytes())
        assert after["resolution_cutoff"]["exclude_newer"] > "2022-06-01T00:00:00Z"


def _popen_lock(m, profile, env):
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "lock",
            "--manifests",
            str(m),
            "--profile",
            profile,
            *CUTOFF,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
    )


def test_concurrent_lock_runs_are_serialised(private_git_world, fast_net, tmp_path, http_server, monkeypatch):
    """Two `lock --profile` runs at once on one manifests directory: without serialisation
    each reads the old lock.yaml and the later write drops the other's profile."""
    repos = private_git_world.repos
    url = serve_index(http_server, monkeypatch)
    other = "mtp-detach"
    seq = standin_manifests(tmp_path / "seq", repos, url)
    for prof in (PROFILE, other):
        r = build("lock", "--manifests", str(seq), "--profile", prof, *CUTOFF)
        assert r.returncode == 0, r.stdout + r.stderr
    m = standin_manifests(tmp_path / "m", repos, url)
    procs = [_popen_lock(m, prof, {}) for prof in (PROFILE, other)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    assert any("waiting for another lock run (pid " in err for _, err in outs), outs
    doc = yaml.safe_load((m / "lock.yaml").read_bytes())
    assert set(doc["profiles"]) == {PROFILE, other}
    assert (m / "lock.yaml").read_bytes() == (seq / "lock.yaml").read_bytes()
    assert not list(m.glob(".lock*")), "a temporary lock file was left next to lock.yaml"


@pytest.fixture
def tls_index(http_server, tmp_path):
    """The stand-in index's files over HTTPS with a self-signed certificate: a certificate no
    CA setting here vouches for (a proxy that intercepts TLS, a private index)."""
    import functools
    import ssl
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", "/CN=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(http_server.root))
    handler.log_message = lambda *a: None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{srv.server_address[1]}/simple"
    srv.shutdown()
    srv.server_close()


def test_an_index_behind_a_bad_certificate_names_tls_and_writes_nothing(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch, capsys, tls_index
):
    from tests.fixtures.lock_fixtures import PYPI, PYTORCH, UNREACHABLE, WHEELHOUSE

    m = standin_manifests(tmp_path / "m", private_git_world.repos, serve_index(http_server, monkeypatch))
    monkeypatch.setenv(
        "MTP_INDEX_REWRITE", f"{PYPI}={tls_index};{PYTORCH}={UNREACHABLE};{WHEELHOUSE}={UNREACHABLE}"
    )
    for var in ("MTP_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    code = cli.main(["lock", "--manifests", str(m), "--profile", PROFILE])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "TLS" in errors[0] and "certificate" in errors[0] and "MTP_CA_BUNDLE" in errors[0], errors[0]
    assert "lock.yaml left unchanged" in errors[0] and "does not resolve" not in err
    assert not (m / "lock.yaml").exists() and "wrote " not in out


def test_a_bad_certificate_only_uv_meets_names_tls_and_writes_nothing(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch, capsys, tls_index
):
    """The tester's case: the index probe passed (here: made to), uv's resolution meets the
    certificate: one line naming TLS and the CA setting, not "the stack does not resolve"
    with a lock.yaml of 0 packages written."""
    from mtpimage.lock import pydeps
    from tests.fixtures.lock_fixtures import PYPI, PYTORCH, UNREACHABLE, WHEELHOUSE

    m = standin_manifests(tmp_path / "m", private_git_world.repos, serve_index(http_server, monkeypatch))
    monkeypatch.setenv(
        "MTP_INDEX_REWRITE", f"{PYPI}={tls_index};{PYTORCH}={UNREACHABLE};{WHEELHOUSE}={UNREACHABLE}"
    )
    for var in ("MTP_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(pydeps, "probe_index", lambda url, project: None)
    code = cli.main(["lock", "--manifests", str(m), "--profile", PROFILE])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "TLS failed (invalid peer certificate" in errors[0], err
    assert "MTP_CA_BUNDLE" in errors[0] and "lock.yaml left unchanged" in errors[0]
    assert "does not resolve" not in out + err
    assert not (m / "lock.yaml").exists() and "wrote " not in out


def test_lock_lists_each_unverified_item_once(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch, capsys
):
    """A compiled extension's sdist that the (stand-in) index does not list is unverified in
    every profile that builds it: one line, not one per profile."""
    m = standin_manifests(tmp_path / "m", private_git_world.repos, serve_index(http_server, monkeypatch))
    assert cli.main(["lock", "--manifests", str(m)]) in (0, 1)
    out, err = capsys.readouterr()
    listed = [
        line
        for line in out.split("NOT verified from this machine", 1)[1].splitlines()
        if line.startswith("  - ")
    ]
    assert any("flash-attn: source flash_attn-" in line for line in listed), out  # the case this is about
    assert len(listed) == len(set(listed)), "\n".join(listed)
    assert f"{len(listed)} item(s) NOT verified" in out
