#!/usr/bin/env python3
"""Benchmark of the MTP image builder against plain `docker build`, in the same run.

    python3 bench/run.py [--reps 5] [--bump-reps 3] [--full-reps 2]

Needs what the e2e tests need (scripts/setup-test-host.sh: dockerd, registry on
127.0.0.1:5000, mtp-test-base:bookworm) and, for the chart, bench/requirements.txt.
It serves the loopback stand-in git repos of tests/fixtures, pushes its own digest-pinned
test base to 127.0.0.1:5000/bench-<id>/, builds the test profiles of tests/manifests/ and
writes bench/RESULTS.md, bench/results.json and bench/results.png. It deletes its own
images at the end; the fresh-builder case runs `docker builder prune -af` (the whole
BuildKit cache of this dockerd).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.dockerhost import probe_docker_host  # noqa: E402
from tests.fixtures.gitrepos import advance_branch  # noqa: E402
from tests.fixtures.image_fixtures import copy_manifests  # noqa: E402
from tests.fixtures.servers import serve_git_world  # noqa: E402

PROFILE = "test-detach"
OTHERS = ("test-load-only", "test-cp-recompute")
# the Python the tool runs under: build.py's own .venv when it made one (it holds requirements.txt)
TOOL_PY = (
    str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
)
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def registry_manifest(registry: str, ns: str, repo: str, tag: str) -> dict:
    """The v2 image manifest of NS/REPO:TAG in a loopback registry (layer digests and sizes)."""
    r = requests.get(
        f"http://{registry}/v2/{ns}/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_V2}, timeout=60
    )
    r.raise_for_status()
    return r.json()


def run_tool(*args, check=True, env=None, timeout=3600):
    """`python build.py ARGS` as users run it: (seconds, the finished process)."""
    argv = [TOOL_PY, str(REPO / "build.py"), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    dt = time.perf_counter() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"build.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return dt, proc


def med(xs):
    return statistics.median(xs) if xs else None


class Bench:
    def __init__(self, host, world, tmp: Path, reps: int):
        self.host, self.world, self.tmp, self.reps = host, world, tmp, reps
        self.ns = f"bench-{uuid.uuid4().hex[:8]}"
        self.reg = f"{host.registry}/{self.ns}"
        self.results: dict = {"reps": reps, "profile": PROFILE}
        self.local_refs: set[str] = set()

    # ------------------------------------------------------------------ plumbing
    def docker(self, *args, check=True, timeout=900, stdin=None):
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        proc = subprocess.run(
            [self.host.cli, *args], capture_output=True, text=True, env=env, timeout=timeout, stdin=stdin
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:4])} failed: {proc.stderr[-2000:]}")
        return proc

    def tool(self, *args, check=True, env=None):
        return run_tool("--manifests", str(self.manifests), *args, check=check, env=env)

    def plain_build(self, ctx: Path, tag: str, *extra):
        self.local_refs.add(tag)
        with open(ctx, "rb") as f:
            t0 = time.perf_counter()
            proc = self.docker("build", "--progress", "plain", "-t", tag, *extra, "-", stdin=f)
            dt = time.perf_counter() - t0
        return dt, proc

    @staticmethod
    def steps(output: str) -> dict:
        """BuildKit step counts from plain progress output."""
        cached = len(re.findall(r"^#\d+ CACHED$", output, re.M))
        runs = len(set(re.findall(r"^#(\d+) \[[^\]]*\d+/\d+\] (?:RUN|COPY|ADD)", output, re.M)))
        return {"cached": cached, "executed_or_cached_steps": runs}

    def manifest(self, repo: str, tag: str) -> dict:
        return registry_manifest(self.host.registry, self.ns, repo, tag)

    def identity(self, profile: str, *sets: str) -> str:
        extra = [a for s in sets for a in ("--set", s)]
        _, proc = self.tool(
            *extra, "render", "--profile", profile, "--json", "--out", str(self.tmp / f"render-{profile}")
        )
        return json.loads(proc.stdout)["identity"]

    def context_tar(self, profile: str) -> Path:
        from mtpimage.assembly.buildctx import build_context
        from mtpimage.assembly.render import render
        from mtpimage.cli import plan_for
        from mtpimage.manifests import manifest

        m = manifest.load(self.manifests)
        rendered = render(plan_for(m, profile, None), m.root)
        path = self.tmp / f"context-{profile}.tar"
        path.write_bytes(build_context(rendered, progress=lambda _m: None))
        (self.tmp / f"Dockerfile-{profile}").write_text(rendered.dockerfile)
        return path

    def forget_local(self, refs):
        for ref in refs:
            self.docker("image", "rm", ref, check=False)

    def prune_builder(self):
        self.docker("builder", "prune", "-af", timeout=600)

    # ------------------------------------------------------------------ setup
    def setup(self):
        log(f"base -> {self.reg}/base")
        # A flattened copy of the test base (docker export | docker import): its layer is
        # shared with no other local image, so removing this run's images really empties
        # the local store of everything the fresh-builder case needs.
        flat = f"{self.reg}/base-flat:1"
        cid = self.docker("create", self.host.base_image, "true").stdout.strip()
        exp = subprocess.Popen([self.host.cli, "export", cid], stdout=subprocess.PIPE)
        self.docker(
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "-",
            flat,
            stdin=exp.stdout,
        )
        exp.wait()
        self.docker("rm", cid)
        self.local_refs.add(flat)
        ctx = self.tmp / "base-ctx"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(f"FROM {flat}\nRUN ln -sf python3 /usr/bin/python3.12\n")
        ref = f"{self.reg}/base:bookworm-py3.12"
        proc = self.host.build(ctx, ref)
        assert proc.returncode == 0, proc.stderr
        self.docker("push", ref)
        self.local_refs.add(ref)
        digests = json.loads(self.docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout)
        base = [d for d in digests if d.startswith(f"{self.reg}/base@")][0]
        self.manifests = copy_manifests(self.tmp / "manifests", base)
        self.ident = {p: self.identity(p) for p in (PROFILE, *OTHERS)}
        self.ctx = self.context_tar(PROFILE)
        log(f"first build of {PROFILE} through the tool (build + checks + push)")
        dt, proc = self.tool("--profile", PROFILE, "--push", "--registry", self.reg)
        self.results["first_build_s"] = dt
        self.local_refs |= {
            f"mtp-verl:{self.ident[PROFILE]}",
            f"mtp-verl:{PROFILE}",
            f"{self.reg}/mtp-verl:{self.ident[PROFILE]}",
            f"{self.reg}/mtp-verl:{PROFILE}",
        }
        log(f"  {dt:.1f}s")

    # ------------------------------------------------------------------ cases
    def warm_noop(self):
        log("warm no-op")
        plain_tag = f"{self.reg}/plain:{PROFILE}"
        self.plain_build(self.ctx, plain_tag)  # warm the plain path too (same cache)
        self.tool("--profile", PROFILE)  # the tool's first no-op: its memo (mtpimage/assembly/fastpath.py)
        tool_t, full_t, plain_t, plain_steps = [], [], [], None
        for _ in range(self.reps):
            dt, proc = self.tool("--profile", PROFILE, env={"MTP_FASTPATH_TRACE": "1"})
            assert "up to date" in proc.stdout and "fastpath: hit" in proc.stderr, proc.stderr[-2000:]
            tool_t.append(dt)
            dt, proc = self.tool("--profile", PROFILE, env={"MTP_FASTPATH": "0"})
            assert "up to date" in proc.stdout, proc.stdout[-2000:]
            full_t.append(dt)
            dt, proc = self.plain_build(self.ctx, plain_tag)
            plain_t.append(dt)
            plain_steps = self.steps(proc.stderr)
        probe = (
            "import time; t = time.perf_counter(); import mtpimage.cli, mtpimage.commands.image; "
            "t1 = time.perf_counter(); from mtpimage import engine; engine.detect(); "
            "t2 = time.perf_counter(); print(t1 - t, t2 - t1)"
        )
        parts = [
            tuple(
                map(
                    float,
                    subprocess.run(
                        [TOOL_PY, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
                    ).stdout.split(),
                )
            )
            for _ in range(3)
        ]
        t0 = time.perf_counter()
        subprocess.run([TOOL_PY, "-c", "pass"])
        bare = time.perf_counter() - t0
        breakdown = {
            "python_startup_s": bare,
            "imports_s": med([p[0] for p in parts]),
            "docker_cli_detection_s": med([p[1] for p in parts]),
        }
        self.results["warm"] = {
            "tool_breakdown": breakdown,
            "tool_s": tool_t,
            "tool_full_path_s": full_t,
            "plain_s": plain_t,
            "plain_steps": plain_steps,
            "ratio": med(tool_t) / med(plain_t),
        }
        log(f"  tool {med(tool_t):.2f}s plain {med(plain_t):.2f}s")

    def sharing(self):
        log("layer sharing: build + push the other test profiles (equal pins)")
        builds = {}
        for p in OTHERS:
            dt, _ = self.tool("--profile", p, "--push", "--registry", self.reg)
            builds[p] = dt
            self.local_refs |= {
                f"mtp-verl:{self.ident[p]}",
                f"mtp-verl:{p}",
                f"{self.reg}/mtp-verl:{self.ident[p]}",
                f"{self.reg}/mtp-verl:{p}",
            }
        profiles = (PROFILE, *OTHERS)
        mans = {p: self.manifest("mtp-verl", p) for p in profiles}
        layers = {p: [(l["digest"], l["size"]) for l in mans[p]["layers"]] for p in profiles}
        sizes = {d: s for p in profiles for d, s in layers[p]}
        common = set.intersection(*(set(d for d, _ in layers[p]) for p in profiles))
        first = set(d for d, _ in layers[PROFILE])
        per = {}
        for p in profiles:
            total = sum(s for _, s in layers[p])
            unique = sum(s for d, s in layers[p] if d not in common)
            extra = sum(s for d, s in layers[p] if d not in first)
            diff_idx = [i for i, (d, _) in enumerate(layers[p]) if d not in common]
            per[p] = {
                "layers": len(layers[p]),
                "compressed_bytes": total,
                "unique_bytes": unique,
                "unique_pct": 100.0 * unique / total,
                "new_vs_first_bytes": extra,
                "unshared_layer_indexes": diff_idx,
            }
        union = sum(sizes.values())
        naive = sum(per[p]["compressed_bytes"] for p in profiles)
        # uncompressed, from the local images (what the layer table of mtpimage/assembly/sizes.py prints)
        from mtpimage.assembly import sizes as sz

        rows = {
            p: [(r.index, r.size, r.created_by) for r in sz.layer_rows(f"mtp-verl:{self.ident[p]}")]
            for p in profiles
        }
        self.results["sharing"] = {
            "build_s": builds,
            "per_profile": per,
            "shared_bytes": sum(sizes[d] for d in common),
            "shared_layers": len(common),
            "union_bytes": union,
            "naive_sum_bytes": naive,
            "layer_table": rows[PROFILE],
            "uncompressed_total": {p: sum(r[1] for r in rows[p]) for p in profiles},
        }
        log(
            f"  shared {len(common)} layers; unique % "
            + ", ".join(f"{p} {per[p]['unique_pct']:.3f}" for p in profiles)
        )

    def bump(self, comp: str, reps: int, full_reps: int):
        log(f"one pin bumped ({comp}) x{reps}, full rebuild x{full_reps}")
        repo = getattr(self.world.repos, comp.replace("-", "_"))
        base_layers = json.loads(
            self.docker(
                "image", "inspect", "--format", "{{json .RootFS.Layers}}", f"mtp-verl:{self.ident[PROFILE]}"
            ).stdout
        )
        known = {l["digest"] for p in (PROFILE, *OTHERS) for l in self.manifest("mtp-verl", p)["layers"]}
        out = {"incremental": [], "full": []}
        for kind, n in (("incremental", reps), ("full", full_reps)):
            for i in range(n):
                sha = advance_branch(repo, files={"BENCH_BUMP.txt": uuid.uuid4().hex + "\n"})
                s = f"{comp}.commit={sha}"
                ident = self.identity(PROFILE, s)
                args = ["--set", s, "--profile", PROFILE, "--push", "--registry", self.reg]
                if kind == "full":
                    args = ["--no-cache", *args]
                dt, proc = self.tool(*args)
                self.local_refs |= {f"mtp-verl:{ident}", f"{self.reg}/mtp-verl:{ident}"}
                new_layers = json.loads(
                    self.docker(
                        "image", "inspect", "--format", "{{json .RootFS.Layers}}", f"mtp-verl:{ident}"
                    ).stdout
                )
                rebuilt = [
                    i for i, d in enumerate(new_layers) if i >= len(base_layers) or d != base_layers[i]
                ]
                man = self.manifest("mtp-verl", ident)
                pushed = sum(l["size"] for l in man["layers"] if l["digest"] not in known)
                total = sum(l["size"] for l in man["layers"])
                known |= {l["digest"] for l in man["layers"]}
                out[kind].append(
                    {
                        "s": dt,
                        "layers_rebuilt": len(rebuilt),
                        "first_rebuilt_index": rebuilt[0] if rebuilt else None,
                        "layers": len(new_layers),
                        "pushed_bytes": pushed,
                        "image_bytes": total,
                        "buildkit": self.steps(proc.stderr),
                    }
                )
                log(
                    f"  {kind} {i}: {dt:.1f}s, {len(rebuilt)}/{len(new_layers)} layers rebuilt, pushed {pushed} B"
                )
                # only this run's tags go; the profile tag moves back on the next run
        # put the profile tag back on the baseline (later cases rely on it)
        self.docker("tag", f"mtp-verl:{self.ident[PROFILE]}", f"mtp-verl:{PROFILE}")
        self.results[f"bump_{comp}"] = out

    def fresh_noop(self):
        log("fresh-builder no-op (prunes the BuildKit cache)")
        plain_ref = f"{self.reg}/plain-inline:{PROFILE}"
        self.plain_build(self.ctx, plain_ref, "--build-arg", "BUILDKIT_INLINE_CACHE=1")
        self.docker("push", plain_ref)
        # the tool's registry tags must point at the baseline again (the bump moved the profile tag)
        self.tool("--profile", PROFILE, "--push", "--registry", self.reg)
        # every image of this run goes (base included), so nothing of it is local any more
        mine = sorted(self.local_refs | {f"mtp-verl:{PROFILE}", plain_ref})
        digest = requests.head(
            f"http://{self.host.registry}/v2/{self.ns}/mtp-verl/manifests/{PROFILE}",
            headers={"Accept": MANIFEST_V2},
            timeout=30,
        ).headers["Docker-Content-Digest"]
        tool_t, pull_t, plain_t, plain_steps = [], [], [], []
        for _ in range(self.reps):
            self.forget_local(mine)
            self.prune_builder()
            dt, proc = self.tool("--profile", PROFILE, "--push", "--registry", self.reg)
            assert "up to date" in proc.stdout and "nothing to build" in proc.stdout, proc.stdout[-2000:]
            tool_t.append(dt)
            t0 = time.perf_counter()
            self.docker("pull", f"{self.reg}/mtp-verl@{digest}")
            pull_t.append(time.perf_counter() - t0)
            self.forget_local(mine + [f"{self.reg}/mtp-verl@{digest}"])
            self.prune_builder()
            dt, proc = self.plain_build(self.ctx, plain_ref, "--cache-from", plain_ref)
            plain_t.append(dt)
            plain_steps.append(self.steps(proc.stderr))
        self.local_refs.add(f"{self.reg}/mtp-verl@{digest}")
        self.results["fresh"] = {
            "tool_s": tool_t,
            "tool_then_pull_s": [a + b for a, b in zip(tool_t, pull_t)],
            "pull_s": pull_t,
            "plain_s": plain_t,
            "plain_steps": plain_steps,
            "ratio": med(plain_t) / med(tool_t),
            "ratio_with_pull": med(plain_t) / med([a + b for a, b in zip(tool_t, pull_t)]),
        }
        log(f"  tool {med(tool_t):.2f}s (+pull {med(pull_t):.2f}s) plain --cache-from {med(plain_t):.2f}s")

    def cleanup(self):
        log("cleanup: removing this run's images")
        for ref in sorted(self.local_refs):
            self.docker("image", "rm", ref, check=False)


def render_check(reps: int) -> dict:
    """Render + check of every shipped profile (manifests/): in-process and as CLI calls."""
    log("render + check of every shipped profile")
    from mtpimage.assembly.render import render
    from mtpimage.cli import plan_for
    from mtpimage.manifests import manifest
    from mtpimage.plan import rules

    def once():
        m = manifest.load(REPO / "manifests")
        n = 0
        for name in m.names():
            plan = plan_for(m, name, None)
            rules.evaluate(plan)
            render(plan, m.root)
            n += 1
        return n

    n = once()  # imports and template compilation are not in the in-process figure
    inproc = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        inproc.append(time.perf_counter() - t0)
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from mtpimage import manifest, rules\nfrom mtpimage.cli import plan_for\n"
        f"from mtpimage.assembly.render import render\nm = manifest.load({str(REPO / 'manifests')!r})\n"
        "for name in m.names():\n    p = plan_for(m, name, None); rules.evaluate(p); render(p, m.root)\n"
    )
    one_proc, check_cli, render_cli, bare = [], [], [], []
    names = manifest.load(REPO / "manifests").names()
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run([TOOL_PY, "-c", "pass"], check=True)
            bare.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([TOOL_PY, "-c", code], check=True)
            one_proc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [TOOL_PY, str(REPO / "build.py"), "check"], cwd=REPO, capture_output=True, text=True
            )
            check_cli.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for name in names:
                subprocess.run(
                    [
                        TOOL_PY,
                        str(REPO / "build.py"),
                        "render",
                        "--profile",
                        name,
                        "--out",
                        os.path.join(tmp, name),
                    ],
                    cwd=REPO,
                    check=True,
                    capture_output=True,
                )
            render_cli.append(time.perf_counter() - t0)
    return {
        "profiles": n,
        "in_process_s": inproc,
        "one_process_s": one_proc,
        "cli_check_all_s": check_cli,
        "cli_check_rc": proc.returncode,
        "cli_render_each_s": render_cli,
        "python_startup_s": bare,
    }


def machine() -> dict:
    def out(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        mem = f"{int(open('/proc/meminfo').readline().split()[1]) / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tool_python": "/".join(Path(TOOL_PY).parts[-3:]),  # .venv/bin/python: no machine path
        "docker": out("docker", "version", "--format", "{{.Server.Version}}"),
        "storage_driver": out("docker", "info", "--format", "{{.Driver}}"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bump-reps", type=int, default=3)
    ap.add_argument("--full-reps", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="subset of: render warm sharing bump fresh")
    args = ap.parse_args()
    only = set(args.only or ["render", "warm", "sharing", "bump", "fresh"])
    t_start = time.perf_counter()
    results = {"machine": machine(), "command": "python3 bench/run.py " + " ".join(sys.argv[1:])}
    if "render" in only:
        results["render_check"] = render_check(args.reps)
    host, problems = probe_docker_host()
    if host is None:
        print("bench: host not ready:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 3
    # the tests start a registry of their own per session; the bench uses the host's
    # (scripts/setup-test-host.sh), as docs/benchmark.md's reproduce steps say
    host = dataclasses.replace(
        host, registry=host.registry or os.environ.get("MTP_TEST_REGISTRY", "127.0.0.1:5000")
    )
    results["machine"]["docker_cli"] = host.cli
    with tempfile.TemporaryDirectory(prefix="mtp-bench-") as tmpdir:
        tmp = Path(tmpdir)
        with serve_git_world(tmp / "git-world") as world:
            os.environ.update(world.env)
            os.environ["MTP_CACHE_DIR"] = str(tmp / "src-cache")
            os.environ["MTP_DOCKER_CLI"] = host.cli
            b = Bench(host, world, tmp, args.reps)
            try:
                b.setup()
                if "warm" in only:
                    b.warm_noop()
                if "sharing" in only:
                    b.sharing()
                if "bump" in only:
                    b.bump("sglang", args.bump_reps, args.full_reps)
                if "fresh" in only:
                    b.fresh_noop()
                results.update(b.results)
            finally:
                b.cleanup()
    results["total_s"] = time.perf_counter() - t_start
    if args.only and (BENCH / "results.json").exists():
        # a partial run updates its cases and keeps the others, saying which came from where
        previous = json.loads((BENCH / "results.json").read_text())
        results = {
            **previous,
            **{k: v for k, v in results.items() if k not in ("command", "total_s")},
            "updated": previous.get("updated", [])
            + [
                {
                    "cases": sorted(only),
                    "command": results["command"],
                    "date": time.strftime("%Y-%m-%d", time.gmtime()),
                    "total_s": results["total_s"],
                }
            ],
        }
    (BENCH / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote bench/results.json ({results['total_s']:.0f}s)")
    from report import write_all  # bench/report.py

    write_all(results, BENCH)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    sys.exit(main())
