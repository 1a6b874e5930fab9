"""Small, real git repositories that stand in for the upstreams of the MTP stack.

Every repository is built with the git CLI from fixed file contents, with fixed author,
committer and dates, so its commit hashes are the same on every run and every machine.
Each one is a pip-installable project (setuptools, pyproject.toml) that imports without
torch, so tests can install it into a plain Debian image with
``pip install --no-build-isolation --no-deps`` and exercise the real behaviour
(e.g. the recompute ``TypeError`` of the broken Megatron commit).

They live in the package, not under tests/, because `build.py demo` (demo/run.py) serves
them too: the demo and the end-to-end tests build from the same stand-ins. Helpers only tests
need (moving a branch, exporting a tree) stay in tests/fixtures/gitrepos.py.

Layout written by :func:`build_fixture_repos` under ``root``::

    root/git/<owner>/<name>.git      bare repositories, what a git server exports
    root/checkouts/<owner>/<name>/   working repositories the histories are made in

Repositories (owner/name as on GitHub, so ``url.<loopback>.insteadOf=https://github.com/<owner>/``
lets manifests keep their real URLs):

=====================  ======================================  =================================
attribute              served as                               ``commits`` keys
=====================  ======================================  =================================
``megatron``           NVIDIA/Megatron-LM                      generic, broken, fixed
``sglang``             sgl-project/sglang, ArronHZG/sglang     without_fix (main, the fork's base),
                                                               fix_only, with_fix (the fork's head)
``mbridge``            ISEEKYAN/mbridge, ArronHZG/mbridge      uses_encoder_and_decoder,
                                                               no_encoder_and_decoder
``megatron_bridge``    NVIDIA-NeMo/Megatron-Bridge             without_mimo, with_mimo
``verl``               verl-project/verl, volcengine/verl      initial, mtp_patch
=====================  ======================================  =================================

``refs`` maps full ref names (``refs/heads/main``, ``refs/tags/core_v0.18.0-standin``) to the
commit they point at (tags peeled).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

AUTHOR_NAME = "MTP Fixture Bot"
AUTHOR_EMAIL = "fixtures@mtp-image-builder.invalid"
# 2025-01-01T00:00:00Z; every commit of a repository is one day after the previous one.
EPOCH = 1735689600
DAY = 86400


# ----------------------------------------------------------------------------- git plumbing


def git_env(when: int | None = None) -> dict[str, str]:
    """Environment for deterministic git commands: no user/system config, fixed identity."""
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("GIT_") and key not in ("GIT_EXEC_PATH",):
            del env[key]
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        TZ="UTC",
        LC_ALL="C",
    )
    if when is not None:
        stamp = f"@{when} +0000"
        env["GIT_AUTHOR_DATE"] = stamp
        env["GIT_COMMITTER_DATE"] = stamp
    return env


def git(cwd: Path, *args: str, when: int | None = None, input: str | None = None) -> str:
    """Run ``git -C cwd args...`` deterministically and return its stdout (stripped)."""
    proc = subprocess.run(
        ["git", "-C", str(cwd), "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
        env=git_env(when),
        input=input,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stderr}")
    return proc.stdout.strip()


@dataclasses.dataclass
class FixtureRepo:
    """One stand-in repository.

    ``path`` is the bare repository a git server exports; ``work`` the repository its
    history was made in (tests should not rely on what is checked out there).
    ``commits`` names the commits tests care about; ``refs`` maps ref names to commits.
    """

    owner: str
    name: str
    path: Path
    work: Path
    commits: dict[str, str]
    refs: dict[str, str]
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def github_url(self) -> str:
        return f"https://github.com/{self.owner}/{self.name}.git"

    def alias_url(self, owner: str) -> str:
        for o, n in self.aliases:
            if o == owner:
                return f"https://github.com/{o}/{n}.git"
        raise KeyError(f"{self.owner}/{self.name} has no alias under {owner}")

    def rev(self, ref: str) -> str:
        """The commit a ref (branch, tag, sha) of the served repository points at."""
        return git(self.path, "rev-parse", "--verify", f"{ref}^{{commit}}")

    def refresh_refs(self) -> dict[str, str]:
        out = git(self.path, "for-each-ref", "--format=%(refname) %(objectname) %(*objectname)")
        refs = {}
        for line in out.splitlines():
            parts = line.split()
            refs[parts[0]] = parts[2] if len(parts) > 2 and parts[2] else parts[1]
        self.refs = refs
        return refs


class _Builder:
    """Makes a history in a work repository and mirrors it into a bare repository."""

    def __init__(self, root: Path, owner: str, name: str, aliases: Iterable[tuple[str, str]] = ()):
        self.owner, self.name = owner, name
        self.aliases = tuple(aliases)
        self.work = root / "checkouts" / owner / name
        self.bare = root / "git" / owner / f"{name}.git"
        self.commits: dict[str, str] = {}
        self.tick = 0
        self.work.mkdir(parents=True)
        git(self.work, "init", "-q", "-b", "main")

    def _when(self) -> int:
        self.tick += 1
        return EPOCH + self.tick * DAY

    def commit(self, message: str, files: Mapping[str, str | None], key: str | None = None) -> str:
        write_files(self.work, files)
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--no-verify", "-m", message, when=self._when())
        sha = git(self.work, "rev-parse", "HEAD")
        if key:
            self.commits[key] = sha
        return sha

    def branch(self, name: str, start: str = "HEAD") -> None:
        git(self.work, "checkout", "-q", "-B", name, start)

    def checkout(self, ref: str) -> None:
        git(self.work, "checkout", "-q", ref)

    def tag(self, name: str, rev: str, message: str | None = None) -> None:
        git(self.work, "tag", "-a", "-m", message or name, name, rev, when=self._when())

    def finish(self, head: str = "main") -> FixtureRepo:
        self.checkout(head)
        self.bare.parent.mkdir(parents=True, exist_ok=True)
        git(self.bare.parent, "init", "-q", "--bare", "-b", head, str(self.bare))
        for key, value in (
            ("uploadpack.allowAnySHA1InWant", "true"),
            ("uploadpack.allowReachableSHA1InWant", "true"),
            ("uploadpack.allowTipSHA1InWant", "true"),
            ("uploadpack.allowFilter", "true"),
            ("daemon.uploadpack", "true"),
        ):
            git(self.bare, "config", key, value)
        git(self.work, "push", "-q", "--mirror", str(self.bare))
        # Aliases (forks, renamed organisations) are the same repository under another path.
        for owner, name in self.aliases:
            link = self.bare.parent.parent / owner / f"{name}.git"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(os.path.relpath(self.bare, link.parent))
        repo = FixtureRepo(
            owner=self.owner,
            name=self.name,
            path=self.bare,
            work=self.work,
            commits=dict(self.commits),
            refs={},
            aliases=self.aliases,
        )
        repo.refresh_refs()
        return repo


def write_files(root: Path, files: Mapping[str, str | None]) -> None:
    """Write ``{relative path: text}`` under root; ``None`` deletes the file."""
    for rel, text in sorted(files.items()):
        path = root / rel
        if text is None:
            if path.exists():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# ----------------------------------------------------------------------------- Megatron-LM


def _pyproject(name: str, version: str, include: str, extra: str = "") -> str:
    return _dedent(
        f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "{version}"
        description = "Stand-in for {name} used by the MTP image builder's tests"
        requires-python = ">=3.9"
        {extra}
        [tool.setuptools.packages.find]
        include = ["{include}"]
        namespaces = true
        """
    )


def _megatron_common(version: tuple[int, int, int, str]) -> dict[str, str]:
    major, minor, patch, pre = version
    ver = f"{major}.{minor}.{patch}{pre}"
    return {
        "pyproject.toml": _pyproject("megatron-core", ver, "megatron.core*"),
        "README.md": "Stand-in for NVIDIA/Megatron-LM (megatron-core) used by tests.\n",
        "megatron/core/__init__.py": _dedent(
            """
            from megatron.core.package_info import __version__

            __all__ = ["__version__"]
            """
        ),
        "megatron/core/package_info.py": _dedent(
            f"""
            MAJOR = {major}
            MINOR = {minor}
            PATCH = {patch}
            PRE_RELEASE = {pre!r}

            VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
            __shortversion__ = ".".join(map(str, VERSION[:3]))
            __version__ = __shortversion__ + VERSION[3]
            __package_name__ = "megatron_core"
            """
        ),
        "megatron/core/transformer/__init__.py": "",
        "megatron/core/transformer/transformer_config.py": _dedent(
            """
            from dataclasses import dataclass
            from typing import Optional


            @dataclass
            class TransformerConfig:
                num_layers: int = 2
                hidden_size: int = 64
                mtp_num_layers: Optional[int] = None
                mtp_loss_scaling_factor: float = 0.1
                recompute_granularity: Optional[str] = None
                recompute_method: Optional[str] = None
                recompute_num_layers: Optional[int] = None
            """
        ),
    }


_MEGATRON_ENUMS_OLD = _dedent(
    """
    import enum


    class ModelType(enum.Enum):
        encoder_or_decoder = 1
        encoder_and_decoder = 2
        retro_encoder = 3
        retro_decoder = 4
    """
)

_MEGATRON_ENUMS_NEW = _dedent(
    """
    import enum


    class ModelType(enum.Enum):
        encoder_or_decoder = 1
        retro_encoder = 3
        retro_decoder = 4
    """
)

_MTP_HEADER = _dedent(
    """
    # Stand-in for megatron/core/transformer/multi_token_prediction.py: no torch, but the
    # signatures (and so the recompute behaviour) follow upstream.
    from megatron.core.transformer.transformer_config import TransformerConfig


    class MultiTokenPredictionLayer:
        def __init__(self, config: TransformerConfig, layer_number: int = 1):
            self.config = config
            self.layer_number = layer_number
            self.training = True
            self.calls = []

        def _proj_and_transformer_layer(self, hidden_states, attention_mask, **kwargs):
            self.calls.append(("_proj_and_transformer_layer", sorted(kwargs)))
            return hidden_states

    """
)

# Commit "generic" (like dev 23e092f): forward has no padding_mask, generic checkpoint wrapper.
_MTP_GENERIC = _MTP_HEADER + textwrap.indent(
    _dedent(
        """
        def forward(
            self,
            input_ids,
            position_ids,
            hidden_states,
            attention_mask,
            context=None,
            context_mask=None,
            rotary_pos_emb=None,
            rotary_pos_cos=None,
            rotary_pos_sin=None,
            attention_bias=None,
            inference_params=None,
            packed_seq_params=None,
            sequence_len_offset=None,
        ):
            if self.config.recompute_granularity == "full" and self.training:
                return self._checkpointed_forward(
                    self._proj_and_transformer_layer,
                    hidden_states=hidden_states,
                    attention_mask=attention_mask,
                    context=context,
                    rotary_pos_emb=rotary_pos_emb,
                )
            return self._proj_and_transformer_layer(
                hidden_states=hidden_states, attention_mask=attention_mask, context=context
            )

        def _checkpointed_forward(self, forward_func, *args, **kwargs):
            self.calls.append(("_checkpointed_forward", sorted(kwargs)))
            return forward_func(*args, **kwargs)
        """
    ),
    "    ",
)


def _mtp_explicit(with_padding_mask: bool) -> str:
    """forward takes padding_mask; _checkpointed_forward has explicit parameters, with
    padding_mask (fixed) or without it and without **kwargs (broken)."""
    body = _dedent(
        """
        def forward(
            self,
            input_ids,
            position_ids,
            hidden_states,
            attention_mask,
            context=None,
            context_mask=None,
            rotary_pos_emb=None,
            rotary_pos_cos=None,
            rotary_pos_sin=None,
            attention_bias=None,
            inference_params=None,
            packed_seq_params=None,
            sequence_len_offset=None,
            padding_mask=None,
        ):
            if self.config.recompute_granularity == "full" and self.training:
                return self._checkpointed_forward(
                    hidden_states=hidden_states,
                    attention_mask=attention_mask,
                    context=context,
                    context_mask=context_mask,
                    rotary_pos_emb=rotary_pos_emb,
                    rotary_pos_cos=rotary_pos_cos,
                    rotary_pos_sin=rotary_pos_sin,
                    attention_bias=attention_bias,
                    inference_params=inference_params,
                    packed_seq_params=packed_seq_params,
                    sequence_len_offset=sequence_len_offset,
                    padding_mask=padding_mask,
                )
            return self._proj_and_transformer_layer(
                hidden_states=hidden_states, attention_mask=attention_mask, padding_mask=padding_mask
            )

        def _checkpointed_forward(
            self,
            hidden_states,
            attention_mask,
            context=None,
            context_mask=None,
            rotary_pos_emb=None,
            rotary_pos_cos=None,
            rotary_pos_sin=None,
            attention_bias=None,
            inference_params=None,
            packed_seq_params=None,
            sequence_len_offset=None,
            padding_mask=None,  # @@PM@@
        ):
            self.calls.append(("_checkpointed_forward", []))
            return self._proj_and_transformer_layer(
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                padding_mask=padding_mask,  # @@PM@@
            )
        """
    )
    lines = []
    for line in body.splitlines(keepends=True):
        if "# @@PM@@" in line:
            if not with_padding_mask:
                continue
            line = line.replace("  # @@PM@@", "")
        lines.append(line)
    return _MTP_HEADER + textwrap.indent("".join(lines), "    ")


MTP_PATH = "megatron/core/transformer/multi_token_prediction.py"


def make_megatron(root: Path) -> FixtureRepo:
    b = _Builder(root, "NVIDIA", "Megatron-LM")
    files = _megatron_common((0, 16, 0, "rc0"))
    files["megatron/core/enums.py"] = _MEGATRON_ENUMS_OLD
    files[MTP_PATH] = _MTP_GENERIC
    b.commit("MTP with context parallelism (generic checkpointed forward)", files, key="generic")
    b.branch("dev")
    b.checkout("main")
    files = _megatron_common((0, 18, 0, ""))
    files["megatron/core/enums.py"] = _MEGATRON_ENUMS_NEW
    files[MTP_PATH] = _mtp_explicit(with_padding_mask=False)
    b.commit(
        "Pass padding_mask through MTP; remove ModelType.encoder_and_decoder",
        files,
        key="broken",
    )
    b.tag("core_v0.18.0-standin", "HEAD", "Megatron Core 0.18.0 (stand-in, has the recompute bug)")
    files = _megatron_common((0, 19, 0, ""))
    files[MTP_PATH] = _mtp_explicit(with_padding_mask=True)
    b.commit("Fix MTP recompute: accept padding_mask in _checkpointed_forward", files, key="fixed")
    b.tag("core_v0.19.0-standin", "HEAD", "Megatron Core 0.19.0 (stand-in, fixed)")
    return b.finish("main")


# ----------------------------------------------------------------------------- sglang

# A stand-in for sglang and for a fork carrying a fix on a branch, in this project's own
# words: what matters is the shape (the real fix's file names and function name, a fix made
# of commits on top of a merge-base, a branch that also adds a test), not upstream's code.
# main ("without_fix"): each runner opens a shared handle itself, so the speculative worker
# opens every handle twice. Branch fix_mtp_update_weights_from_tensor: a fix commit (opens
# each handle once, in unwrap_ipc_tensors) and a test commit; its head is "with_fix", and
# main is its merge-base. Manifests pin that fix by reference: repo, base, head and
# SGLANG_FIX_PATHS (the test file is left out, as the shipped manifests leave upstream's out).
SGLANG_RUNNER = "python/sglang/srt/model_executor/model_runner.py"
SGLANG_WORKER = "python/sglang/srt/speculative/eagle_worker.py"
SGLANG_FIX_PATHS = (SGLANG_RUNNER, SGLANG_WORKER)
# The sha256 of the fix as the tool makes it (sources.commit_diff of SGLANG_FIX_PATHS, the
# fork's merge-base against its head): what a manifest pins. The commits are deterministic, so
# this is too; tests/manifests pins the same value and the demo's manifests use this one.
SGLANG_FIX_SHA256 = "d0757f71b1169f0a7759459dd28a843b93bf5c502f9bd1df38d4ca5ccbae1863"

_SGLANG_RUNNER_BASE = _dedent(
    '''
    """Stand-in model runner: keeps the weights it is sent."""


    class SharedTensor:
        """A value behind a handle; every open() maps it again (like a CUDA IPC handle)."""

        def __init__(self, value):
            self.value = value
            self.opened = 0

        def open(self):
            self.opened += 1
            return self.value


    class ModelRunner:
        def __init__(self):
            self.weights = {}

        def update_weights_from_tensor(self, named_tensors):
            for name, tensor in named_tensors:
                self.weights[name] = tensor.open() if isinstance(tensor, SharedTensor) else tensor
            return True
    '''
)

_SGLANG_UNWRAP = "\n\n" + _dedent(
    '''
    def unwrap_ipc_tensors(named_tensors):
        """Open each shared handle once; the runners then share the plain values."""
        return [(name, t.open() if isinstance(t, SharedTensor) else t) for name, t in named_tensors]
    '''
)


def _sglang_worker(fixed: bool) -> str:
    imports = "ModelRunner, unwrap_ipc_tensors" if fixed else "ModelRunner"
    take = "unwrap_ipc_tensors(named_tensors)" if fixed else "list(named_tensors)"
    return _dedent(
        f'''
        """Stand-in speculative worker: a draft runner and a target runner take the same weights."""

        from sglang.srt.model_executor.model_runner import {imports}


        class EAGLEWorker:
            def __init__(self):
                self.draft = ModelRunner()
                self.target = ModelRunner()

            def update_weights_from_tensor(self, named_tensors):
                named_tensors = {take}
                return (self.draft.update_weights_from_tensor(named_tensors)
                        and self.target.update_weights_from_tensor(named_tensors))
        '''
    )


_SGLANG_FILES: dict[str, str] = {
    "python/pyproject.toml": _pyproject("sglang", "0.5.12", "sglang*"),
    "README.md": "Stand-in for sgl-project/sglang used by tests (package in python/).\n",
    "python/sglang/__init__.py": '__version__ = "0.5.12"\n',
    "python/sglang/srt/__init__.py": "",
    "python/sglang/srt/model_executor/__init__.py": "",
    SGLANG_RUNNER: _SGLANG_RUNNER_BASE,
    "python/sglang/srt/speculative/__init__.py": "",
    SGLANG_WORKER: _sglang_worker(fixed=False),
}

_SGLANG_FIX_TEST = _dedent(
    """
    from sglang.srt.model_executor.model_runner import SharedTensor
    from sglang.srt.speculative.eagle_worker import EAGLEWorker


    def test_each_handle_is_opened_once():
        t = SharedTensor([1.0])
        EAGLEWorker().update_weights_from_tensor([("w", t)])
        assert t.opened == 1
    """
)


def make_sglang(root: Path) -> FixtureRepo:
    b = _Builder(root, "sgl-project", "sglang", aliases=[("ArronHZG", "sglang")])
    b.commit("sglang 0.5.12 (stand-in)", _SGLANG_FILES, key="without_fix")
    b.branch("fix_mtp_update_weights_from_tensor")
    b.commit(
        "Open each shared weight handle once (stand-in fix)",
        {SGLANG_RUNNER: _SGLANG_RUNNER_BASE + _SGLANG_UNWRAP, SGLANG_WORKER: _sglang_worker(fixed=True)},
        key="fix_only",
    )
    b.commit(
        "Test: each handle is opened once", {"test/test_unwrap_once.py": _SGLANG_FIX_TEST}, key="with_fix"
    )
    return b.finish("main")


# ----------------------------------------------------------------------------- mbridge


def _mbridge_bridge(uses_encoder_and_decoder: bool) -> str:
    if uses_encoder_and_decoder:
        choose = _dedent(
            """
            def model_type(self):
                if self.has_encoder_and_decoder:
                    return ModelType.encoder_and_decoder
                return ModelType.encoder_or_decoder
            """
        )
    else:
        choose = _dedent(
            """
            def model_type(self):
                return ModelType.encoder_or_decoder
            """
        )
    return _dedent(
        """
            from megatron.core.enums import ModelType


            class Bridge:
                has_encoder_and_decoder = False

                def __init__(self, hf_config=None, mtp=False):
                    self.hf_config = hf_config
                    self.mtp = mtp

            """
    ) + textwrap.indent(choose, "    ")


def make_mbridge(root: Path) -> FixtureRepo:
    b = _Builder(root, "ISEEKYAN", "mbridge", aliases=[("ArronHZG", "mbridge")])
    base = {
        "pyproject.toml": _pyproject("mbridge", "0.15.1", "mbridge*"),
        "README.md": "Stand-in for ISEEKYAN/mbridge used by tests.\n",
        "mbridge/__init__.py": 'from mbridge.core.bridge import Bridge\n\n__version__ = "0.15.1"\n',
        "mbridge/core/__init__.py": "",
        "mbridge/core/bridge.py": _mbridge_bridge(uses_encoder_and_decoder=True),
    }
    b.commit(
        "mbridge with MTP for verl (uses ModelType.encoder_and_decoder)", base, key="uses_encoder_and_decoder"
    )
    b.branch("feature/verl_mtp")
    b.checkout("main")
    b.commit(
        "mtp for verl (#62): drop ModelType.encoder_and_decoder for megatron-core >= 0.17",
        {
            "mbridge/core/bridge.py": _mbridge_bridge(uses_encoder_and_decoder=False),
            "pyproject.toml": _pyproject("mbridge", "0.15.2.dev0", "mbridge*"),
            "mbridge/__init__.py": 'from mbridge.core.bridge import Bridge\n\n__version__ = "0.15.2.dev0"\n',
        },
        key="no_encoder_and_decoder",
    )
    return b.finish("main")


# ----------------------------------------------------------------------------- Megatron-Bridge


def make_megatron_bridge(root: Path) -> FixtureRepo:
    b = _Builder(root, "NVIDIA-NeMo", "Megatron-Bridge")

    def version_files(ver: str) -> dict[str, str]:
        return {
            "pyproject.toml": _pyproject("megatron-bridge", ver, "megatron.bridge*"),
            "megatron/bridge/__init__.py": f'__version__ = "{ver}"\n',
        }

    files = {
        "README.md": "Stand-in for NVIDIA-NeMo/Megatron-Bridge used by tests.\n",
        "megatron/bridge/models/__init__.py": "",
        "megatron/bridge/models/qwen/__init__.py": "from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge\n",
        "megatron/bridge/models/qwen/qwen3_bridge.py": "class Qwen3Bridge:\n    has_mtp = False\n",
        **version_files("0.4.0"),
    }
    b.commit("Megatron-Bridge 0.4.0 (stand-in, no MiMo)", files, key="without_mimo")
    b.tag("v0.4.0-standin", "HEAD")
    files = {
        "megatron/bridge/models/mimo/__init__.py": "from megatron.bridge.models.mimo.mimo_bridge import MimoBridge\n",
        "megatron/bridge/models/mimo/mimo_bridge.py": _dedent(
            """
            class MimoBridge:
                \"\"\"Maps MiMo-7B weights, including its MTP layers, to Megatron (#2387).\"\"\"

                has_mtp = True
                hf_mtp_prefix = "model.mtp_layers"
                megatron_mtp_prefix = "mtp.layers"
            """
        ),
        **version_files("0.5.0"),
    }
    b.commit("Add MiMo MTP bridge (#2387)", files, key="with_mimo")
    b.tag("v0.5.0-standin", "HEAD")
    b.branch("r0.5.0")
    return b.finish("main")


# ----------------------------------------------------------------------------- verl


def make_verl(root: Path) -> FixtureRepo:
    b = _Builder(root, "verl-project", "verl", aliases=[("volcengine", "verl")])
    files = {
        "pyproject.toml": _pyproject("verl", "0.9.1.dev0", "verl*"),
        "README.md": "Stand-in for verl-project/verl used by tests.\n",
        "verl/__init__.py": '__version__ = "0.9.1.dev0"\n',
        "verl/models/__init__.py": "",
        "verl/models/mcore/__init__.py": "",
        "verl/workers/__init__.py": "",
        "verl/workers/config/__init__.py": "from verl.workers.config.model import MtpConfig\n",
        "verl/workers/config/model.py": _dedent(
            """
            from dataclasses import dataclass


            @dataclass
            class MtpConfig:
                enable: bool = False
                enable_train: bool = False
                enable_rollout: bool = False
                detach_encoder: bool = False
                mtp_loss_scaling_factor: float = 0.1
                speculative_algorithm: str = "EAGLE"
                speculative_num_steps: int = 3
                speculative_eagle_topk: int = 1
                speculative_num_draft_tokens: int = 4
                method: str = "mtp"
                num_speculative_tokens: int = 1
            """
        ),
    }
    b.commit("verl (stand-in) with MtpConfig", files, key="initial")
    files = {
        "verl/models/mcore/mtp_patch.py": _dedent(
            """
            \"\"\"Stand-in for verl's MTP patch (detach_encoder support).\"\"\"

            PATCHED = []


            def patch_mtp_layer_get_embeddings(model_layer, detach_encoder=False):
                PATCHED.append((type(model_layer).__name__, detach_encoder))
                return model_layer
            """
        ),
    }
    b.commit("Add mcore MTP patch (detach_encoder)", files, key="mtp_patch")
    return b.finish("main")


# ----------------------------------------------------------------------------- all together


@dataclasses.dataclass
class FixtureRepos:
    root: Path
    megatron: FixtureRepo
    sglang: FixtureRepo
    mbridge: FixtureRepo
    megatron_bridge: FixtureRepo
    verl: FixtureRepo

    @property
    def base_path(self) -> Path:
        """The directory a git server exports (``<owner>/<name>.git`` below it)."""
        return self.root / "git"

    def all(self) -> list[FixtureRepo]:
        return [self.megatron, self.sglang, self.mbridge, self.megatron_bridge, self.verl]

    def owners(self) -> list[str]:
        return sorted(p.name for p in self.base_path.iterdir() if p.is_dir())


def build_fixture_repos(root: Path) -> FixtureRepos:
    """Create every stand-in repository under ``root`` (which must not contain them yet)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    return FixtureRepos(
        root=root,
        megatron=make_megatron(root),
        sglang=make_sglang(root),
        mbridge=make_mbridge(root),
        megatron_bridge=make_megatron_bridge(root),
        verl=make_verl(root),
    )
