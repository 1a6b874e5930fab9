"""The module structure: no module imports a module that imports it back (lazy imports
inside functions included: they close a cycle just the same when they run), command
modules never import the CLI, and only gitfetch.py runs git to fetch."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mtpimage"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the mtpimage modules it imports anywhere in its code (top level or lazily)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:  # `from . import sources`
                        edges.add(f"{target}.{alias.name}")
                    elif target in mods:  # `from .plan import Plan`
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "mtpimage.commands.mainjob" in graph["mtpimage.cli"]  # imported inside a function
    assert "mtpimage.assembly.verify" in graph["mtpimage.commands.verify"]  # imported inside cmd_verify


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_commands_do_not_import_the_cli():
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("mtpimage.commands"):
            assert "mtpimage.cli" not in edges, name
    # and no domain module imports a command module
    for name, edges in graph.items():
        if not name.startswith("mtpimage.commands") and name != "mtpimage.cli":
            assert not {e for e in edges if e.startswith("mtpimage.commands")}, name


def test_only_sources_runs_git_fetch_or_clone():
    """One git fetcher: no other module spells a git fetch/clone/ls-remote command."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "gitfetch.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)):
                items, is_git = node.elts, False
            elif isinstance(node, ast.Call):
                func = node.func
                items = node.args
                is_git = (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")).endswith(
                    "git"
                )
            else:
                continue
            words = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            assert not ({"fetch", "clone", "ls-remote"} & words and (is_git or "git" in words)), (
                f"{path.name}:{node.lineno} runs git to fetch: use gitfetch.fetch"
            )


# ----------------------------------------------------------------------------- the engine seam
SEAM = {"engine.py", "containerengine.py", "dockerengine.py", "dockersocket.py", "buildahengine.py"}
REPO = PACKAGE.parent


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_every_dockerd_call_goes_through_the_engine_seam():
    """No Docker SDK or testcontainers anywhere; only dockerengine.py runs the docker CLI,
    only dockersocket.py opens the engine's socket; other modules reach them through
    engine.py (the fast path through dockersocket.py, its stdlib-only corner)."""
    graph = import_graph()
    for path in PACKAGE.rglob("*.py"):
        tree = _tree(path)
        rel = path.relative_to(PACKAGE).as_posix()
        sdk = {n for n in _imported(tree) if n.split(".")[0] in ("docker", "testcontainers")}
        assert not sdk, f"{rel} imports {sdk}: use the ContainerEngine passed in (engine.named)"
        if path.name in SEAM:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert name not in ("docker", "buildah"), (
                    f"{rel}:{node.lineno} runs a CLI: use the ContainerEngine passed in (engine.named)"
                )
                words = [a.value for a in node.args if isinstance(a, ast.Constant)]
                assert not (
                    words and words[0] in ("docker", "/usr/bin/docker", "buildah", "/usr/bin/buildah")
                ), f"{rel}:{node.lineno}"
            if isinstance(node, (ast.List, ast.Tuple)):  # an argv spelled as a list
                first = node.elts[0] if node.elts else None
                assert not (
                    isinstance(first, ast.Constant) and first.value in ("buildah", "/usr/bin/buildah")
                ), f"{rel}:{node.lineno} runs buildah: only the engine package does"
            if isinstance(node, ast.Attribute) and node.attr == "AF_UNIX":
                raise AssertionError(f"{rel}:{node.lineno} opens a unix socket: dockersocket.py")
    for name, edges in graph.items():
        if name.rsplit(".", 1)[-1] + ".py" in SEAM or name == "mtpimage.assembly.fastpath":
            continue
        assert "mtpimage.engine.dockerengine" not in edges, (
            f"{name}: use the ContainerEngine passed in (engine.named)"
        )
        assert "mtpimage.engine.dockersocket" not in edges, (
            f"{name}: use the ContainerEngine passed in (engine.named)"
        )
        assert "mtpimage.engine.buildahengine" not in edges, (
            f"{name}: use the ContainerEngine passed in (engine.named)"
        )
    assert graph["mtpimage.assembly.fastpath"] & {"mtpimage.engine", "mtpimage.engine.dockerengine"} == set()


def test_the_fast_path_imports_only_the_standard_library_and_its_corner():
    graph = import_graph()
    allowed = {"mtpimage.locations", "mtpimage.settings", "mtpimage.engine.dockersocket"}
    assert graph["mtpimage.assembly.fastpath"] <= allowed
    for name in allowed:
        assert graph[name] == set(), name  # and they import nothing of the tool
        third_party = {
            n
            for n in _imported(_tree(_modules()[name][0]))
            if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"
        }
        assert not third_party, (name, third_party)


# ----------------------------------------------------------------------------- settings
def _reads_mtp_variable(tree: ast.Module) -> list[int]:
    """Lines that read an MTP_* variable: os.environ[...] / .get / os.getenv with an MTP_
    name, or any use of the bare "MTP_" prefix (a scan of the environment)."""
    lines = []
    for node in ast.walk(tree):
        consts: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
            consts = [node.slice]
        elif isinstance(node, ast.Call) and any(
            w in ast.unparse(node.func) for w in ("environ.get", "getenv", "environ.setdefault")
        ):
            consts = node.args[:1]
        elif isinstance(node, ast.Constant) and node.value == "MTP_":
            lines.append(node.lineno)
        for c in consts:
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("MTP_"):
                lines.append(node.lineno)
    return lines


def test_only_the_settings_module_reads_mtp_variables():
    for path in [*PACKAGE.rglob("*.py"), REPO / "build.py"]:
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue
        lines = _reads_mtp_variable(_tree(path))
        assert not lines, f"{path.relative_to(REPO)}:{lines} reads MTP_*: add it to settings.VARIABLES"


def test_the_settings_rule_sees_a_read():
    tree = ast.parse('import os\nos.environ.get("MTP_X")\nos.environ["MTP_Y"]\nk.startswith("MTP_")\n')
    assert _reads_mtp_variable(tree) == [2, 3, 4]


# ----------------------------------------------------------------------------- size
MAX_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines():
    """A function that long does several jobs: split it by stage (as lock/locker.py's python_set is)."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.name} ({lines})")
    assert not long, long


# ----------------------------------------------------------------------------- the package order
# The packages bottom up, declared once here; docs/architecture.md states it in one line
# (ORDER_LINE). A module imports from its own package or one below it, at the top of the file
# or inside a function alike. "mtpimage" is the top-level modules (settings.py, errors.py,
# mirrors.py, gitfetch.py, imageref.py, ...) and the data packages; cli.py is the one
# top-level module on top of everything.
LAYERS = (
    "mtpimage",
    "manifests",
    "plan",
    "publish",
    "engine",
    "ext",
    "lock",
    "assembly",
    "outputs",
    "demo",
    "commands",
    "cli",
)
ORDER_LINE = "Package order, bottom up: " + " < ".join(f"`{name}`" for name in LAYERS) + "."
# An import inside a function says why it is not at the top, on its line or the line above:
# `# deferred: import cost: ...` (the fast path, a command's back-end) or an optional dependency.
DEFERRED = "# deferred: "


def layer(module: str) -> int:
    """mtpimage.lock.locker -> the index of `lock`; mtpimage.settings -> 0; mtpimage.cli -> top."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS[1:] else 0


def _import_targets(node: ast.Import | ast.ImportFrom, package: str, mods) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]


def project_imports() -> list[tuple[str, str, int, bool, str]]:
    """(module, imported module, line, inside a function?, its line and the line above) of every
    import of an mtpimage module anywhere in the package."""
    mods = _modules()
    out = []
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rsplit(".", 1)[0]
        lines = path.read_text().splitlines()
        stack: list[tuple[ast.AST, bool]] = [(ast.parse("\n".join(lines), str(path)), False)]
        while stack:
            node, in_function = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    said = "\n".join(lines[max(child.lineno - 2, 0) : child.lineno])
                    for target in _import_targets(child, package, mods):
                        if target.split(".")[0] == "mtpimage":
                            out.append((name, target, child.lineno, in_function, said))
                function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                stack.append((child, in_function or function))
    return out


def upward(imports) -> list[str]:
    return [f"{m}:{line} imports {t}" for m, t, line, _, _ in imports if layer(t) > layer(m)]


def test_no_module_imports_a_package_above_its_own():
    wrong = upward(project_imports())
    assert not wrong, f"imports against the package order ({ORDER_LINE}): {wrong}"


def test_every_import_inside_a_function_says_why():
    silent = sorted(
        {f"{m}:{line}" for m, _, line, inside, said in project_imports() if inside and DEFERRED not in said}
    )
    assert not silent, (
        f"imports inside functions without a `{DEFERRED}<why>` comment (hoist them to the top): {silent}"
    )


def test_the_order_rule_sees_an_upward_import():
    assert layer("mtpimage.settings") == 0 and layer("mtpimage.cli") == len(LAYERS) - 1
    assert layer("mtpimage.data") == 0  # a data package sits with the top-level modules
    found = upward([("mtpimage.plan.model", "mtpimage.lock.lockfile", 3, True, f"{DEFERRED}x")])
    assert found == ["mtpimage.plan.model:3 imports mtpimage.lock.lockfile"]  # a reason does not excuse it
    assert upward([("mtpimage.lock.locker", "mtpimage.plan.model", 3, False, "")]) == []


def test_the_order_is_stated_in_architecture_md():
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert ORDER_LINE in doc.splitlines(), f"docs/architecture.md should carry the line: {ORDER_LINE}"
