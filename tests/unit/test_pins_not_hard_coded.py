"""#36 item 14: a weekly bump of a shipped pin (verl's main moves daily) must break no test of
the project but the shipped golden renders (docs/extending.md, "Bump a pin"): unit tests read
the pins from manifests/components.yaml (helpers.pin). A commit written in a test is allowed
only where it is a fact the rules know (mtpimage/data/rules.yaml), not the current pin."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def shipped_pins() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "manifests" / "components.yaml").read_text())
    pins = {f"components.{n}.commit": c["commit"] for n, c in doc["components"].items() if c.get("commit")}
    for n, p in doc["packages"].items():
        commit = ((p.get("build") or {}).get("git") or {}).get("commit")
        if commit:
            pins[f"packages.{n}.build.git.commit"] = commit
    return pins


def hard_coded(texts: dict[str, str], pins: dict[str, str], facts: str) -> list[str]:
    return [
        f"{name} hard-codes {what} ({commit[:12]}): read it with helpers.pin"
        for name, text in sorted(texts.items())
        for what, commit in sorted(pins.items())
        if commit in text and commit not in facts
    ]


def test_no_unit_test_hard_codes_a_shipped_pin():
    texts = {p.name: p.read_text() for p in sorted((REPO / "tests" / "unit").glob("*.py"))}
    facts = (REPO / "mtpimage" / "data" / "rules.yaml").read_text()
    assert hard_coded(texts, shipped_pins(), facts) == []


def test_the_scan_finds_a_hard_coded_pin():
    pins = {"components.verl.commit": "ab" * 20}
    text = 'assert labels["revision"] == "' + "ab" * 20 + '"'
    assert hard_coded({"t.py": text}, pins, facts="") == [
        "t.py hard-codes components.verl.commit (abababababab): read it with helpers.pin"
    ]
    assert hard_coded({"t.py": text}, pins, facts=text) == []
