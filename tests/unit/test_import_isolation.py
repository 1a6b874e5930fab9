"""The import check's fork servers (images/checks/run_checks.py + import_server.py), run on
this interpreter with fake packages on PYTHONPATH: every module is still judged as a fresh
`python -c "import m"` would judge it. A crash, a hang, a module that pollutes global state
and modules whose import fails only in isolation are each caught; a preload that fails or
initialises CUDA falls back to fresh interpreters."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest

from mtpimage.assembly.render import IMAGES_DIR

CHECKS = IMAGES_DIR / "checks"

CEXT = (
    "import sys\n"
    "if 'basepkg' not in sys.modules:\n"
    "    raise ImportError('libc10.so: cannot open shared object file: No such file or directory')\n"
    "{after}"
)
FAKES = {
    "good.py": "import json\n",
    "bad.py": "raise ImportError('nope')\n",
    "aborts.py": "import os\nos.abort()\n",
    "segv.py": "import ctypes\nctypes.string_at(0)\n",
    "hangs.py": "import time\ntime.sleep(600)\n",
    # pollutes what every later import in its process would see
    "polluter.py": "import builtins, sys\nsys.modules['json'] = None\nbuiltins.len = None\n",
    "uses_json.py": "import json\njson.dumps({})\nlen([])\n",
    # the heavy base the tests preload (torch on the real stack)
    "basepkg/__init__.py": textwrap.dedent(
        """\
        import os
        if os.environ.get("BASEPKG_BREAK"):
            raise RuntimeError("basepkg broken by the environment")
        READY = True
        """
    ),
    "user.py": "import basepkg\nX = basepkg.READY\n",
    # fail only in isolation: each relies on the preload having happened first
    "needs_base.py": "import sys\nsys.modules['basepkg'].READY\n",
    "env_then_base.py": "import os\nos.environ['BASEPKG_BREAK'] = '1'\nimport basepkg\n",
    "peeks.py": "import sys\nif 'basepkg' not in sys.modules:\n    raise ImportError('basepkg first')\nimport basepkg\n",
    "brokenbase.py": "raise RuntimeError('the preload itself is broken')\n",
    # a C++ extension of the preload (apex's amp_C on torch): loads only after it, as its
    # package always imports it; one that fails after the preload too
    "cext.py": CEXT.format(after=""),
    "cext_broken.py": CEXT.format(after="raise ImportError('undefined symbol: _ZN3c10')\n"),
    "uses_broken.py": "import brokenbase\n",
}


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "site"
    for name, text in FAKES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.delenv("MTP_IMPORT_FORK", raising=False)
    return root


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", CHECKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rc():
    return _load("run_checks")


def _imports(rc, modules, preload=("basepkg",), timeout=30.0):
    """The preload is among the modules checked, as torch is in the image (only an installed
    module is preloaded)."""
    modules = list(dict.fromkeys([*modules, *preload]))
    return rc.import_modules(modules, preload=list(preload), timeout=timeout, jobs=2)


def test_each_verdict_is_a_fresh_interpreters(rc, site):
    modules = [m for m in ("good", "bad", "aborts", "segv", "polluter", "uses_json", "basepkg", "user")] + [
        "needs_base",
        "env_then_base",
        "peeks",
    ]
    verdicts, _info = _imports(rc, modules)
    fresh = {m: rc._import_one(m, 30)[1] == 0 for m in modules}
    assert {m: v.ok for m, v in verdicts.items()} == fresh
    assert fresh == {
        "good": True,
        "bad": False,
        "aborts": False,
        "segv": False,
        "polluter": True,
        "uses_json": True,
        "basepkg": True,
        "user": True,
        "needs_base": False,
        "env_then_base": False,
        "peeks": False,
    }


def test_children_do_the_work_not_fresh_interpreters(rc, site):
    verdicts, info = _imports(rc, ["good", "user", "basepkg"])
    assert verdicts["good"].how == "fork:bare"
    assert verdicts["user"].how == "fork:heavy"  # forked after the preload: no start-up paid
    assert verdicts["basepkg"].how == "fresh: preloaded"  # the preload is checked alone
    assert info == {"preload": ["basepkg"], "notes": []}


def test_a_crash_is_reported_with_its_signal(rc, site):
    verdicts, _ = _imports(rc, ["aborts", "segv", "good"])
    assert "SIGABRT" in verdicts["aborts"].detail
    assert "SIGSEGV" in verdicts["segv"].detail
    assert verdicts["good"].ok


def test_a_hung_module_is_killed_at_the_timeout(rc, site):
    verdicts, _ = _imports(rc, ["hangs", "good"], timeout=1.0)
    assert not verdicts["hangs"].ok
    assert verdicts["hangs"].detail == "timed out after 1 s"
    assert verdicts["hangs"].how.startswith("fresh after fork:bare said timeout")  # killed by the server
    assert verdicts["good"].ok and verdicts["good"].how == "fork:bare"


def test_global_state_pollution_stays_in_its_child(rc, site):
    verdicts, _ = _imports(rc, ["polluter", "uses_json", "good"], preload=())
    # in a child of its own: after the polluter, json and len still work for the others
    assert verdicts["uses_json"].ok and verdicts["uses_json"].how == "fork:bare"
    assert verdicts["good"].ok and verdicts["polluter"].ok


def test_what_fails_only_in_isolation_is_caught(rc, site):
    verdicts, _ = _imports(rc, ["needs_base", "env_then_base", "peeks"])
    assert "KeyError" in verdicts["needs_base"].detail  # uses the preload without importing it
    assert "RuntimeError" in verdicts["env_then_base"].detail  # sets the environment first
    assert "basepkg first" in verdicts["peeks"].detail  # asks sys.modules first


def test_a_child_that_acts_differently_with_the_preload_is_imported_again(rc, site):
    site.joinpath("differs.py").write_text(
        "import sys\nif 'basepkg' in sys.modules:\n    import json\nimport basepkg\n"
    )
    verdicts, _ = _imports(rc, ["differs"])
    assert verdicts["differs"].ok  # it imports fine in a fresh interpreter ...
    assert verdicts["differs"].how.startswith("fresh after fork:heavy said suspect")  # ... which decided


def test_a_child_suspect_at_its_first_ask_for_the_preload_stops_there(rc, site, tmp_path):
    """What follows the ask (often the bulk of an import) is not paid twice: once in the child
    whose verdict cannot stand, again in the fresh interpreter that decides."""
    ran = tmp_path / "ran"
    site.joinpath("env_then_work.py").write_text(
        f"import os\nos.environ['UNRELATED'] = '1'\nimport basepkg\nopen({str(ran)!r}, 'a').write('x')\n"
    )
    verdicts, _ = _imports(rc, ["env_then_work"])
    assert verdicts["env_then_work"].ok
    assert verdicts["env_then_work"].how.startswith(
        "fresh after fork:heavy said suspect: changed the environment"
    )
    assert ran.read_text() == "x", "the suspect child went on with the import"


def test_a_broken_preload_falls_back_to_fresh_interpreters(rc, site):
    verdicts, info = _imports(rc, ["brokenbase", "uses_broken", "good"], preload=("brokenbase",))
    assert not verdicts["brokenbase"].ok and not verdicts["uses_broken"].ok
    assert verdicts["good"].ok
    assert any("preloading brokenbase failed" in n for n in info["notes"])


def test_cuda_initialised_by_the_preload_means_no_fork(rc, site):
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_initialized():\n        return True\n"
    )
    (site / "uses_torch.py").write_text("import torch\n")
    verdicts, info = _imports(rc, ["torch", "uses_torch", "good"], preload=("torch",))
    assert all(v.ok for v in verdicts.values())
    assert verdicts["uses_torch"].how.startswith("fresh")
    assert any("CUDA was initialised" in n for n in info["notes"])


def test_the_old_way_is_one_switch_away(rc, site, monkeypatch):
    monkeypatch.setenv("MTP_IMPORT_FORK", "0")
    verdicts, info = _imports(rc, ["good", "bad"], preload=())
    assert {m: (v.ok, v.how) for m, v in verdicts.items()} == {
        "good": (True, "fresh"),
        "bad": (False, "fresh"),
    }
    assert info["notes"] == ["MTP_IMPORT_FORK=0"]


def test_libraries_mapped_before_the_preload_from_other_files_clash():
    server = _load("import_server").Server(
        {"timeout": "1", "jobs": "1", "tmp": "/tmp", "preload": [], "handoff": []}, print
    )
    server.libraries = {"libcudart": {"/torch/lib/libcudart.so.13.0.1"}}
    assert server.conflicts({"/other/libcudart.so.13.1.0", "/x/libfoo.so"}) == ["/other/libcudart.so.13.1.0"]
    assert server.conflicts({"/torch/lib/libcudart.so.13.0.1", "/x/libfoo.so"}) == []


def test_entry_checks_run_side_by_side_each_with_its_time_in_their_order(rc, tmp_path, monkeypatch):
    _trainer(tmp_path, monkeypatch, decorated=True)
    vector = {
        "substitutions": [{"what": "omitted", "detail": "flash-attn==2.8.3"}],
        "components": [
            {
                "entry_checks": [
                    {"id": "first", "code": "import json"},
                    {"id": "gone", "needs": ["flash-attn"]},
                ]
            },
            {"entry_checks": [{"id": "broken", "code": "raise SystemExit('no trainer')"}]},
            {"entry_checks": [{"id": "trainer", "module": "faketrainer.main", "target": "rl"}]},
        ],
    }
    results = rc.check_entry_imports(vector)
    assert [(r["id"], r["status"]) for r in results] == [
        ("entry:first", "pass"),
        ("entry:gone", "skip"),
        ("entry:broken", "fail"),
        ("entry:trainer:import", "pass"),
    ]
    assert results[2]["detail"] == "no trainer"  # the fork failed it; its own interpreter said why
    assert results[0]["detail"] == "ok (fork:bare)"  # code, run by a fork server's child
    assert results[3]["detail"] == "import faketrainer.main (fork:bare)"  # a fork server's child
    assert all(isinstance(r["seconds"], float) for r in (results[0], results[2]))
    # the config half reads the mode layer: only module checks, in the always-run group
    assert [r["id"] for r in rc.check_entrypoints(vector)] == ["entry:trainer:config"]


def _trainer(tmp_path, monkeypatch, decorated: bool):
    """faketrainer.main: a trainer module whose import must not run when its hydra config is
    read (it exits at import), decorated with a literal @hydra.main or not."""
    pkg = tmp_path / "faketrainer"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    deco = (
        '@hydra.main(config_path="config", config_name="trainer", version_base=None)\n' if decorated else ""
    )
    (pkg / "main.py").write_text(
        "import sys\nimport hydra\n"
        f"{deco}def main(cfg):\n    pass\n"
        "if __name__ == '__main__':\n    sys.exit('ran as a whole: ' + ' '.join(sys.argv[1:]))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "hydra").mkdir()
    (tmp_path / "hydra" / "__init__.py").write_text("def main(**kw):\n    return lambda f: f\n")
    return pkg


def test_the_hydra_config_of_a_trainer_is_read_from_its_file_not_imported(rc, tmp_path, monkeypatch):
    pkg = _trainer(tmp_path, monkeypatch, decorated=True)
    assert rc.hydra_main_of("faketrainer.main") == (str(pkg / "config"), "trainer", None)
    assert "faketrainer.main" not in sys.modules
    assert rc.hydra_main_of("no_such_top_level_pkg.main") is None


def test_a_trainer_without_a_literal_hydra_main_runs_as_a_whole(rc, tmp_path, monkeypatch):
    _trainer(tmp_path, monkeypatch, decorated=False)
    assert rc.hydra_main_of("faketrainer.main") is None
    out = rc.entry_config({"id": "t", "module": "faketrainer.main", "target": "no-such-target"})
    assert out["status"] == "fail"
    assert out["detail"].endswith("ran as a whole: --cfg job")


def test_the_composed_config_refuses_an_override_key_it_does_not_have(rc, tmp_path, monkeypatch):
    """With the real hydra (a test dependency, as in the image): what `--cfg job` refuses."""
    pytest.importorskip("hydra", reason="hydra-core is in requirements-dev.txt")
    pkg = _trainer(tmp_path, monkeypatch, decorated=True)
    (tmp_path / "hydra").rename(tmp_path / "not-hydra")  # the real one, not the stand-in
    (pkg / "config" / "trainer.yaml").write_text("model:\n  mtp:\n    enable: false\n")
    overrides = tmp_path / "verl" / "rl.overrides"
    overrides.parent.mkdir()
    monkeypatch.setattr(rc, "HERE", tmp_path / "checks")
    e = {"id": "t", "module": "faketrainer.main", "target": "rl"}
    overrides.write_text("model.mtp.enable=True\n")
    assert rc.entry_config(e)["status"] == "pass"
    overrides.write_text("model.mtp.no_such_key=True\n")
    out = rc.entry_config(e)
    assert out["status"] == "fail" and "no_such_key" in out["detail"], out


def test_a_cpp_extension_of_the_preload_is_forked_after_it_not_started_afresh(rc, site, monkeypatch):
    """As import_fresh imports it after torch (`import torch, amp_C`), but in a child of the
    server that preloaded it: no interpreter and torch start-up per extension module."""
    monkeypatch.setattr(rc, "EXTENSION_BASE", "basepkg")
    verdicts, _ = _imports(rc, ["cext", "cext_broken", "good"])
    assert verdicts["cext"].ok and verdicts["cext"].how == "fork:heavy"
    assert not verdicts["cext_broken"].ok and "undefined symbol" in verdicts["cext_broken"].detail
    assert verdicts["cext_broken"].how.startswith("fresh after fork:heavy said fail")
    # a preload that is not what it extends: imported afresh (after torch, absent here)
    monkeypatch.setattr(rc, "EXTENSION_BASE", "torch")
    verdicts, _ = _imports(rc, ["cext"])
    assert not verdicts["cext"].ok and verdicts["cext"].how.startswith("fresh after fork:bare said fail")


def test_several_modules_joined_by_commas_are_imported_in_one_child_in_order(rc, site):
    verdicts, _ = _imports(rc, ["good,user", "user,bad", "good"])
    assert verdicts["good,user"].ok and verdicts["good,user"].how == "fork:heavy"
    assert not verdicts["user,bad"].ok and "nope" in verdicts["user,bad"].detail


def test_an_entry_import_a_fork_cannot_vouch_for_runs_in_its_own_interpreter(rc, tmp_path, monkeypatch):
    pkg = _trainer(tmp_path, monkeypatch, decorated=True)
    (pkg / "broken.py").write_text("raise ImportError('the trainer cannot start')\n")
    vector = {
        "components": [
            {
                "entry_checks": [
                    {
                        "id": "t",
                        "module": "faketrainer.main",
                        "also_import": ["faketrainer.broken"],
                        "target": "rl",
                    },
                ]
            }
        ]
    }
    (out,) = rc.check_entry_imports(vector)
    assert out["status"] == "fail"
    assert (
        out["detail"] == "import faketrainer.main, faketrainer.broken: ImportError: the trainer cannot start"
    )
    monkeypatch.setenv("MTP_IMPORT_FORK", "0")  # the old way: every entry in its own interpreter
    (pkg / "broken.py").write_text("")
    (out,) = rc.check_entry_imports(vector)
    assert out == {**out, "status": "pass", "detail": "import faketrainer.main, faketrainer.broken"}


def test_entry_code_runs_in_a_child_as_python_c_would(rc, site, monkeypatch):
    monkeypatch.setenv("MTP_IMPORT_PRELOAD", "basepkg")
    monkeypatch.syspath_prepend(str(site))  # found here, as the image's checks find torch
    code = "import sys; assert __name__ == '__main__' and 'run_checks' not in sys.modules; import user"
    vector = {
        "components": [
            {
                "entry_checks": [
                    {"id": "c", "code": code},
                    {"id": "exits", "code": "import sys; sys.exit(0)"},
                    {"id": "multi", "code": "import json\nfor i in range(2):\n    json.dumps(i)\n"},
                ]
            }
        ]
    }
    results = rc.check_entry_imports(vector)
    assert [(r["id"], r["status"]) for r in results] == [
        ("entry:c", "pass"),
        ("entry:exits", "pass"),
        ("entry:multi", "pass"),
    ]
    assert results[0]["detail"] == "ok (fork:heavy)"  # it asked for basepkg: the preloading server


def test_when_both_run_the_import_check_judges_the_entry_items_in_the_same_pool(
    rc, site, tmp_path, monkeypatch
):
    monkeypatch.setenv("MTP_IMPORT_PRELOAD", "basepkg")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(rc, "discover_modules", lambda: ({"good": "good", "basepkg": "basepkg"}, []))
    vector = tmp_path / "version.json"
    vector.write_text(json.dumps({"components": [{"entry_checks": [{"id": "c", "code": "import user"}]}]}))
    monkeypatch.setattr(rc, "VECTOR", vector)
    both = {r["id"]: r for r in rc.run(only=["imports", "entry-imports"])}
    assert both["imports"]["status"] == "pass"
    assert "the same servers judged the 1 entry checks' imports" in both["imports"]["detail"]
    assert both["entry:c"]["status"] == "pass" and both["entry:c"]["detail"] == "ok (fork:heavy)"
    alone = {r["id"]: r for r in rc.run(only=["entry-imports"])}  # the import check reused: its own run
    assert alone["entry:c"]["detail"] == "ok (fork:heavy)"
    assert rc.PREFETCHED == {}


# `FIRST|NAME`: a module that an entry check imports first is judged by the entry's child on
# the way. Each fake appends its name to a file when it runs, so a test sees how often.
PAIRS = {
    "firstpkg/__init__.py": "import os\nopen(os.environ['RAN'], 'a').write('first ')\n",
    "firstpkg/sub.py": "import basepkg\nimport os\nopen(os.environ['RAN'], 'a').write('sub ')\n",
    "firstpkg/broken_sub.py": "raise ImportError('the rest is broken')\n",
    "badfirst/__init__.py": "raise ImportError('the first is broken')\n",
    "badfirst/sub.py": "",
    "exitsfirst/__init__.py": "import sys\nsys.exit(0)\n",
    "exitsfirst/sub.py": "",
    "envfirst/__init__.py": (
        "import os\nos.environ['UNRELATED'] = '1'\nimport basepkg\nopen(os.environ['RAN'], 'a').write('envfirst ')\n"
    ),
    "envfirst/sub.py": "import os\nopen(os.environ['RAN'], 'a').write('envsub ')\n",
}


@pytest.fixture
def pairs(site, tmp_path, monkeypatch):
    for name, text in PAIRS.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    ran = tmp_path / "ran"
    ran.write_text("")
    monkeypatch.setenv("RAN", str(ran))
    return ran


def test_a_module_an_item_imports_first_is_judged_on_the_way_once(rc, pairs):
    verdicts, _ = _imports(rc, ["firstpkg|firstpkg.sub", "good"])
    assert verdicts["firstpkg"].ok and verdicts["firstpkg.sub"].ok
    assert verdicts["firstpkg"].how == "fork:bare"  # before the item asked for the preload
    assert verdicts["firstpkg.sub"].how == "fork:heavy"
    # the bare child ran firstpkg, then handed the item on; the preloading server's ran both
    assert pairs.read_text() == "first first sub "


def test_each_half_of_a_pair_keeps_its_own_verdict(rc, pairs):
    verdicts, _ = _imports(
        rc, ["firstpkg|firstpkg.broken_sub", "badfirst|badfirst.sub", "exitsfirst|exitsfirst.sub"]
    )
    fresh = {
        m: rc._import_one(m, 30)[1] == 0
        for m in ("firstpkg", "firstpkg.broken_sub", "badfirst", "badfirst.sub")
    }
    assert (
        {m: verdicts[m].ok for m in fresh}
        == fresh
        == {
            "firstpkg": True,
            "firstpkg.broken_sub": False,
            "badfirst": False,
            "badfirst.sub": False,
        }
    )
    assert "the rest is broken" in verdicts["firstpkg.broken_sub"].detail
    assert (
        "the first is broken" in verdicts["badfirst"].detail
        and "the first is broken" in verdicts["badfirst.sub"].detail
    )
    # `python -c "import exitsfirst"` exits 0: a pass; the rest, judged apart, does not start
    assert verdicts["exitsfirst"].ok
    assert verdicts["exitsfirst.sub"].how.startswith("fresh")


def test_a_pair_that_goes_fresh_goes_as_a_pair(rc, pairs):
    """Changed the environment before the preload: a fresh interpreter decides both, in one run."""
    verdicts, _ = _imports(rc, ["envfirst|envfirst.sub"])
    assert verdicts["envfirst"].ok and verdicts["envfirst.sub"].ok
    assert verdicts["envfirst"].how.startswith("fresh after fork:heavy said suspect: changed the environment")
    assert verdicts["envfirst"].seconds <= verdicts["envfirst.sub"].seconds
    assert pairs.read_text() == "envfirst envsub "  # one fresh run for both, none before it


def test_the_import_check_pairs_an_entry_item_with_the_module_it_imports_first(rc):
    code = "code:" + b"from mbridge import AutoBridge".hex()
    other = "code:" + b"import argparse; from sglang.srt.server_args import ServerArgs".hex()
    items = (code, "verl.trainer.main_ppo,transfer_queue", "verl.trainer.sft_trainer", other)
    modules = ["mbridge", "verl", "transfer_queue", "sglang", "torch"]
    assert rc.paired(items, modules) == {code: "mbridge", "verl.trainer.main_ppo,transfer_queue": "verl"}
    assert rc.first_import("code:" + b"import torch.nn as nn, json".hex()) == "torch"
    assert rc.first_import("code:" + b"from . import x".hex()) is None
    assert rc.paired(("code:" + b"import torch".hex(),), ["torch"]) == {}  # the preload: apart


def test_a_module_listed_twice_by_the_same_distribution_is_noted_once(rc, monkeypatch):
    """#38 item 5: the venv sees the system site-packages too, so Debian's setuptools (which
    lists a `debian` module it does not ship) was noted twice."""

    class Dist:
        metadata = {"Name": "setuptools"}

    monkeypatch.setattr(rc.importlib.metadata, "distributions", lambda: [Dist(), Dist()])
    monkeypatch.setattr(rc, "top_level_modules", lambda dist: ["debian_not_shipped_here"])
    modules, absent = rc.discover_modules()
    assert modules == {} and absent == ["debian_not_shipped_here (setuptools)"]
