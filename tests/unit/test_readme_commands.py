"""#50 item 1: every command README.md shows runs as shown, with the result it describes.

The commands are read from the README itself: each line of its ```bash blocks and each inline
`python3 build.py ...` or `scripts/...` span. Those that answer offline in seconds run through
cli.main exactly as written (the main job as a dry run: it would build); the others (Docker,
the network, GPUs) must parse as written, and their `--help` must answer. A README edit that
adds a command needing one more flag fails here, as `explain --cluster slurm --registry REG`
(no --target, and no image published) would have.
"""

from __future__ import annotations

import json
import re
import shlex
import stat

import pytest

from tests.unit.helpers import REPO, run_main

README = (REPO / "README.md").read_text(encoding="utf-8")
DIGEST = "sha256:" + "ab" * 32
# README placeholders, as a reader fills them in
PLACEHOLDERS = {
    "sha256:...": DIGEST,
    "REF": f"127.0.0.1:5000/my-org/mtp-verl@{DIGEST}",
}
# A model with MTP layers (MiMo's config as the README asks for it): explain passes on it.
MODEL_CONFIG = {"model_type": "mimo", "num_nextn_predict_layers": 1, "max_position_embeddings": 32768}
# Commands that run here: list, check, explain, the main job (as a dry run) and --help.
OFFLINE = {"list", "check", "explain", None, "--help"}
# What needs Docker, the network or GPUs: parsed as written, not run.
NEEDS_MORE = ("--probe-sources",)


def block_lines(text: str) -> list[str]:
    """Each line of the ```bash blocks of `text`, its trailing comment cut."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def readme_commands() -> list[str]:
    out = block_lines(README)
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if span.startswith(("python3 build.py", "scripts/", "sudo bash scripts/")):
            out.append(span)
    return list(dict.fromkeys(out))


def argv_of(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:2] == ["python3", "build.py"], command
    return [PLACEHOLDERS.get(w, w) for w in words[2:]]


def subcommand(argv: list[str]) -> str | None:
    """The COMMAND of argv (None: the main job); "--help" for a help request."""
    from mtpimage import cli

    if "--help" in argv:
        return "--help"
    return cli.make_parser().parse_args(argv).command


def verify_block() -> list[str]:
    """README's "Verify the image you pulled", as outputs/reproduce.py writes it for the publish
    job's summary, with the README's placeholders (the same lines, so the two cannot drift)."""
    from mtpimage.outputs import reproduce

    image = "ghcr.io/my-org/mtp-verl@sha256:..."
    how = reproduce.Reproduce(
        profile="mtp-detach",
        image=image,
        source="https://github.com/my-org/mtp-image-builder",
        revision=reproduce.REVISION_PLACEHOLDER,
        wheel_share="ghcr.io/my-org/mtp-ext-wheels",
    )
    return [reproduce.label_command(image), *reproduce.commands(how)]


def sign_block() -> list[str]:
    """README's signature check, as the sign-index job's summary prints it (outputs/workflow.py:
    the index, then a platform's image it lists), with the README's placeholders: the same
    lines, so the two cannot drift. Its job-script block (explain) is not repeated there."""
    from mtpimage.outputs import workflow

    text = workflow.verify_summary(
        "mtp-detach", "ghcr.io/my-org/mtp-verl@sha256:INDEX", "my-org/mtp-image-builder", index=True
    )
    explain = text.index("python3 build.py explain")
    return list(dict.fromkeys(block_lines(text[:explain])))


COMMANDS = readme_commands()
VERIFY = verify_block()
SIGN = sign_block()
TOOL = [c for c in COMMANDS if c.startswith("python3 build.py")]
SCRIPTS = [c for c in COMMANDS if not c.startswith("python3 build.py") and c not in VERIFY + SIGN]


def test_the_readme_shows_its_commands():
    # the two commands, the demo, the five most used and the second block at least
    assert len(TOOL) >= 15, TOOL
    assert "python3 build.py --profile mtp-cp-recompute" in TOOL
    assert any("--cluster slurm" in c and "--digest" in c for c in TOOL), "the way to see a job script first"


@pytest.mark.parametrize("command", SCRIPTS)
def test_each_script_the_readme_names_is_there_and_executable(command):
    words = shlex.split(command)
    path = REPO / next(w for w in words if w.startswith("scripts/"))
    assert path.is_file(), command
    if words[0].startswith("scripts/"):  # run as a program, not through bash
        assert path.stat().st_mode & stat.S_IXUSR, f"{path} is not executable"


@pytest.mark.parametrize("command", TOOL)
def test_each_readme_command_parses_as_written(command):
    argv = argv_of(command)
    try:
        subcommand(argv)
    except SystemExit as exc:  # argparse: a missing or unknown flag
        pytest.fail(f"{command!r} does not parse (exit {exc.code})")
    help_argv = [argv[0], "--help"] if argv and not argv[0].startswith("-") else ["--help"]
    proc = run_main(*help_argv)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), (help_argv, proc.stderr)


@pytest.mark.parametrize("command", [c for c in TOOL if not any(flag in c for flag in NEEDS_MORE)])
def test_each_offline_readme_command_runs_as_written(command, tmp_path, monkeypatch):
    argv = argv_of(command)
    which = subcommand(argv)
    if which not in OFFLINE:
        pytest.skip(f"`{which}` needs Docker, the network or GPUs here: parsed and --help only")
    if which is None and "--help" not in argv and "--dry-run" not in argv:
        argv.append("--dry-run")  # the main job builds; its dry run answers without Docker
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    if "--cluster" in argv and "--digest" not in argv:
        # the README says: a job pinned to the digest the registry has for the tested image
        from mtpimage.publish.registryclient import RegistryClient

        manifest = {"layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip"}]}
        monkeypatch.setattr(
            RegistryClient,
            "manifest",
            lambda self, repo, ref, *a, **k: (json.dumps(manifest).encode(), DIGEST),
        )
    proc = run_main(*argv, cwd=tmp_path)
    if "--set" in argv:  # README: this pin fails rule recompute-padding-mask
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert "ERROR recompute-padding-mask" in proc.stdout
        return
    assert proc.returncode == 0, (command, proc.stderr)
    assert "Traceback" not in proc.stderr
    if "--cluster" in argv:
        assert f"@{DIGEST}" in proc.stdout and proc.stdout.startswith("#!/bin/bash"), proc.stdout[:300]
        if "--digest" not in argv:  # the layer format the registry's manifest names
            assert "# Layers: gzip (from the registry's manifest)" in proc.stdout
    if "--json" in argv:
        json.loads(proc.stdout)


def test_no_readme_command_needs_python_named_python():
    """Stock Debian 12 has python3 only (README): no command of the page says `python build.py`."""
    assert "python build.py" not in README
    others = [c for c in COMMANDS if c not in VERIFY + SIGN]
    assert all(c.startswith(("python3 ", "scripts/", "sudo ")) for c in others), others


def test_the_verify_section_is_what_the_publish_job_prints():
    """#48: the README's way to verify a pulled image is the publish summary's, line for line."""
    start = COMMANDS.index(VERIFY[0])
    assert COMMANDS[start : start + len(VERIFY)] == VERIFY


def test_the_signature_check_is_what_the_sign_index_job_prints():
    """#49: the README's signature check names the index and a platform's image it lists, line
    for line as the sign-index job's summary does, with the workflow's identity."""
    assert any(c.startswith("cosign verify ghcr.io/my-org/mtp-verl@sha256:INDEX") for c in SIGN)
    assert any(c.startswith("cosign verify ghcr.io/my-org/mtp-verl@sha256:PLATFORM_DIGEST") for c in SIGN)
    assert any("--certificate-identity-regexp" in c and "my-org/mtp-image-builder" in c for c in SIGN)
    start = COMMANDS.index(SIGN[0])
    assert COMMANDS[start : start + len(SIGN)] == SIGN


def test_the_verify_sections_git_lines_check_out_a_revision(tmp_path):
    """The clone, cd and checkout lines run as written, on this repository for the project's
    URL and its HEAD for REVISION: the checkout ends at that commit."""
    import subprocess

    from mtpimage.outputs import reproduce

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.returncode == 0, head.stderr
    lines = [c for c in VERIFY if c.startswith(("git ", "cd "))]
    script = "\n".join(lines).replace("https://github.com/my-org/mtp-image-builder", str(REPO))
    script = script.replace(reproduce.REVISION_PLACEHOLDER, head.stdout.strip())
    proc = subprocess.run(
        ["bash", "-eu", "-c", script + "\ngit rev-parse HEAD"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == head.stdout.strip()


def test_the_label_the_readme_reads_is_the_one_builds_write():
    from mtpimage.assembly.versionvector import identity_labels
    from mtpimage.outputs import reproduce
    from mtpimage.settings import NAMES

    assert reproduce.REVISION_LABEL in identity_labels("x")  # this checkout: a git repository
    assert f'"{reproduce.REVISION_LABEL}"' in VERIFY[0]
    assert VERIFY[-2].split("=", 1)[0] == "export MTP_WHEEL_CACHE_REPO" and "MTP_WHEEL_CACHE_REPO" in NAMES


def test_placeholders_stay_placeholders():
    # what the test fills in must be what a reader would: no placeholder reaches a command run
    for command in TOOL:
        assert "<" not in command and not re.search(r"\bREG\b", command), command
