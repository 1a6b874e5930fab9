"""bench/real_results.json -> the real-stack section of bench/RESULTS.md and
bench/results-real.png (used by bench/report.py; bench/real_stack.py makes the JSON)."""

from __future__ import annotations

from pathlib import Path

from report import mb, med, s, yes  # bench/report.py


def gb(n) -> str:
    return f"{n / 1e9:.2f} GB"


def size(n) -> str:
    return gb(n) if n >= 1e9 else mb(n) if n >= 1e6 else f"{n / 1e3:.0f} kB"


def markdown(r: dict) -> list[str]:
    m, sub = r.get("machine", {}), r.get("substituted", {})
    out = [
        "## Real-stack images (bench/real_stack.py)",
        "",
        f"Measured {r.get('date')} in one run of `{r.get('command')}` ({r.get('total_s', 0) / 60:.0f} min) on "
        f"{m.get('cpu')} ({m.get('cores')} cores), {m.get('memory')}, dockerd {m.get('docker')}. "
        f"The images are the shipped profiles on the real stack (docs/real-stack.md): real PyPI wheels of "
        f"manifests/lock.yaml, real git sources at their pinned commits, the real sglang patch. "
        f"**Substituted**: the base ({sub.get('base', '?').split('@')[0]}, a local stand-in for "
        f"nvidia/cuda:13.0.2-devel-ubuntu24.04) and verl's wheelhouse extensions "
        f"({sub.get('omitted')}: omitted, so the real image is ~8-9 GB larger, in layers that sit "
        f"below every layer a bump changes). tool = `python build.py ...`; plain = "
        f"`DOCKER_BUILDKIT=1 docker build` of the same rendered context (Dockerfile + pinned sources, "
        f"{size(r.get('context_bytes', 0))}), same dockerd, same run. Medians of {r.get('reps')} "
        f"where repeated.",
        "",
        "| case | tool | plain docker | ratio | goal | verdict |",
        "|---|---|---|---|---|---|",
    ]
    c, w, f, pr = r.get("cold"), r.get("warm"), r.get("fresh"), r.get("profiles")
    if f:
        out.append(
            f"| no-op, fresh builder (image only in the registry) | {s(f['tool_s'])} | "
            f"{s(f['plain_s'])} (`--cache-from`, inline cache) | {f['ratio']:.0f}x faster | >= 10x | "
            f"{yes(f['ratio'] >= 10)} |"
        )
        out.append(
            f"| same, tool + `docker pull` of the digest | {s(f['tool_then_pull_s'])} | {s(f['plain_s'])} | "
            f"{f['ratio_with_pull']:.1f}x faster | (both end with a local image) | - |"
        )
    if w:
        out.append(
            f"| no-op, warm builder (image local) | {s(med(w['tool_s']))} | {s(med(w['plain_s']))} "
            f"(all steps cached) | {w['ratio']:.3f} (tool/plain) | <= 1.0 | {yes(w['ratio'] <= 1.0)} |"
        )
        out.append(
            f"| same, the tool's full path (`MTP_FASTPATH=0`) | {s(med(w['tool_full_path_s']))} | "
            f"{s(med(w['plain_s']))} | {med(w['tool_full_path_s']) / med(w['plain_s']):.2f} | - | - |"
        )
    if c:
        out.append(
            f"| cold build, empty builder (build + in-image checks + tag) | {s(c['tool_s'])} | "
            f"{s(c['plain_s'])} (build only) | {c['ratio']:.2f} (tool/plain) | - | - |"
        )
    for key, label in (
        ("bump_verl", "verl commit bumped (top)"),
        ("bump_sglang_patch", "sglang patch changed (middle)"),
    ):
        b = r.get(key)
        if b:
            out.append(
                f"| {label}: relock + build + checks + push | {s(b['lock_s'] + b['s'])} "
                f"({b['layers_rebuilt']}/{b['layers']} layers rebuilt, {size(b['pushed_bytes'])} pushed) | "
                f"{s(b['full_rebuild_s'])} full rebuild (cold plain build) | "
                f"{b['full_rebuild_s'] / (b['lock_s'] + b['s']):.1f}x faster | only the layers from the "
                f"bumped component up | {yes(b['first_rebuilt_index'] is not None)} |"
            )
    if pr:
        per = pr["per_profile"]
        extra = [x for n, x in per.items() if n != r["profile"]]
        worst = max(x["unique_pct"] for x in extra)
        out.append(
            f"| profiles with equal pins: unique bytes per extra profile | at most {worst:.4f}% | - | - | "
            f"< 1% | {yes(worst < 1)} |"
        )
        pull = max(x["second_profile_pull_bytes"] for x in extra)
        out.append(
            f"| bytes a node pulls for its second profile | at most {size(pull)} of "
            f"{size(per[r['profile']]['compressed_bytes'])} | - | - | - | - |"
        )
    rc = r.get("render_check")
    if rc:
        out.append(
            f"| render + check, all {rc['profiles']} shipped profiles | {s(med(rc['in_process_s']))} "
            f"in-process, {s(med(rc['one_process_s']))} as one fresh process | - | - | < 1 s | "
            f"{yes(med(rc['one_process_s']) < 1)} |"
        )
    lk = r.get("lock")
    if lk:
        out.append(
            f"| `build.py lock`, all shipped profiles | {s(lk['tool']['cold_s'])} cold, "
            f"{s(lk['tool']['warm_s'])} warm | `uv pip compile` alone {s(lk['uv_compile_only']['cold_s'])} / "
            f"{s(lk['uv_compile_only']['warm_s'])}; pip's resolver: exit {lk['pip_resolver']['exit']} after "
            f"{s(lk['pip_resolver']['cold_s'])} | - | - | - |"
        )
    out.append("")

    if c:
        out += [
            "### Layers of the image (uncompressed, `docker history`; what `build.py` prints after a build)",
            "",
            "The layers that change most sit on top: every component's PyPI dependencies first (they move "
            "only when the lock does), then the components themselves in the order they are bumped.",
            "",
            "| history step | size | created by |",
            "|---|---|---|",
        ]
        for h in c["history"]:
            out.append(f"| {h['index']} | {size(h['size'])} | `{h['created_by'].replace('|', '/')}` |")
        out += [
            "",
            f"Image: {gb(c['image_bytes'])} uncompressed; {gb(r['push']['compressed_bytes'])} compressed "
            f"in the registry ({len(r['push']['layers'])} layers).",
            "",
        ]
    bumps = [(k, r[k]) for k in ("bump_verl", "bump_sglang_patch") if r.get(k)]
    if bumps:
        out += [
            "### One pin bumped",
            "",
            "Each bump is a copy of manifests/ with one change, locked (`build.py lock`) and built with "
            "`--push` to the same registry namespace. Layers rebuilt: RootFS diff against the baseline "
            "image; bytes pushed: compressed blobs the namespace did not hold yet.",
            "",
            "| bump | lock | build + checks + push | layers rebuilt | first rebuilt | bytes pushed | image (compressed) | BuildKit steps |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for _, b in bumps:
            out.append(
                f"| {b['what']} | {s(b['lock_s'])} | {s(b['s'])} | {b['layers_rebuilt']} of {b['layers']} | "
                f"{b['first_rebuilt_index']} | {size(b['pushed_bytes'])} "
                f"({100 * b['pushed_bytes'] / b['image_compressed_bytes']:.2f}%) | "
                f"{gb(b['image_compressed_bytes'])} | {b['buildkit']} |"
            )
        out.append("")
    if pr:
        per = pr["per_profile"]
        out += [
            "### Profiles with equal pins",
            "",
            f"{pr['shared_layers']} layers ({gb(pr['shared_bytes'])} compressed) are shared by all "
            f"{len(per)} profiles; the registry holds {gb(pr['union_bytes'])} instead of "
            f"{gb(pr['naive_sum_bytes'])}.",
            "",
            "| profile | build + checks + push | layers | image (compressed) | not shared by all | % | a node holding "
            f"{r['profile']} pulls |",
            "|---|---|---|---|---|---|---|",
        ]
        for n, x in per.items():
            t = pr["build_s"].get(n)
            out.append(
                f"| {n} | {s(t) if t else '(baseline)'} | {x['layers']} | {gb(x['compressed_bytes'])} | "
                f"{size(x['unique_bytes'])} | {x['unique_pct']:.4f}% | {size(x['second_profile_pull_bytes'])} |"
            )
        out.append("")
    notes = ["### Notes", ""]
    if c:
        notes.append(
            f"- Cold: `docker builder prune -af` before each side, which empties pip's cache mount too, "
            f"so both download every wheel (~100 MB/s here). Plain went first, the tool second, so "
            f"the BuildKit cache the later cases use is the tool's. The tool's time includes the "
            f"in-image checks (imports of 270+ modules, pip check, probes, entry points) and the "
            f"source fetch from the local mirror; plain's is the build alone. Plain steps: {c['plain_steps']}."
            + (
                f" The checks are most of the difference: the other profiles, whose build is the mode layer "
                f"only, take {s(min(pr['build_s'].values()))}-{s(max(pr['build_s'].values()))} with checks and push."
                if pr
                else ""
            )
        )
    if w:
        notes.append(
            f"- Warm no-op: the tool answers from its memo (mtpimage/assembly/fastpath.py): a sha256 over the "
            f"bytes of the manifests, lock, package, templates and checks, the command line and "
            f"MTP_*/DOCKER_* variables, then two `GET /images/{{ref}}/json` on dockerd's socket. Any "
            f"changed input misses and runs the full path ({s(med(w['tool_full_path_s']))}); "
            f"tests/unit/test_fastpath.py changes each input in turn. Plain docker must upload the "
            f"{size(r.get('context_bytes', 0))} context (the git sources) and check every step "
            f"({w['plain_steps']}). Bare `python -c pass`: {s(w['python_startup_s'])}. Single runs, "
            f"s: tool {[round(x, 3) for x in w['tool_s']]}, plain {[round(x, 2) for x in w['plain_s']]}."
        )
    if f:
        notes.append(
            f"- Fresh builder: this run's local images removed and the BuildKit cache pruned before "
            f"each side (one run each: every plain run pulls the whole image). The base image stayed "
            f"local for both. The tool asks the registry for the content tag and the profile tag and "
            f"stops; plain `--cache-from` pulls every layer ({s(f['pull_s'])} for a plain "
            f"`docker pull` of the same image). Plain steps: {f['plain_steps']}."
        )
    notes.append(
        "- Bumps are compared with the cold plain build, the rebuild a user without a layer cache "
        "pays. Plain `docker build` of the bumped context on the same warm cache would rebuild the "
        "same layers, because the layer order is the rendered Dockerfile's; what the tool adds there "
        "is the order itself, the relock and the checks."
    )
    notes.append(
        "- Only short unit-test runs (seconds each) shared the 2 cores during the run; no other build or "
        "push ran on this dockerd."
    )
    return out + notes + [""]


def chart(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    tool_c, plain_c = "#1f77b4", "#aaaaaa"
    ax = axes[0]
    labels, tool, plain = [], [], []
    if r.get("warm"):
        labels.append("no-op, image local")
        tool.append(med(r["warm"]["tool_s"]))
        plain.append(med(r["warm"]["plain_s"]))
    if r.get("fresh"):
        labels.append("no-op, image in registry")
        tool.append(r["fresh"]["tool_s"])
        plain.append(r["fresh"]["plain_s"])
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], tool, 0.4, color=tool_c, label="python build.py")
    ax.bar([x + 0.2 for x in xs], plain, 0.4, color=plain_c, label="docker build")
    for x, t, p in zip(xs, tool, plain):
        ax.text(x - 0.2, t, f"{t:.2f}s", ha="center", va="bottom", fontsize=9)
        ax.text(x + 0.2, p, f"{p:.1f}s", ha="center", va="bottom", fontsize=9)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds (log)")
    ax.set_title("No-op, real-stack image")
    ax.legend(fontsize=8)

    ax = axes[1]
    names, secs, pushed = [], [], []
    if r.get("cold"):
        names.append("full rebuild\n(cold, plain)")
        secs.append(r["cold"]["plain_s"])
        pushed.append(r["push"]["compressed_bytes"])
    for key, label in (("bump_sglang_patch", "sglang patch\n(middle)"), ("bump_verl", "verl commit\n(top)")):
        if r.get(key):
            names.append(label)
            secs.append(r[key]["lock_s"] + r[key]["s"])
            pushed.append(r[key]["pushed_bytes"])
    ax.bar(names, secs, color=[plain_c] + [tool_c] * (len(names) - 1))
    for i, (t, p) in enumerate(zip(secs, pushed)):
        ax.text(i, t, f"{t:.0f}s\n{size(p)} pushed", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, max(secs or [1]) * 1.3)
    ax.set_ylabel("seconds (lock + build + checks + push)")
    ax.set_title("One pin bumped")

    ax = axes[2]
    c = r.get("cold")
    if c:
        rows = c["history"]
        names = [h["created_by"].replace("RUN install ", "")[:28] for h in rows]
        ax.barh(range(len(rows)), [h["size"] / 1e9 for h in rows], color=tool_c)
        ax.set_yticks(range(len(rows)), names, fontsize=7)
        ax.set_xlabel("GB uncompressed")
        ax.set_title("Layers, bottom (base) to top")
    fig.suptitle("MTP image builder on the real stack (bench/real_stack.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
