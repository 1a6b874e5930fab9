#!/usr/bin/env python3
"""Benchmark on the REAL-stack images (docs/real-stack.md), against plain `docker build` of the
same rendered context, in one run.

    python3 bench/real_stack.py [--profile mtp-detach] [--reps 5] [--skip-lock]

What it measures, in this order (each case says what the plain alternative is):
  lock       `build.py lock` of every shipped profile, cold and warm caches (bench/lock_speed.py)
  cold       empty BuildKit cache (`docker builder prune -af`, pip's cache mount included):
             plain `docker build` of the rendered context, then the tool (build + checks + tag);
             the tool goes second so the cache it leaves is the one every later case uses
  push       the tool publishes the image to a loopback registry namespace of this run
  warm       no-op with the image local: the tool (its memo: mtpimage/assembly/fastpath.py), the tool's
             full path (MTP_FASTPATH=0), and plain `docker build` of the same context (all cached)
  profiles   the other shipped profiles (equal pins), built and pushed by the tool: unique bytes
             per extra profile, bytes a node pulls for its second profile
  bump-top   verl's commit moved one commit forward (setup.py unchanged): relock, build + checks
             + push; layers rebuilt, bytes pushed; vs the full rebuild (= the cold plain build)
  bump-mid   sglang's patch changed (its path list narrowed to the two files the probe needs:
             a new sha256): the same figures
  fresh      no-op with the image only in the registry and an empty builder: the tool (one
             registry look-up), the tool + `docker pull`, plain `docker build --cache-from` of an
             inline-cache copy of the same image
Needs scripts/setup-test-host.sh (dockerd, registry on 127.0.0.1:5000), the real-stack base
(scripts/real-stack/make-base.sh, or MTP_SUBSTITUTE_BASE), the git sources reachable (a mirror
through git's url.insteadOf, MTP_GIT_ALLOW_MISSING_BLOBS=1 for snapshots) and PyPI. About an hour
on 2 cores; it prunes the whole BuildKit cache twice. Writes bench/real_results.json, then
bench/RESULTS.md and the charts (bench/report.py). No figure here is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

import requests

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

from run import MANIFEST_V2, TOOL_PY, log, machine, med, registry_manifest, render_check, run_tool  # noqa: E402  (bench/run.py)

CA = os.environ.get("MTP_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
REGISTRY = os.environ.get("MTP_TEST_REGISTRY", "127.0.0.1:5000")
VERL_NEXT = (
    "d4701e4eb50feeabc2781499c02f64793ed55461"  # first verl main commit after 7bc80c00; setup.py unchanged
)
SGLANG_KEEP = (
    "python/sglang/srt/model_executor/model_runner.py",
    "python/sglang/srt/speculative/eagle_worker.py",
)


def docker(*args, check=True, timeout=3600, stdin=None) -> subprocess.CompletedProcess:
    from mtpimage import engine

    proc = subprocess.run(
        [engine.detect().cli, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=stdin,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:4])} failed: {proc.stderr[-2000:]}")
    return proc


def steps(output: str) -> dict:
    executed = set(re.findall(r"^#(\d+) \[[^\]]*\d+/\d+\] (?:RUN|COPY|ADD)", output, re.M))
    cached = set(re.findall(r"^#(\d+) CACHED$", output, re.M))
    return {"steps": len(executed), "cached": len(cached & executed), "executed": len(executed - cached)}


class RealBench:
    def __init__(self, tmp: Path, profile: str, reps: int):
        self.tmp, self.profile, self.reps = tmp, profile, reps
        self.ns = f"bench-real-{uuid.uuid4().hex[:8]}"
        self.reg = f"{REGISTRY}/{self.ns}"
        self.results: dict = {"profile": profile, "reps": reps, "registry_namespace": self.ns}
        self.mine: set[str] = set()

    # ------------------------------------------------------------------ plumbing
    def tool(self, *args, manifests: Path | None = None, env: dict | None = None, check=True):
        where = ["--manifests", str(manifests)] if manifests is not None else []
        return run_tool(*where, *args, check=check, env=env)

    def build_args(self, *args):
        return [*args, "--ca-bundle", CA, "--progress", "plain"]

    def rendered(self, profile: str, manifests: Path | None = None):
        from mtpimage.manifests import manifest

        try:
            from mtpimage.commands.load import plan_for
        except ImportError:
            from mtpimage.cli import plan_for
        from mtpimage.assembly.render import render

        m = manifest.load(manifests or REPO / "manifests")
        return render(plan_for(m, profile, None), m.root)

    def context(self, profile: str, manifests: Path | None = None) -> tuple[Path, str]:
        from mtpimage.assembly.buildctx import build_context

        r = self.rendered(profile, manifests)
        path = self.tmp / f"context-{r.identity}.tar"
        if not path.exists():
            path.write_bytes(build_context(r, progress=lambda _m: None))
        return path, r.identity

    def plain(self, ctx: Path, tag: str, *extra) -> tuple[float, dict]:
        self.mine.add(tag)
        with open(ctx, "rb") as f:
            t0 = time.perf_counter()
            proc = docker(
                "build",
                "--progress",
                "plain",
                "--secret",
                f"id=ca-bundle,src={CA}",
                "-t",
                tag,
                *extra,
                "-",
                stdin=f,
            )
            dt = time.perf_counter() - t0
        return dt, steps(proc.stderr)

    def layers(self, ref: str) -> list[str]:
        return json.loads(docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout)

    def manifest(self, tag: str, repo: str = "mtp-verl") -> dict:
        return registry_manifest(REGISTRY, self.ns, repo, tag)

    def registry_blobs(self) -> set[str]:
        """Every layer digest this run's namespace holds (what a push would skip)."""
        out = set()
        tags = requests.get(f"http://{REGISTRY}/v2/{self.ns}/mtp-verl/tags/list", timeout=60)
        for tag in (tags.json().get("tags") or []) if tags.ok else []:
            out |= {layer["digest"] for layer in self.manifest(tag)["layers"]}
        return out

    def history(self, ref: str) -> list[dict]:
        """Layers holding bytes, oldest first, labelled as build.py's size table labels them."""
        from mtpimage.assembly import sizes

        return [{"index": r.index, "size": r.size, "created_by": r.created_by} for r in sizes.layer_rows(ref)]

    def forget(self, *refs):
        for ref in refs:
            docker("image", "rm", ref, check=False)

    def prune(self):
        docker("builder", "prune", "-af", timeout=1800)

    def bumped_manifests(self, name: str, edit) -> Path:
        dest = self.tmp / f"manifests-{name}"
        shutil.copytree(REPO / "manifests", dest)
        cat = dest / "components.yaml"
        text = cat.read_text()
        new = edit(text)
        assert new != text, f"{name}: the edit changed nothing"
        cat.write_text(new)
        return dest

    # ------------------------------------------------------------------ cases
    def lock(self):
        log("lock speed (bench/lock_speed.py)")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [TOOL_PY, str(BENCH / "lock_speed.py"), "--runs", str(self.reps)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        self.results["lock"] = {
            **json.loads((BENCH / "lock_results.json").read_text()),
            "bench_s": time.perf_counter() - t0,
        }

    def cold(self):
        p = self.profile
        ctx, ident = self.context(p)
        self.ident = ident
        self.ref = f"mtp-verl:{ident}"
        self.results["identity"] = ident
        self.results["context_bytes"] = ctx.stat().st_size
        log(f"cold: plain docker build of {ident} (empty builder)")
        self.forget(self.ref, f"mtp-verl:{p}")
        self.prune()
        plain_s, plain_steps = self.plain(ctx, f"{self.reg}/plain:{p}")
        plain_layers = self.layers(f"{self.reg}/plain:{p}")
        self.forget(f"{self.reg}/plain:{p}")
        log(f"  {plain_s:.0f}s; cold: the tool (empty builder)")
        self.prune()
        tool_s, proc = self.tool(*self.build_args("--profile", p))
        self.mine |= {self.ref, f"mtp-verl:{p}"}
        self.base_layers = self.layers(self.ref)
        hist = self.history(self.ref)
        self.results["cold"] = {
            "tool_s": tool_s,
            "plain_s": plain_s,
            "plain_steps": plain_steps,
            "ratio": tool_s / plain_s,
            "layers": len(self.base_layers),
            "plain_layers": len(plain_layers),
            "history": hist,
            "image_bytes": sum(h["size"] for h in hist),
            "tool_tail": proc.stdout[-1500:],
        }
        log(f"  tool {tool_s:.0f}s, plain {plain_s:.0f}s")

    def push(self):
        log("push the baseline")
        dt, _ = self.tool("--profile", self.profile, "--push", "--registry", self.reg)
        man = self.manifest(self.profile)
        self.mine |= {f"{self.reg}/mtp-verl:{self.ident}", f"{self.reg}/mtp-verl:{self.profile}"}
        self.results["push"] = {
            "s": dt,
            "compressed_bytes": sum(x["size"] for x in man["layers"]),
            "layers": [x["size"] for x in man["layers"]],
        }

    def warm(self):
        log("warm no-op (image local)")
        p = self.profile
        ctx, _ = self.context(p)
        plain_tag = f"{self.reg}/plain:{p}"
        self.plain(ctx, plain_tag)  # the plain side's first run (all cached, tags it)
        self.tool(*self.build_args("--profile", p))  # and the tool's (writes its memo)
        tool_t, full_t, plain_t, plain_steps = [], [], [], None
        for _ in range(self.reps):
            dt, proc = self.tool(*self.build_args("--profile", p), env={"MTP_FASTPATH_TRACE": "1"})
            assert "up to date" in proc.stdout and "fastpath: hit" in proc.stderr, proc.stderr[-2000:]
            tool_t.append(dt)
            dt, proc = self.tool(*self.build_args("--profile", p), env={"MTP_FASTPATH": "0"})
            assert "up to date" in proc.stdout, proc.stdout[-2000:]
            full_t.append(dt)
            dt, plain_steps = self.plain(ctx, plain_tag)
            plain_t.append(dt)
        t0 = time.perf_counter()
        for _ in range(self.reps):
            subprocess.run([TOOL_PY, "-c", "pass"], check=True)
        bare = (time.perf_counter() - t0) / self.reps
        self.results["warm"] = {
            "tool_s": tool_t,
            "tool_full_path_s": full_t,
            "plain_s": plain_t,
            "plain_steps": plain_steps,
            "python_startup_s": bare,
            "ratio": med(tool_t) / med(plain_t),
        }
        log(f"  tool {med(tool_t):.3f}s (full path {med(full_t):.2f}s), plain {med(plain_t):.2f}s")

    def profiles(self):
        from mtpimage.manifests import manifest

        names = [n for n in manifest.load(REPO / "manifests").names() if n != self.profile]
        log(f"other profiles: {', '.join(names)}")
        builds = {}
        for n in names:
            dt, _ = self.tool(*self.build_args("--profile", n, "--push", "--registry", self.reg))
            ident = self.rendered(n).identity
            self.mine |= {
                f"mtp-verl:{ident}",
                f"mtp-verl:{n}",
                f"{self.reg}/mtp-verl:{ident}",
                f"{self.reg}/mtp-verl:{n}",
            }
            builds[n] = dt
            log(f"  {n}: {dt:.0f}s")
        everyone = [self.profile, *names]
        layers = {n: [(x["digest"], x["size"]) for x in self.manifest(n)["layers"]] for n in everyone}
        common = set.intersection(*({d for d, _ in layers[n]} for n in everyone))
        first = {d for d, _ in layers[self.profile]}
        per = {}
        for n in everyone:
            total = sum(s for _, s in layers[n])
            unique = sum(s for d, s in layers[n] if d not in common)
            second = sum(s for d, s in layers[n] if d not in first)  # a node that has `profile` pulls this
            per[n] = {
                "layers": len(layers[n]),
                "compressed_bytes": total,
                "unique_bytes": unique,
                "unique_pct": 100.0 * unique / total,
                "second_profile_pull_bytes": second,
                "unshared_layer_indexes": [i for i, (d, _) in enumerate(layers[n]) if d not in common],
            }
        sizes = {d: s for n in everyone for d, s in layers[n]}
        self.results["profiles"] = {
            "build_s": builds,
            "per_profile": per,
            "shared_layers": len(common),
            "shared_bytes": sum(sizes[d] for d in common),
            "union_bytes": sum(sizes.values()),
            "naive_sum_bytes": sum(per[n]["compressed_bytes"] for n in everyone),
        }

    def bump(self, key: str, what: str, manifests: Path):
        log(f"bump {key}: {what}")
        known = self.registry_blobs()
        lock_s, _ = self.tool("lock", manifests=manifests)
        dt, proc = self.tool(
            *self.build_args("--profile", self.profile, "--push", "--registry", self.reg), manifests=manifests
        )
        ident = self.rendered(self.profile, manifests).identity
        ref = f"mtp-verl:{ident}"
        self.mine |= {ref, f"{self.reg}/mtp-verl:{ident}"}
        new = self.layers(ref)
        rebuilt = [i for i, d in enumerate(new) if i >= len(self.base_layers) or d != self.base_layers[i]]
        man = self.manifest(ident)
        pushed = sum(x["size"] for x in man["layers"] if x["digest"] not in known)
        total = sum(x["size"] for x in man["layers"])
        self.results[f"bump_{key}"] = {
            "what": what,
            "lock_s": lock_s,
            "s": dt,
            "layers": len(new),
            "layers_rebuilt": len(rebuilt),
            "first_rebuilt_index": rebuilt[0] if rebuilt else None,
            "pushed_bytes": pushed,
            "image_compressed_bytes": total,
            "full_rebuild_s": self.results["cold"]["plain_s"],
            "ratio": dt / self.results["cold"]["plain_s"],
            "buildkit": steps(proc.stderr),
        }
        # the profile tags go back to the baseline for the cases after this one
        docker("tag", self.ref, f"mtp-verl:{self.profile}")
        self.tool("--profile", self.profile, "--push", "--registry", self.reg)
        log(
            f"  {dt:.0f}s, {len(rebuilt)}/{len(new)} layers rebuilt, {pushed / 1e6:.1f} MB pushed of {total / 1e6:.0f} MB"
        )

    def bump_top(self):
        m = self.bumped_manifests(
            "verl", lambda t: t.replace("7bc80c00a07833e06797ecde08c7efc58f524aa2", VERL_NEXT)
        )
        self.bump("verl", f"verl commit 7bc80c00 -> {VERL_NEXT[:8]} (the next main commit)", m)

    def bump_mid(self):
        import yaml

        from mtpimage import gitfetch

        cat = yaml.safe_load((REPO / "manifests" / "components.yaml").read_text())
        patch = cat["components"]["sglang"]["patches"][0]
        data, _ = gitfetch.commit_diff(patch["repo"], patch["base"], patch["head"], SGLANG_KEEP)
        import hashlib

        sha = hashlib.sha256(data).hexdigest()

        def edit(text: str) -> str:
            text = re.sub(r"\n *- python/sglang/srt/speculative/eagle_worker_v2.py", "", text, count=1)
            return text.replace(patch["sha256"], sha)

        m = self.bumped_manifests("sglang", edit)
        self.bump(
            "sglang_patch", f"sglang patch: 3 -> 2 files (eagle_worker_v2.py dropped), sha256 {sha[:12]}", m
        )

    def fresh(self):
        log("fresh builder: image only in the registry")
        p = self.profile
        ctx, _ = self.context(p)
        inline = f"{self.reg}/plain-inline:{p}"
        self.plain(ctx, inline, "--build-arg", "BUILDKIT_INLINE_CACHE=1")
        t0 = time.perf_counter()
        docker("push", inline)
        inline_push = time.perf_counter() - t0
        digest = requests.head(
            f"http://{REGISTRY}/v2/{self.ns}/mtp-verl/manifests/{p}",
            headers={"Accept": MANIFEST_V2},
            timeout=60,
        ).headers["Docker-Content-Digest"]
        pulled = f"{self.reg}/mtp-verl@{digest}"
        local = sorted(self.mine | {pulled})
        self.forget(*local)
        self.prune()
        tool_s, proc = self.tool(*self.build_args("--profile", p, "--push", "--registry", self.reg))
        assert "nothing to build" in proc.stdout, proc.stdout[-2000:]
        t0 = time.perf_counter()
        docker("pull", pulled)
        pull_s = time.perf_counter() - t0
        self.forget(pulled)
        self.prune()
        plain_s, plain_steps = self.plain(ctx, inline, "--cache-from", inline)
        self.results["fresh"] = {
            "tool_s": tool_s,
            "pull_s": pull_s,
            "tool_then_pull_s": tool_s + pull_s,
            "plain_s": plain_s,
            "plain_steps": plain_steps,
            "inline_push_s": inline_push,
            "ratio": plain_s / tool_s,
            "ratio_with_pull": plain_s / (tool_s + pull_s),
        }
        log(f"  tool {tool_s:.2f}s (+pull {pull_s:.0f}s), plain --cache-from {plain_s:.0f}s")

    def cleanup(self):
        log("cleanup: this run's local images")
        self.forget(*sorted(self.mine))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mtp-detach")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip-lock", action="store_true", help="keep bench/lock_results.json as it is")
    ap.add_argument("--keep", action="store_true", help="keep this run's images")
    args = ap.parse_args()
    os.environ.setdefault("MTP_CACHE_DIR", "/var/cache/mtp-real")
    os.environ.setdefault("MTP_OMIT_PACKAGES", "transformer-engine,flash-attn,apex")
    os.environ.setdefault("MTP_GIT_ALLOW_MISSING_BLOBS", "1")
    if not os.environ.get("MTP_SUBSTITUTE_BASE"):
        os.environ["MTP_SUBSTITUTE_BASE"] = (
            subprocess.run(
                ["bash", str(REPO / "scripts/real-stack/make-base.sh")],
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
    t_start = time.perf_counter()
    results = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python3 bench/real_stack.py " + " ".join(sys.argv[1:]),
        "substituted": {
            "base": os.environ["MTP_SUBSTITUTE_BASE"],
            "omitted": os.environ["MTP_OMIT_PACKAGES"],
        },
    }
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mtp-bench-real-") as tmpdir:
        b = RealBench(Path(tmpdir), args.profile, args.reps)
        try:
            results["render_check"] = render_check(args.reps)
            if not args.skip_lock:
                b.lock()
            for case in (b.cold, b.push, b.warm, b.profiles, b.bump_top, b.bump_mid, b.fresh):
                try:
                    case()
                except Exception:  # noqa: BLE001 - record it, keep the images, go on with the rest
                    failed.append(case.__name__)
                    results.setdefault("errors", {})[case.__name__] = traceback.format_exc()[-3000:]
                    log(f"FAILED {case.__name__}:\n{traceback.format_exc()[-1500:]}")
                results.update(b.results)
                (BENCH / "real_results.json").write_text(json.dumps(results, indent=2) + "\n")
        finally:
            if not args.keep and not failed:
                b.cleanup()
    results["total_s"] = time.perf_counter() - t_start
    (BENCH / "real_results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote bench/real_results.json ({results['total_s']:.0f}s)")
    from report import write_all  # bench/report.py

    write_all(json.loads((BENCH / "results.json").read_text()), BENCH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
