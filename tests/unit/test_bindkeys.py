"""What a RUN's bind mounts hold goes into its text for buildah's layer cache
(engine/bindkeys.py): buildah 1.28 keys a cached RUN step by its text alone, so a bumped
source bound into an unchanged RUN reused the old layer (the real stack's verl bump)."""

from __future__ import annotations

import os

from mtpimage.engine import bindkeys

DOCKERFILE = """\
FROM base AS one
# ---- layer: verl
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \\
    --mount=type=secret,id=netrc,target=/root/.netrc \\
    --mount=type=bind,source=build/requirements/verl.txt,target=/tmp/r.txt \\
    --mount=type=bind,source=src/verl,target=/tmp/mtp-src/verl,rw \\
    . /tmp/env.sh; \\
    pip install /tmp/mtp-src/verl
RUN echo no mounts
RUN --mount=type=bind,from=one,source=/out,target=/in cp -r /in /x
RUN --mount=type=bind,source=one.txt,target=/one.txt cat /one.txt
COPY mtp/ /opt/mtp/
"""


def _ctx(tmp_path, verl="v1"):
    (tmp_path / "src/verl/pkg").mkdir(parents=True)
    (tmp_path / "src/verl/pkg/__init__.py").write_text(verl)
    (tmp_path / "build/requirements").mkdir(parents=True)
    (tmp_path / "build/requirements/verl.txt").write_text("x==1\n")
    (tmp_path / "one.txt").write_text("1")
    (tmp_path / "unbound.txt").write_text("u")
    return tmp_path


def _run_lines(text):
    return [line for line in text.splitlines() if "mtp-binds" in line]


def test_a_changed_bound_source_changes_its_run_and_nothing_else(tmp_path):
    a = bindkeys.keyed(DOCKERFILE, _ctx(tmp_path / "a", "v1"))
    b = bindkeys.keyed(DOCKERFILE, _ctx(tmp_path / "b", "v2"))
    # the verl RUN and the one-file RUN are keyed; the RUN without mounts and the from= bind are not
    assert len(_run_lines(a)) == 2
    assert "RUN echo no mounts\n" in a and "--mount=type=bind,from=one,source=/out,target=/in cp -r" in a
    diff = [(x, y) for x, y in zip(a.splitlines(), b.splitlines()) if x != y]
    assert len(diff) == 1 and "src/verl" in diff[0][0]  # only the verl step's text moved
    # the no-op is the first command the shell runs: after the last flag, before the command
    assert "target=/tmp/mtp-src/verl,rw : mtp-binds sha256:" in diff[0][0]
    assert a.count("\n") == DOCKERFILE.count("\n")  # no line added: line numbers in errors hold


def test_the_same_files_give_the_same_text_anywhere(tmp_path):
    a = bindkeys.keyed(DOCKERFILE, _ctx(tmp_path / "a"))
    b = bindkeys.keyed(DOCKERFILE, _ctx(tmp_path / "b"))
    assert a == b  # the context's path is no part of the key
    (tmp_path / "b/unbound.txt").write_text("changed")
    assert bindkeys.keyed(DOCKERFILE, tmp_path / "b") == a


def test_mode_links_and_names_count(tmp_path):
    ctx = _ctx(tmp_path / "c")
    before = bindkeys.content_digest(ctx, ["src/verl"])
    os.chmod(ctx / "src/verl/pkg/__init__.py", 0o755)
    after_mode = bindkeys.content_digest(ctx, ["src/verl"])
    (ctx / "src/verl/link").symlink_to("pkg")
    after_link = bindkeys.content_digest(ctx, ["src/verl"])
    (ctx / "src/verl/pkg/__init__.py").rename(ctx / "src/verl/pkg/other.py")
    after_name = bindkeys.content_digest(ctx, ["src/verl"])
    assert len({before, after_mode, after_link, after_name}) == 4


def test_an_exec_form_run_is_left_as_it_is(tmp_path):
    text = 'RUN --mount=type=bind,source=one.txt,target=/one.txt ["cat", "/one.txt"]\n'
    assert bindkeys.keyed(text, _ctx(tmp_path / "d")) == text
