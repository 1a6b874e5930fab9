"""#38 item 3: a long compile shows objects done of total, elapsed, an estimate, and what came
back from the compile cache, from the builder stage's output (BuildKit plain progress lines
as they look for TransformerEngine's torch extension and apex; commands shortened)."""

from __future__ import annotations

import io

from mtpimage.ext.compileprogress import CompileProgress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _ninja(step: int, t: float, n: int, m: int) -> str:
    return f"#{step} {t}   [{n}/{m}] c++ -MMD -MF /tmp/mtp-ext-build/x/build/obj{n}.o.d -O3 -c x.cpp\n"


def test_a_fresh_compile_reports_done_of_total_elapsed_and_an_estimate():
    said, clock = [], Clock()
    p = CompileProgress("transformer-engine-torch", said.append, clock=clock, period_s=60)
    p.feed("#9 80.0 mtp_extension: building transformer-engine-torch in /tmp/x with MAX_JOBS=2\n")
    assert said == ["mtp_extension: building transformer-engine-torch in /tmp/x with MAX_JOBS=2"]
    for n, t in enumerate((81.0, 121.0, 161.0, 201.0), start=1):
        clock.now += 40
        p.feed(_ninja(9, t, n, 28))
        p.feed("#9 201.3   warning: a compiler warning nobody needs on the terminal\n")
    assert p.done == 4 and p.total == 28 and p.cached == 0
    # 3 timed objects at 40 s each: 24 left -> 16 min
    assert p.left_s() == 24 * 40.0
    assert said[1:] == [  # the first object, then one line a minute (not one per object)
        "compile transformer-engine-torch 1/28 objects, 0m40s elapsed, estimate after the first compiled object",
        "compile transformer-engine-torch 3/28 objects, 2m00s elapsed, about 16m40s left",
    ]


def test_a_resumed_compile_counts_what_came_back_from_the_compile_cache():
    said, clock = [], Clock()
    p = CompileProgress("transformer-engine-torch", said.append, clock=clock)
    for n, t in ((1, 80.0), (2, 80.2), (3, 80.3), (4, 80.5), (5, 80.6), (6, 81.0), (7, 120.0), (8, 160.0)):
        p.feed(_ninja(9, t, n, 28))
    assert p.cached == 5 and p.done == 8  # objects 2-6 within 2 s of the one before
    assert "about 5 resumed from the compile cache" in p.line()
    assert p.finish().startswith("compiled transformer-engine-torch 8/28 objects in ")


def test_two_parallel_objects_finishing_together_are_not_the_compile_cache():
    # a fresh TE build on an empty cache, 2 jobs: objects 1 and 2 had started together
    said, clock = [], Clock()
    p = CompileProgress("transformer-engine-torch", said.append, clock=clock)
    p.feed("#9 10.0 mtp_extension: building transformer-engine-torch in /tmp/x with MAX_JOBS=2\n")
    for n, t in ((1, 200.0), (2, 200.6), (3, 260.0), (4, 261.1), (5, 330.0)):
        p.feed(_ninja(9, t, n, 28))
    assert p.cached == 0 and p._compiled == 4
    assert "resumed" not in p.line() and "resumed" not in p.finish()


def test_the_run_needed_to_count_as_the_cache_follows_max_jobs():
    p = CompileProgress("flash-attn", [].append, clock=Clock())
    p.feed("#7 1.0 mtp_extension: building flash-attn in /tmp/x with MAX_JOBS=4\n")
    for n, t in ((1, 100.0), (2, 100.3), (3, 100.5), (4, 100.9), (5, 170.0)):
        p.feed(_ninja(7, t, n, 73))
    assert p.jobs == 4 and p.cached == 0  # three fast finishes: four jobs can do that by chance
    for n, t in ((6, 170.1), (7, 170.2), (8, 170.3), (9, 170.4), (10, 170.5)):
        p.feed(_ninja(7, t, n, 73))
    assert p.cached == 5


def test_apex_runs_ninja_once_per_module_and_the_total_grows():
    said = []
    p = CompileProgress("apex", said.append, clock=Clock())
    p.feed(_ninja(8, 160.1, 1, 1))
    p.feed(_ninja(8, 327.8, 1, 15))
    p.feed(_ninja(8, 409.9, 2, 15))
    assert (p.done, p.total, p.runs) == (3, 16, 2)
    assert "3/16 objects (more as apex's modules begin)" in p.line()


def test_a_terminal_gets_one_live_line_and_the_closing_line_ends_it():
    said, out = [], io.StringIO()
    p = CompileProgress("flash-attn", said.append, live=True, clock=Clock())
    p._stream = out
    p.feed(_ninja(7, 10.0, 1, 73))
    p.feed(_ninja(7, 110.0, 2, 73))
    assert said == [] and out.getvalue().count("\r\033[K") == 2 and "2/73 objects" in out.getvalue()
    said.append(p.finish())
    assert said[-1].startswith("compiled flash-attn") and out.getvalue().endswith("\r\033[K")


def test_output_without_ninja_says_so():
    p = CompileProgress("mtp-tiny-add", [].append, clock=Clock())
    p.feed("#5 1.0 running build_ext\n")
    assert (
        p.finish()
        == "compiled mtp-tiny-add    in 0m00s (no ninja progress in its output; the log has it all)"
    )


def test_an_interrupted_compile_says_where_it_stopped_not_compiled():
    p = CompileProgress("transformer-engine-torch", [].append, clock=Clock())
    for n, t in ((1, 100.0), (2, 160.0), (3, 220.0)):
        p.feed(_ninja(9, t, n, 28))
    line = p.finish(stopped=True)
    assert line.startswith("stopped transformer-engine-torch at 3/28 objects after ")
    assert "rerun resumes" in line and "compiled" not in line
    assert CompileProgress("apex", [].append, clock=Clock()).finish(stopped=True).startswith("stopped apex")


def test_compile_wheel_says_stopped_when_its_build_is_interrupted(tmp_path):
    import types

    import pytest

    from mtpimage.assembly import extbuild

    def request_for(context, stage, tmp, args, on_line):
        on_line(_ninja(9, 100.0, 1, 28))
        on_line(_ninja(9, 160.0, 2, 28))
        raise KeyboardInterrupt

    said = []
    pkg = types.SimpleNamespace(name="transformer-engine-torch")
    with pytest.raises(KeyboardInterrupt):
        extbuild.compile_wheel(
            None, pkg, lambda name: tmp_path, request_for, 2, "", tmp_path, say=said.append
        )
    assert said[-1].startswith("stopped transformer-engine-torch at 2/28 objects")


def test_a_resume_from_the_cache_is_said_when_it_ends_not_a_minute_later():
    # the interrupted TE build rerun: objects 1-21 back in 1.5 s, then object 22 compiles
    said, clock = [], Clock()
    p = CompileProgress("transformer-engine-torch", said.append, clock=clock, period_s=60)
    p.feed(_ninja(9, 21.14, 1, 28))
    for n in range(2, 22):
        p.feed(_ninja(9, 21.14 + 0.07 * n, n, 28))
    assert len(said) == 1  # the first object's line; the burst is not over yet
    clock.now += 30
    p.feed(_ninja(9, 51.0, 22, 28))
    assert said[-1].startswith("compile transformer-engine-torch 22/28 objects")
    assert "about 20 resumed from the compile cache" in said[-1]
