"""scripts/arch_figures.py: it runs, docs/architecture-figures.md carries the figures of this
tree (regenerate with `python3 scripts/arch_figures.py --update-doc`), and each figure counts
what its docstring says, on a small tree made here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "arch_figures.py"


def _script():
    spec = importlib.util.spec_from_file_location("arch_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_runs_and_prints_json():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert set(figures["counts"]) == set(_script().LABELS)
    assert len(figures["longest_functions"]) == 10


def test_the_doc_carries_the_figures_of_this_tree():
    af = _script()
    doc = af.DOC.read_text()
    assert af.documented(doc) == af.markdown(af.figures(REPO)), (
        "docs/architecture-figures.md is stale: run `python3 scripts/arch_figures.py --update-doc`"
    )


def test_a_wrong_checkout_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "fix:" in proc.stderr


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_each_figure_counts_what_it_says(tmp_path):
    root = _tree(
        tmp_path,
        {
            "README.md": "one\ntwo\nthree\n",
            "mtpimage/__init__.py": "",
            "mtpimage/cli.py": "from mtpimage.a import x\n",
            "mtpimage/a/__init__.py": "",
            "mtpimage/a/x.py": """\
                from mtpimage import engine
                from mtpimage.engine import BuildRequest, current
                from mtpimage.settings import IMAGE_REPOSITORY


                def rows(plan, e, parts):
                    import json  # an import inside a function

                    first = e[0] + e[-1] + plan.locked[0] + parts[0] + e[1:3]  # 3: parts and slices are not
                    if e["kind"] == "locked" or e.get("kind") in ("a", "b") or e.kind == "x" or e["kind"] == y:
                        engine.current()
                        current()
                    BuildRequest(context_tar=b"")
                    tag = f"{IMAGE_REPOSITORY}:{first}"
                    other = f"{IMAGE_REPOSITORY}-{first}"
                    return json, tag, other

                    def nested():
                        from os import path  # counted once, in nested
                """,
            "mtpimage/b/__init__.py": "from mtpimage.a import x\n",
            "mtpimage/engine/__init__.py": "from mtpimage.b import y\nfrom mtpimage.a import x\n",
            "mtpimage/b/y.py": "def f():\n    from mtpimage.a import x  # a project import inside a function\n",
            "tests/unit/test_imports.py": 'LAYERS = ("mtpimage", "a", "b", "engine", "cli")\n',
            "images/partials/layer.j2": (
                '{% for s in steps if s.kind == "git" %}{% if s.kind in ("a", "b") %}x{% endif %}{% endfor %}\n'
                "{% if s.name == 'x' %}{% endif %}\n"
            ),
        },
    )
    (root / "mtpimage/a/__init__.py").write_text("from mtpimage.engine import current\n")
    f = _script().figures(root)
    assert f["counts"] == {
        "positional_reads": 3,
        "kind_branches": 3 + 2,  # the comparison with a name is not against a literal
        "engine_current": 2,
        "build_requests": 1,
        "local_tags": 1,
        "function_imports": 3,
        "package_pairs": 1,  # a <-> engine; b -> a and engine -> b run one way; cli is no package
        "project_function_imports": 1,  # b/y.py's; json and os.path are not the project's
        "back_arrows": 1,  # a -> engine goes up the declared order; the rest go down it
        "readme_lines": 3,
    }
    assert f["where"]["package_pairs"] == ["mtpimage.a <-> mtpimage.engine"]
    assert f["where"]["back_arrows"] == ["a -> engine"]
    assert [r["function"] for r in f["longest_functions"]] == [
        "mtpimage.a.x.rows",
        "mtpimage.a.x.rows.nested",
        "mtpimage.b.y.f",
    ]
