"""Reuse of in-image checks that cannot have changed (docs/checks.md, "In-image checks").

Everything below an image's mode layer (the last layer: `COPY mtp/ /opt/mtp/`, with only
ENV and LABEL after it) depends on the pins alone, so an image whose lower layers are those
of an image that passed its checks has the same installed files. The checks whose verdict
depends only on those files and on what they read from the mode layer (run_checks.py's
REUSABLE groups: imports, pip-check, versions, probes; what they read from the mode layer is
hashed in the image as their `inputs`) need not run again there.

The record, one file per set of lower layers under `<cache root>/checks/<key>.json`, key =
sha256 of the lower layers' diff IDs and the image's environment without the mode layer's
own variables:
    {"schema": 2, "groups": {GROUP: {INPUTS: {"image": "sha256:<ID of the image whose run
     proved it>", "results": [that run's results of GROUP]}}}}
Written after a run, for each group that ran there and did not fail; one proof per inputs, so
profiles whose mode layers differ in a group's inputs (their probes) keep theirs side by side.
The next image with the same key gets `--reuse GROUP=INPUTS` for each recorded proof (the
newest PROOFS_PER_GROUP per group); run_checks.py reports a group
whose inputs are unchanged as a placeholder, replaced here by the recorded results with
status `reused` and `proved_by` (that image's ID). --full-checks skips the lookup (the record
is still written).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

REUSED = "reused"
PROOFS_PER_GROUP = 8  # bounds the command line; the oldest proofs go first
MODE_LAYER = "COPY mtp/ /opt/mtp/"  # images/partials/mode.j2
# Dockerfile instructions that change only the image config, never a layer.
CONFIG_ONLY = (
    "ENV",
    "LABEL",
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "USER",
    "SHELL",
    "ARG",
    "STOPSIGNAL",
    "HEALTHCHECK",
)


def _instruction(created_by: str) -> str:
    """The Dockerfile instruction of a history row (BuildKit's, or the classic builder's
    `/bin/sh -c #(nop)  ENV ...`)."""
    text = created_by.split("#(nop)", 1)[1] if "#(nop)" in created_by else created_by
    return text.strip()


def mode_env_keys(history: list[tuple[int, str]]) -> set[str] | None:
    """The ENV keys the mode layer sets (the rows after its COPY), or None when the image's
    last layer-making row is not the mode layer's COPY (not an image of this tool)."""
    rows = [_instruction(created) for _size, created in history]
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].split(" ", 1)[0] in CONFIG_ONLY:
            continue
        if not rows[i].startswith(MODE_LAYER):
            return None
        keys = set()
        for row in rows[i + 1 :]:
            if row.startswith("ENV "):
                keys |= {part.split("=", 1)[0] for part in row[4:].split() if "=" in part}
        return keys
    return None


def lower_key(layers: list[str], env: list[str], history: list[tuple[int, str]]) -> str | None:
    """The key of an image's lower layers: their diff IDs and the environment they run in
    (the image's Env without the mode layer's own variables). None: no mode layer on top."""
    keys = mode_env_keys(history)
    if keys is None or len(layers) < 2:
        return None
    env = sorted(e for e in env if e.split("=", 1)[0] not in keys)
    blob = json.dumps({"lower_layers": layers[:-1], "env": env}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def record_path(root: Path, key: str) -> Path:
    return root / "checks" / f"{key}.json"


def load(root: Path, key: str) -> dict:
    try:
        data = json.loads(record_path(root, key).read_text())
    except (OSError, ValueError):
        return {"groups": {}}  # none yet, or unreadable: the checks run in full and rewrite it
    return data if isinstance(data.get("groups"), dict) and data.get("schema") == 2 else {"groups": {}}


def save(root: Path, key: str, record: dict) -> None:
    """Replaced whole (temporary file + rename): a reader never sees half a record."""
    path = record_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record-")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def reuse_args(record: dict) -> list[str]:
    pairs = [(gid, d) for gid, proofs in sorted(record["groups"].items()) for d in sorted(proofs)]
    return [a for gid, d in pairs for a in ("--reuse", f"{gid}={d}")]


def expand(results: list[dict], record: dict) -> list[dict]:
    """Each placeholder of a reused group replaced by the results that proved it."""
    out = []
    for r in results:
        proof = record["groups"].get(r.get("group", ""), {}).get(r.get("inputs", ""), {})
        if r.get("status") != REUSED:
            out.append(r)
        elif proof.get("results"):
            # this run spent no time on them: their time was the proving run's
            # a skip stays a skip: reusing it proves nothing, and REUSED would read as a pass
            out += [
                {
                    **p,
                    "status": p["status"] if p["status"] == "skip" else REUSED,
                    "was": p["status"],
                    "proved_by": proof["image"],
                    "seconds": 0.0,
                }
                for p in proof["results"]
            ]
        else:  # run_checks.py only reuses what it was told to: a record that changed meanwhile
            out.append(
                {**r, "status": "fail", "detail": "reused, but the record of the run that proved it is gone"}
            )
    return out


def remember(record: dict, results: list[dict], image_id: str) -> bool:
    """Record each group that ran here and did not fail, proved by this image. True if any."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r.get("inputs") and r.get("status") != REUSED:
            groups.setdefault(r["group"], []).append(r)
    for gid, rs in groups.items():
        proofs = record["groups"].setdefault(gid, {})
        proofs.pop(rs[0]["inputs"], None)  # a failed group is never reused; a passed one moves up
        if not any(r["status"] == "fail" for r in rs):
            proofs[rs[0]["inputs"]] = {"image": image_id, "results": rs}
        for old in list(proofs)[:-PROOFS_PER_GROUP]:
            del proofs[old]
    record["schema"] = 2
    return bool(groups)
