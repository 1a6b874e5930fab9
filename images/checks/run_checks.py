#!/usr/bin/env python3
"""In-image checks of the MTP image builder. Copied into every image at /opt/mtp/checks/.

    python /opt/mtp/checks/run_checks.py [--json] [--gpu] [--only ID ...] [--reuse GROUP=DIGEST ...]

Checks (each reports pass, fail or skip, with a detail and its time in seconds):
  imports        import every installed distribution's top-level modules, each alone: in a
                 child forked from a fork server (import_server.py; torch preloaded for the
                 modules that import it), or in a fresh interpreter where a child cannot
                 vouch for a fresh interpreter's verdict (modules listed in import_skip.txt
                 need a GPU at import: skipped)
  pip-check      `pip check`: no broken or conflicting requirements
  versions       every installed component and package matches /opt/mtp/version.json:
                 commits of git sources (also as pip records them: direct_url.json),
                 versions, sha256 of applied patches
  probe:<id>     the lock's source probes repeated on what is installed, as the version
                 vector describes them (recompute-padding-mask: inspect.signature of
                 Megatron's MTP layer)
  cuda-runtime   CUDA runtime libraries present (skipped on bases without CUDA)
  login-shell    `bash -l` and `sh -l` (cluster job scripts) see this environment: the same
                 variables, the venv's python first on PATH (/etc/profile.d/mtp-env.sh)
  launch-env     the variables components ask for (VERL_USE_UV=0), and one-copy: each pinned
                 package (megatron, verl, sglang, transformer_engine, ...) once on sys.path,
                 the pinned copy (the job scripts run this group before the trainer)
  native-libs    native_libs.py: each native library of native_libs.txt (NCCL, cuDNN, cuBLAS,
                 cudart, nvrtc) one copy on the loader path, the lock's wheel's; `ldd -r`
                 finds no undefined symbol in the compiled extensions (docs/site-checks.md)
  mtp-grad       the mode's gradient contract on the CPU (gloo), before any tag:
                 images/checks/gpu_check.py --cpu-model with this image's megatron-core,
                 its verl's MTP patch and the profile's overrides (/opt/mtp/verl/*.overrides);
                 mtp-only: gradient to the MTP block only, the output layer counted, with
                 and without full recompute (skipped where torch or megatron is absent)
  gpu            images/checks/gpu_check.py, only with --gpu

--reuse GROUP=DIGEST: the host holds the results of GROUP from an image with the same
lower layers, proved with these inputs (see REUSABLE); when this image's inputs of GROUP
hash to DIGEST the group is reported as one `reused` placeholder instead of being run.
MTP_IMPORT_TIMEOUT (seconds per module, 300), MTP_IMPORT_PRELOAD (comma list, torch),
MTP_IMPORT_FORK=0 (one fresh interpreter per module, as before) tune the import check.

A check that reports how many things it checked (`checked`) and checked none is a skip,
whatever it returned: a pass must mean something was looked at.

Exit status 0 when nothing failed, 1 otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VECTOR = Path(os.environ.get("MTP_VERSION_VECTOR", "/opt/mtp/version.json"))
RECORDS = Path("/opt/mtp/installed")
PASS, FAIL, SKIP = "pass", "fail", "skip"
# Not a verdict of this run: the host asked to reuse a group whose inputs are unchanged, and
# puts the recorded results in its place (mtpimage/build/imagetest.py).
REUSED = "reused"


def result(cid: str, status: str, detail: str, checked: int | None = None) -> dict:
    """checked: how many things the check looked at, where it counts them."""
    out = {"id": cid, "status": status, "detail": detail}
    if checked is not None:
        out["checked"] = checked
    return out


def settle(r: dict) -> dict:
    """A pass that checked nothing is a skip (mtpimage/build/imagetest.py applies the same rule)."""
    if r["status"] == PASS and r.get("checked") == 0:
        return {**r, "status": SKIP, "detail": "nothing checked: " + r["detail"]}
    return r


# ------------------------------------------------------------------------------- imports
def skip_list() -> dict[str, str]:
    out = {}
    path = HERE / "import_skip.txt"
    if path.is_file():
        for line in path.read_text().splitlines():
            name, _, why = line.partition("#")
            if name.strip():
                out[name.strip()] = why.strip()
    return out


def top_level_modules(dist) -> set[str]:
    names: set[str] = set()
    text = dist.read_text("top_level.txt")
    if text:
        names.update(n.strip().replace("/", ".") for n in text.splitlines() if n.strip())
    else:
        for f in dist.files or []:
            parts = f.parts
            if (
                not parts
                or parts[0].endswith((".dist-info", ".egg-info", ".data"))
                or parts[0] in ("..", "__pycache__")
            ):
                continue
            if len(parts) == 1:
                if parts[0].endswith(".py"):
                    names.add(parts[0][:-3])
                elif parts[0].endswith((".so", ".pyd")):
                    names.add(parts[0].split(".")[0])
            elif parts[-1] == "__init__.py" and len(parts) == 2:
                names.add(parts[0])
            elif len(parts) >= 2 and parts[-1].endswith(".py"):
                names.add(parts[0])  # namespace package
    return {n for n in names if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", n) and not n.startswith("__")}


# Each module is imported alone, as a fresh `python -c "import m"` would, so one module's side
# effects or crash cannot hide another's failure. A fresh interpreter per module pays Python's
# and torch's start-up ~280 times on the real stack, so a fork server (import_server.py)
# imports the heavy common base once and forks a child per module; a child's verdict stands
# only where it is a fresh interpreter's: every failure, crash, hang and every module that
# did not itself import the preload first is imported again in a fresh interpreter, whose
# verdict is the one reported (docs/checks.md, "In-image checks": "Not covered", for what this leaves open).
IMPORT_TIMEOUT = float(os.environ.get("MTP_IMPORT_TIMEOUT") or 300)
# Measured on the real stack (bench/RESULTS.md): torch is the one module most others import,
# and the largest share of their import time; MTP_IMPORT_PRELOAD replaces it (comma list).
PRELOAD = ("torch",)
SERVER = HERE / "import_server.py"
# A server that says nothing for this long past the per-module timeout is stuck itself.
SERVER_GRACE = 60.0


# One module's verdict: ok, the error (or crash, timeout), how it was imported (fork:bare,
# fork:heavy, or fresh and why) and how long that took.
Imported = collections.namedtuple("Imported", "ok detail how seconds")


def forking() -> bool:
    """The fork servers; MTP_IMPORT_FORK=0 is the way before: a fresh interpreter each."""
    return os.environ.get("MTP_IMPORT_FORK", "1") != "0"


def preload_names() -> tuple[str, ...]:
    env = os.environ.get("MTP_IMPORT_PRELOAD")
    return PRELOAD if env is None else tuple(env.replace(",", " ").split())


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# Said on stderr by a fresh `FIRST|NAME` run once FIRST imported (import_fresh_pair).
FIRST_DONE = "mtp-import-check: first import done"


def python_code(item: str) -> str:
    """What `python -c` runs for an item of the import check (import_server.py's protocol):
    comma-joined modules, `code:HEX`, or `FIRST|NAME`."""
    first, _, rest = item.rpartition("|")
    code = bytes.fromhex(rest[len("code:") :]).decode() if rest.startswith("code:") else f"import {rest}"
    if first:
        # sys is in every interpreter from its start: naming it changes nothing a module sees
        said = f"{FIRST_DONE!r} + ' ' + repr(__import__('time').monotonic()) + chr(10)"
        return f"import {first}\n__import__('sys').stderr.write({said})\n{code}"
    return code


def _import_one(module: str, timeout: float | None = None) -> tuple[str, int, str, float | None]:
    """(module, exit status, last line of stderr, when a `FIRST|NAME` run's FIRST was done)."""
    timeout = IMPORT_TIMEOUT if timeout is None else timeout
    try:
        proc = subprocess.run(
            [sys.executable, "-c", python_code(module)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )
    except subprocess.TimeoutExpired:
        return module, 124, f"timed out after {timeout:g} s", None
    lines = (proc.stderr or "").strip().splitlines()
    done_at = None
    for line in lines:
        _before, said, when = line.partition(FIRST_DONE + " ")
        if said:
            try:
                done_at = float(when)
            except ValueError:
                pass
    lines = [line for line in lines if FIRST_DONE not in line]
    return module, proc.returncode, lines[-1] if lines else "", done_at


# A torch C++ extension module (apex's amp_C, flash_attn_2_cuda, ...) NEEDs libc10.so and
# libtorch*.so without a path to them: it loads only once torch did, as its own package always
# does first. Imported alone it fails with exactly this; then it is imported after torch.
_TORCH_LIBS = re.compile(r"lib(c10|torch)[a-z0-9_]*\.so[.0-9]*: cannot open shared object file")
EXTENSION_BASE = "torch"  # what such a module is imported after


def import_fresh(module: str, timeout: float, why: str = "fresh") -> Imported:
    started = time.monotonic()
    _m, rc, last, _done = _import_one(module, timeout)
    if rc > 0 and _TORCH_LIBS.search(last) and module != EXTENSION_BASE:
        _m, rc, after, _done = _import_one(f"{EXTENSION_BASE}, {module}", timeout)
        last = "a torch C++ extension: imported after torch" if rc == 0 else after
    if rc < 0:
        last = f"crashed: {_signal_name(-rc)}" + (f" ({last})" if last else "")
    return Imported(rc == 0, last, why, time.monotonic() - started)


def import_fresh_pair(item: str, timeout: float, why: str = "fresh") -> dict[str, Imported]:
    """`FIRST|NAME` in one fresh interpreter: both verdicts when FIRST imported and NAME went
    on; otherwise each in its own (FIRST's failure, or a FIRST that exits, is not NAME's)."""
    first, _, rest = item.rpartition("|")
    started = time.monotonic()
    _m, rc, last, done_at = _import_one(item, timeout)
    seconds = time.monotonic() - started
    if done_at is None or rc < 0 or rc == 124:
        return {first: import_fresh(first, timeout, why), rest: import_fresh(rest, timeout, why)}
    return {first: Imported(True, "", why, done_at - started), rest: Imported(rc == 0, last, why, seconds)}


def _from_server(kind: str, seconds: str, detail: str) -> Imported:
    """A child's verdict; only `ok` stands (the others are imported again, fresh)."""
    if kind == "crash" and detail.startswith("signal "):
        number, _, last = detail[len("signal ") :].partition(":")
        detail = f"crashed: {_signal_name(int(number))}" + (f" ({last.strip()})" if last.strip() else "")
    return Imported(kind == "ok", detail, kind, float(seconds))


class ForkServer:
    """One import_server.py process: modules go in on its stdin as they come, its output lines
    come out as events (server, fields), then (server, None) at its end."""

    def __init__(self, name: str, events: queue.Queue, job: list[str]):
        self.name = name
        self.sent: set[str] = set()
        self.reported: set[str] = set()
        self.open = True
        boot = f"exec(compile(open({str(SERVER)!r}).read(), {str(SERVER)!r}, 'exec'))"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd="/",
        )
        self._write("\n".join(job) + "\nstart\n")
        threading.Thread(target=self._pump, args=(events,), daemon=True).start()

    def _pump(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            events.put((self, line.rstrip("\n").split("\t")))
        events.put((self, None))

    def _write(self, text: str) -> bool:
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):  # it ended: the caller imports fresh
            self.open = False
            return False

    def send(self, module: str, prefix: str = "") -> bool:
        """prefix: the file the bare child wrote when the module asked for the preload."""
        if self.open and self._write(f"module {module} {prefix}".rstrip() + "\n"):
            self.sent.add(module)
            return True
        return False

    def close(self) -> None:
        if self.open:
            self.open = False
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def stop(self) -> None:
        self.close()
        self.proc.kill()
        self.proc.wait()

    def unreported(self) -> set[str]:
        return self.sent - self.reported


class ImportRun:
    """Import each module alone (module docstring of import_server.py): the preload in its own
    fresh interpreter; every other module in a child of a server without preload, handed to a
    server that preloaded the heavy base when it asks for it; every verdict a child cannot
    vouch for (failure, crash, hang, suspect), and every module a server left, again in a
    fresh interpreter, whose verdict is the one reported."""

    def __init__(
        self, modules: list[str], preload: list[str], timeout: float, jobs: int, check_preload: bool = True
    ):
        self.modules, self.preload, self.timeout, self.jobs = modules, preload, timeout, jobs
        self.check_preload = check_preload  # the preload alone, fresh, like any module
        self.forked: dict[str, Imported] = {}
        self.fresh_runs: dict[str, concurrent.futures.Future] = {}
        self.notes: list[str] = []
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None

    def fresh(self, module: str, why: str) -> None:
        first, _, rest = module.rpartition("|")
        if first and self.judged(first):
            module = rest  # its first import has its verdict: the rest alone
        if module not in self.fresh_runs:
            run = import_fresh_pair if "|" in module else import_fresh
            self.fresh_runs[module] = self.pool.submit(run, module, self.timeout, why)

    def judged(self, module: str) -> bool:
        return module in self.forked or any(module in (k, k.rpartition("|")[0]) for k in self.fresh_runs)

    def on_part(self, server: ForkServer, fields: list[str]) -> None:
        """FIRST of a `FIRST|NAME` item, judged on the way (the item's own result follows)."""
        _p, first, kind, seconds, detail = fields
        if self.judged(first):
            return  # judged already: by the bare child of an item handed on, or fresh
        if kind == "ok":
            self.forked[first] = Imported(True, "", f"fork:{server.name}", float(seconds))
        else:
            self.again(server, first, kind, seconds, detail)

    def again(self, server: ForkServer, module: str, kind: str, seconds: str, detail: str) -> None:
        """A verdict a child cannot vouch for: a fresh interpreter decides."""
        said = _from_server(kind, seconds, detail)
        self.fresh(module, f"fresh after fork:{server.name} said {kind}: {said.detail}"[:300])

    def _job(self, tmp: str, preload: list[str], handoff: list[str]) -> list[str]:
        return [f"timeout {self.timeout}", f"jobs {self.jobs}", f"tmp {tmp}"] + [
            f"{key} {name}" for key, names in (("preload", preload), ("handoff", handoff)) for name in names
        ]

    def on_result(self, server: ForkServer, fields: list[str], heavy: ForkServer | None) -> None:
        _r, module, kind, seconds, detail = fields
        server.reported.add(module)
        if kind == "ok":
            self.forked[module.rpartition("|")[2]] = Imported(True, "", f"fork:{server.name}", float(seconds))
        elif kind == "needs" and heavy is not None and heavy.send(module, detail.partition(" ")[2]):
            pass  # asked for the heavy base: the server that preloaded it imports it
        elif (
            kind == "fail"
            and server is not heavy
            and heavy is not None
            and EXTENSION_BASE in self.preload
            and _TORCH_LIBS.search(detail)
            and heavy.send(module, "after")
        ):
            pass  # a torch C++ extension: imported after torch, as import_fresh does
        else:
            self.again(server, module, kind, seconds, detail)

    def on_end(self, server: ForkServer, heavy: ForkServer | None) -> None:
        for module in sorted(server.unreported()):
            self.fresh(module, f"fresh: fork:{server.name} ended first")
        if heavy is not None and server is not heavy:
            heavy.close()  # the bare server hands off nothing more

    def loop(self, events: queue.Queue, bare: ForkServer, heavy: ForkServer | None) -> None:
        live = {bare} | ({heavy} if heavy else set())
        while live:
            try:
                server, fields = events.get(timeout=self.timeout + SERVER_GRACE)
            except queue.Empty:
                self.notes.append(f"the fork servers said nothing for {self.timeout + SERVER_GRACE:g} s")
                for server in live:
                    server.stop()
                    self.on_end(server, None)
                return
            if fields is None:
                live.discard(server)
                self.on_end(server, heavy)
            elif fields[0] == "result" and len(fields) == 5:
                self.on_result(server, fields, heavy)
            elif fields[0] == "part" and len(fields) == 5:
                self.on_part(server, fields)
            elif fields[0] == "fallback":
                self.notes.append(f"fork:{server.name}: {' '.join(fields[1:])}")
                server.close()

    def run(self) -> dict[str, Imported]:
        rest = [m for m in self.modules if m not in self.preload]
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as self.pool:
            with tempfile.TemporaryDirectory(prefix="mtp-imports-") as tmp:
                for module in self.preload if self.check_preload else ():
                    self.fresh(module, "fresh: preloaded")
                events: queue.Queue = queue.Queue()
                os.makedirs(os.path.join(tmp, "bare"))
                bare = ForkServer("bare", events, self._job(os.path.join(tmp, "bare"), [], self.preload))
                heavy = None
                if self.preload:
                    os.makedirs(os.path.join(tmp, "heavy"))
                    heavy = ForkServer(
                        "heavy", events, self._job(os.path.join(tmp, "heavy"), self.preload, [])
                    )
                for module in rest:
                    if not bare.send(module):
                        self.fresh(module, "fresh: fork:bare did not start")
                bare.close()
                try:
                    self.loop(events, bare, heavy)
                finally:
                    for server in (bare, heavy):
                        if server is not None:
                            server.stop()
            verdicts = dict(self.forked)
            for module, future in self.fresh_runs.items():
                found = future.result()
                verdicts.update(found if isinstance(found, dict) else {module: found})
            return verdicts


def import_modules(
    modules: list[str],
    preload=None,
    timeout: float | None = None,
    jobs: int | None = None,
    check_preload: bool = True,
) -> tuple[dict[str, Imported], dict]:
    """Each module's verdict, imported alone, and how they were reached (the preload, notes).
    check_preload=False: the preload is a base the modules build on, not one of them (any
    installed one is preloaded, and not checked here)."""
    timeout = IMPORT_TIMEOUT if timeout is None else timeout
    jobs = jobs or min(8, os.cpu_count() or 2)
    preload = [
        p
        for p in (preload_names() if preload is None else preload)
        if (p in modules if check_preload else importlib.util.find_spec(p) is not None)
    ]
    if not forking():
        # the way before the fork servers: one fresh interpreter per module (bench/imports.py)
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = {m: pool.submit(import_fresh, m, timeout) for m in modules}
            return {m: f.result() for m, f in futures.items()}, {
                "preload": [],
                "notes": ["MTP_IMPORT_FORK=0"],
            }
    run = ImportRun(modules, preload, timeout, jobs, check_preload)
    verdicts = run.run()
    return verdicts, {"preload": preload, "notes": run.notes}


def _how(verdicts: dict[str, Imported], info: dict) -> str:
    """How the modules were imported, for the check's detail."""
    count = {
        k: sum(v.how.startswith(k) for v in verdicts.values())
        for k in ("fork:bare", "fork:heavy", "fresh: preloaded", "fresh after")
    }
    other = len(verdicts) - sum(count.values())
    text = f"{count['fork:bare']} in forked fresh interpreters"
    if info["preload"]:
        text += f", {count['fork:heavy']} forked after preloading {', '.join(info['preload'])}"
        text += f" ({count['fresh: preloaded']} preloaded: fresh)"
    if count["fresh after"] or other:
        text += f", {count['fresh after'] + other} again in a fresh interpreter (the fork could not vouch)"
    if info["notes"]:
        text += f" [{'; '.join(info['notes'])}]"
    slow = sorted(verdicts.items(), key=lambda kv: -kv[1].seconds)[:3]
    return text + "; slowest: " + ", ".join(f"{m} {v.seconds:.1f} s" for m, v in slow)


def discover_modules() -> tuple[dict[str, str], list[str]]:
    """module -> its distribution, and the modules listed but not shipped."""
    modules: dict[str, str] = {}
    absent: list[str] = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or "?"
        for mod in top_level_modules(dist):
            if importlib.util.find_spec(mod.split(".")[0]) is None:
                # Some builds list modules they do not ship (Debian-patched setuptools lists
                # `debian`): noted, not failed; a broken install fails its other modules.
                absent.append(f"{mod} ({name})")
                continue
            modules.setdefault(mod, name)
    # the venv sees the system's site-packages too: the same distribution can be found twice
    return modules, list(dict.fromkeys(absent))


# The entry checks' items that the import check's fork servers judged along with the modules
# (run(): when both groups run, one pool keeps both cores busy to the end, and one torch
# preload serves both); check_entry_imports reports them.
PREFETCHED: dict[str, Imported] = {}


def first_import(item: str) -> str | None:
    """The top-level module whose import is the first thing an item does (Python imports a
    dotted name's top package first), or None."""
    if item.startswith("code:"):
        import ast

        try:
            body = ast.parse(bytes.fromhex(item[len("code:") :]).decode()).body
        except (SyntaxError, ValueError):
            return None
        node = body[0] if body else None
        if isinstance(node, ast.Import):
            name = node.names[0].name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            name = node.module
        else:
            return None
    else:
        name = item.split(",")[0]
    return name.split(".")[0]


def paired(entry_items: tuple[str, ...], modules: list[str]) -> dict[str, str]:
    """item -> the module of `modules` it imports first (import_server.py: `FIRST|NAME`), each
    module for one item at most; the preload is judged on its own."""
    pairs: dict[str, str] = {}
    free = set(modules) - set(preload_names())
    for item in entry_items:
        first = first_import(item)
        if first in free:
            pairs[item] = first
            free.discard(first)
    return pairs


def check_imports(entry_items: tuple[str, ...] = ()) -> list[dict]:
    """entry_items: also judge these (the entry checks' items, first: the slowest ones); a
    module that an item imports first is judged by the item's child on the way."""
    skips = skip_list()
    modules, absent = discover_modules()
    todo = sorted(m for m in modules if m.split(".")[0] not in skips)
    skipped = sorted(m for m in modules if m.split(".")[0] in skips)
    pairs = paired(entry_items, todo)
    items = [f"{pairs[i]}|{i}" if i in pairs else i for i in entry_items]
    verdicts, info = import_modules([*items, *(m for m in todo if m not in pairs.values()), *skipped])
    PREFETCHED.update({item: verdicts.pop(item) for item in entry_items if item in verdicts})
    failures = [f"{m} ({modules[m]}): {verdicts[m].detail}" for m in todo if not verdicts[m].ok]
    # the skip list proves itself: a skipped module that imports fine is a stale entry
    failures += [
        f"{m} ({modules[m]}): in import_skip.txt but imports fine here (remove it from the skip list)"
        for m in skipped
        if verdicts[m].ok
    ]
    detail = f"{len(todo) - len(failures)}/{len(todo)} top-level modules import"
    if skipped:
        detail += f"; skipped (not a module, or GPU at import): {', '.join(skipped)}"
    if absent:
        detail += f"; listed in top_level.txt but not shipped: {', '.join(sorted(absent))}"
    if verdicts:
        detail += "; " + _how(verdicts, info)
    if entry_items:
        detail += f"; the same servers judged the {len(entry_items)} entry checks' imports (reported there)"
    if pairs:
        detail += f", on the way {', '.join(sorted(pairs.values()))}"
    if failures:
        return [result("imports", FAIL, detail + "; failed: " + "; ".join(failures), len(todo))]
    return [result("imports", PASS, detail, len(todo))]


# ------------------------------------------------------------------------------- pip check
def _requirement_name(text: str) -> str:
    return re.split(r"[<>=!~\[; ,]", text.strip(), maxsplit=1)[0].lower().replace("_", "-")


def explained(line: str, vector: dict) -> bool:
    """A `pip check` line is explained by the version vector when it concerns a package an
    override or exclude of lock.yaml's resolution replaces, or a source installed without its
    declared dependencies (upstream's --no-deps): exactly the declared differences."""
    res = vector.get("resolution") or {}
    required = {_requirement_name(o["requirement"]) for o in res.get("overrides", [])}
    required |= {_requirement_name(e["package"]) for e in res.get("excludes", [])}
    dependents = {
        c["package"].lower() for c in vector.get("components", []) if c.get("dependencies_declared") is False
    }
    m = re.match(r"^(\S+) \S+ (?:requires|has requirement) (\S+)", line)
    if not m:
        return False
    return m.group(1).lower() in dependents or _requirement_name(m.group(2)) in required


def check_pip(vector: dict | None = None) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.strip() and not l.startswith("No broken")]
    if proc.returncode == 0 and not lines:
        return [result("pip-check", PASS, "no broken requirements")]
    bad = [l for l in lines if not explained(l, vector or {})]
    ok = len(lines) - len(bad)
    if bad or (proc.returncode != 0 and not lines):
        return [result("pip-check", FAIL, "; ".join(bad) or proc.stderr.strip()[-300:])]
    return [
        result(
            "pip-check",
            PASS,
            f"{ok} difference(s), each a declared override, exclude or no-deps source (lock.yaml resolution)",
        )
    ]


# ------------------------------------------------------------------------------- versions
def _norm(v: str | None) -> str:
    """PEP 440 normal form where packaging is there (0.10.0.dev == 0.10.0.dev0)."""
    text = (v or "").strip().lower().replace("_", "-")
    try:
        from packaging.version import Version

        return str(Version(text))
    except Exception:  # noqa: BLE001 - not a version, or no packaging: compare as text
        return text


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _origin(package: str) -> tuple[str | None, str | None]:
    """(url, commit) of a VCS install as PEP 610's direct_url.json records it: what `pip
    freeze` and `pip inspect` report for the distribution."""
    text = importlib.metadata.distribution(package).read_text("direct_url.json")
    data = json.loads(text) if text else {}
    return data.get("url"), (data.get("vcs_info") or {}).get("commit_id")


def check_versions(vector: dict) -> list[dict]:
    problems, ok = [], 0
    for comp in vector["components"]:
        rec_path = RECORDS / f"{comp['name']}.json"
        if not rec_path.is_file():
            problems.append(f"{comp['name']}: no install record {rec_path}")
            continue
        rec = json.loads(rec_path.read_text())
        have = _installed(comp["package"])
        if have is None:
            problems.append(f"{comp['name']}: distribution {comp['package']} not installed")
            continue
        if have != rec.get("version"):
            problems.append(f"{comp['name']}: installed {have}, recorded at build {rec.get('version')}")
        if comp["source"] == "git":
            if rec.get("commit") != comp["commit"]:
                problems.append(
                    f"{comp['name']}: installed from commit {rec.get('commit')}, "
                    f"version vector says {comp['commit']}"
                )
            origin = _origin(comp["package"])
            if origin != (comp["repo"], comp["commit"]):
                problems.append(
                    f"{comp['name']}: pip records its origin as {origin[0]}@{origin[1]} "
                    f"(direct_url.json), not {comp['repo']}@{comp['commit']}"
                )
            if comp.get("version") and _norm(comp["version"]) != _norm(have):
                problems.append(
                    f"{comp['name']}: commit {comp['commit'][:10]} installs {comp['package']} "
                    f"{have}, the manifest says {comp['version']}"
                )
        elif _norm(have) != _norm(comp["version"]):
            problems.append(f"{comp['name']}: {comp['package']} {have} installed, pinned {comp['version']}")
        # the build context names patch i "<iii>-<basename>" (mtpimage.build.render.patch_name)
        want = sorted((f"{i:03d}-{Path(p['file']).name}", p["sha256"]) for i, p in enumerate(comp["patches"]))
        got = sorted((p["file"], p["sha256"]) for p in rec.get("patches", []))
        if want != got:
            problems.append(f"{comp['name']}: applied patches {got} != version vector {want}")
        ok += 1
    exact = vector.get("python_packages") or {}
    wrong = [
        f"{n} {_installed(n)} installed, lock {v}"
        for n, v in sorted(exact.items())
        if _norm(_installed(n)) != _norm(v)
    ]
    if wrong:
        problems.append("not the locked set: " + "; ".join(wrong[:20]) + (" ..." if len(wrong) > 20 else ""))
    omitted = {
        s["detail"].split("==", 1)[0] for s in vector.get("substitutions", []) if s["what"] == "omitted"
    }
    compared = len(vector["components"]) + len(exact)
    for pkg in vector["packages"]:
        if pkg["name"] in omitted:
            continue
        compared += 1
        have = _installed(pkg["name"])
        if have is None:
            problems.append(f"package {pkg['name']} not installed")
        elif _norm(have) != _norm(pkg["version"]):
            problems.append(f"package {pkg['name']} {have} installed, pinned {pkg['version']}")
        else:
            ok += 1
    if problems:
        return [result("versions", FAIL, "; ".join(problems), compared)]
    return [
        result(
            "versions",
            PASS,
            f"{len(vector['components'])} components, "
            f"{len(vector['packages'])} packages and {len(exact)} locked distributions match "
            "the version vector",
            compared,
        )
    ]


# ------------------------------------------------------------------------------- probes
def _module_file(module: str) -> Path | None:
    """The file of a dotted module, found by path from its top-level package: find_spec of a
    submodule would import its parents (Megatron-Bridge's __init__ imports TransformerEngine,
    which a CPU-only builder or an image without TE cannot load)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    bases = list(spec.submodule_search_locations or []) or (
        [str(Path(spec.origin).parent)] if spec.origin else []
    )
    for base in bases:
        stem = Path(base, *rest)
        for cand in (stem.with_suffix(".py"), stem / "__init__.py"):
            if rest and cand.is_file():
                return cand
        if not rest and spec.origin and os.path.isfile(spec.origin):
            return Path(spec.origin)
    return None


def _source_of(module: str) -> str | None:
    path = _module_file(module)
    return path.read_text(errors="replace") if path else None


# What each probe reads and expects is not written here: the version vector carries each
# probe's entry of mtpimage/data/probes.yaml (file, class, symbol, expectation, fix), the one
# description the builder's source probes use too.
def _module_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def probe_recompute(spec: dict) -> tuple[str, str]:
    import importlib
    import inspect

    cls_name, caller, callee, kw = spec["class"], spec["caller"], spec["callee"], spec["keyword"]
    try:
        cls = getattr(importlib.import_module(_module_of(spec["file"])), cls_name)
    except Exception as exc:  # noqa: BLE001 - report any import problem
        return FAIL, f"cannot import {cls_name}: {type(exc).__name__}: {exc}"
    fwd = inspect.signature(getattr(cls, caller)).parameters
    ckpt = inspect.signature(getattr(cls, callee)).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ckpt.values())
    if kw in fwd and kw not in ckpt and not var_kw:
        return FAIL, (
            f"{cls_name}.{caller} passes {kw} but {callee}"
            f"{inspect.signature(getattr(cls, callee))} does not accept it: {spec['expect']} "
            f"({spec['fix']})"
        )
    how = f"accepts {kw}" if kw in ckpt else ("takes **kwargs" if var_kw else f"{caller} has no {kw}")
    return PASS, f"{callee} {how}"


def probe_sglang(spec: dict) -> tuple[str, str]:
    module, fn = _module_of(spec["file"]), spec["function"]
    src = _source_of(module)
    if src is None:
        return FAIL, f"{module} not found"
    if re.search(rf"^def {re.escape(fn)}\(", src, re.M):
        return PASS, f"{fn} present (update_weights_from_tensor IPC fix applied)"
    return FAIL, f"{fn} missing: the sglang IPC-unwrap patch is not applied ({spec['fix']})"


def probe_mbridge(spec: dict, package: str) -> tuple[str, str]:
    what = f"{spec['class']}.{spec['member']}"
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return FAIL, f"{package} not installed"
    enums = _source_of(_module_of(spec["file"])) or ""
    if spec["member"] in enums:
        return PASS, f"megatron-core still has {what}"
    users = [
        str(p)
        for loc in found.submodule_search_locations
        for p in Path(loc).rglob("*.py")
        if what in p.read_text(errors="replace")
    ]
    if users:
        return FAIL, f"{package} uses {what}, removed from megatron-core: " + ", ".join(users)
    return PASS, f"{package} does not use {what}"


def probe_mimo(spec: dict) -> tuple[str, str]:
    src = _source_of(_module_of(spec["file"]))
    if src is None or not re.search(rf"^class {re.escape(spec['class'])}\b", src, re.M):
        return FAIL, f"{spec['file']} has no class {spec['class']}: {spec['expect']} ({spec['fix']})"
    return PASS, f"Megatron-Bridge has the MiMo MTP bridge (class {spec['class']})"


PROBES = {
    "recompute-padding-mask": probe_recompute,
    "sglang-ipc-unwrap": probe_sglang,
    "mbridge-mcore-017": probe_mbridge,
    "mimo-needs-bridge-2387": probe_mimo,
}


def check_probes(vector: dict) -> list[dict]:
    out = []
    packages = {c["name"]: c["package"] for c in vector.get("components", [])}
    for pid, spec in (vector.get("probes") or {}).items():
        fn = PROBES.get(pid)
        if fn is None:
            out.append(result(f"probe:{pid}", FAIL, "unknown probe id"))
            continue
        if fn is probe_mbridge:
            status, detail = fn(spec, packages.get(spec["component"], spec["component"]))
        else:
            status, detail = fn(spec)
        out.append(result(f"probe:{pid}", status, detail))
    if not out:
        out.append(result("probes", SKIP, "no source probe applies to this profile"))
    return out


# ------------------------------------------------------------------------------- CUDA
def check_cuda(vector: dict) -> list[dict]:
    has_cuda = bool(os.environ.get("CUDA_VERSION")) or os.path.isdir("/usr/local/cuda")
    if not has_cuda:
        return [
            result(
                "cuda-runtime",
                SKIP,
                "this base image has no CUDA toolkit (CUDA_VERSION unset, no /usr/local/cuda): a test base",
            )
        ]
    major = (os.environ.get("CUDA_VERSION") or vector.get("cuda") or "").split(".")[0]
    dirs = [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/local/cuda/targets/sbsa-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ]
    dirs += glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "*", "lib"))
    want = ["libcudart.so", "libcublas.so", "libnccl.so"]
    missing = []
    for lib in want:
        if not any(glob.glob(os.path.join(d, lib + "*")) for d in dirs):
            missing.append(lib)
    if missing:
        return [result("cuda-runtime", FAIL, f"CUDA {major}: missing {', '.join(missing)}")]
    return [result("cuda-runtime", PASS, f"CUDA {major}: {', '.join(want)} present")]


# ------------------------------------------------------------------------------- login shells
# Set by the shell itself, not by the image.
SHELL_OWN = {"SHLVL", "_", "PWD", "OLDPWD"}


def check_login_shell() -> list[dict]:
    """Cluster job scripts run login shells, whose /etc/profile sets PATH from scratch: the
    image's environment must hold there too. Each shell runs `python` as its PATH finds it,
    which reports its prefix and the environment it was given."""
    code = "import json, os, sys; print(json.dumps([sys.prefix, dict(os.environ)]))"
    problems, tried = [], []
    for shell in ("bash", "sh"):
        exe = shutil.which(shell)
        if exe is None:
            continue
        tried.append(shell)
        proc = subprocess.run(
            [exe, "-lc", f"exec python -c '{code}'"], capture_output=True, text=True, timeout=120, cwd="/"
        )
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            problems.append(f"{shell} -l: exit {proc.returncode}: {last[0]}")
            continue
        prefix, env = json.loads(proc.stdout.strip().splitlines()[-1])
        if prefix != sys.prefix:
            problems.append(f"{shell} -l: python is {prefix}, not {sys.prefix}")
        differ = sorted(k for k, v in os.environ.items() if k not in SHELL_OWN and env.get(k) != v)
        for k in differ:
            problems.append(f"{shell} -l: {k}={env.get(k)!r}, the image has {os.environ[k]!r}")
    if not tried:
        return [result("login-shell", SKIP, "no bash or sh in this image")]
    if problems:
        return [result("login-shell", FAIL, "; ".join(problems))]
    return [
        result(
            "login-shell",
            PASS,
            f"{' and '.join(s + ' -l' for s in tried)}: python is {sys.prefix}, "
            f"{len(os.environ)} variables as the image sets them",
        )
    ]


# ----------------------------------------------------------------------------- launch
def package_dirs(dist) -> set[str]:
    """The import packages a distribution installs, as paths relative to its site directory:
    the shallowest folders with an __init__.py (megatron-core: `megatron/core`, since
    `megatron` is a namespace that Megatron-Bridge shares)."""
    inits = sorted(
        (f.parts[:-1] for f in dist.files or [] if f.parts and f.parts[-1] == "__init__.py"),
        key=len,
    )
    out: list[tuple[str, ...]] = []
    for parts in inits:
        if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "__pycache__"):
            continue
        if not any(parts[: len(o)] == o for o in out):
            out.append(parts)
    return {"/".join(p) for p in out}


def shadowing(package: str, search: list[str]) -> list[str]:
    """Where a pinned package is found on `search` (sys.path) besides the copy pip installed:
    a PYTHONPATH at another Megatron-LM checkout (as verl's SFT example sets it) shadows the
    pinned one without a word."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return []
    site = os.path.realpath(str(dist.locate_file("")))
    found = []
    for rel in sorted(package_dirs(dist)):
        hits = []
        for entry in search:
            root = os.path.realpath(entry or os.getcwd())
            if os.path.isfile(os.path.join(root, rel, "__init__.py")) and root not in hits:
                hits.append(root)
        first = hits[0] if hits else None
        if first is not None and first != site:
            found.append(f"{rel.replace('/', '.')} comes first from {first}, not the pinned copy in {site}")
        elif len(hits) > 1:
            found.append(f"{rel.replace('/', '.')} also at {', '.join(h for h in hits if h != site)}")
    return found


def check_launch_env(vector: dict) -> list[dict]:
    """What an upstream launch line finds in the image's environment: the variables the
    components ask for (verl's VERL_USE_UV=0: its example scripts otherwise `uv run` another
    lock), and one copy of each pinned source on sys.path, the one the lock installed."""
    out = []
    comps = vector.get("components", [])
    wanted = [(c["name"], k, v) for c in comps for k, v in sorted((c.get("runtime_env") or {}).items())]
    wrong = [
        f"{k}={os.environ.get(k)!r} (for {name}: wants {v!r})"
        for name, k, v in wanted
        if os.environ.get(k) != v
    ]
    if wrong:
        out.append(result("launch-env:variables", FAIL, "; ".join(wrong)))
    else:
        detail = ", ".join(f"{k}={v}" for _, k, v in wanted) or "no component sets a variable"
        out.append(result("launch-env:variables", PASS, detail, checked=len(wanted)))
    packages = [c["package"] for c in comps] + [p["name"] for p in vector.get("packages", [])]
    problems, looked = [], 0
    for package in dict.fromkeys(packages):
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        looked += 1
        problems.extend(shadowing(package, sys.path))
    if problems:
        fix = " (fix: unset PYTHONPATH, or drop the other checkouts from it: the image's copies are the pinned ones)"
        out.append(result("launch-env:one-copy", FAIL, "; ".join(problems) + fix))
    else:
        out.append(
            result(
                "launch-env:one-copy",
                PASS,
                f"{looked} pinned packages, each once on sys.path",
                checked=looked,
            )
        )
    return out


# ----------------------------------------------------------------------------- native libraries
def check_native_libs(vector: dict) -> list[dict]:
    """native_libs.py, loaded from its file: putting the checks' folder on sys.path would
    change what launch-env's one-copy check sees."""
    spec = importlib.util.spec_from_file_location("mtp_native_libs", HERE / "native_libs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return [result(v.id, v.status, v.detail, v.checked) for v in mod.check(vector)]


# ------------------------------------------------------------------------------- GPU
def check_gpu(gpu: bool) -> list[dict]:
    """With --gpu: the full MTP check on the GPU. Without: its CPU-side part (mode table from
    this image's version vector), so the same script is exercised in every image test; it
    runs none of the checks themselves, so its result is a skip (see settle)."""
    script = HERE / "gpu_check.py"
    name = "gpu" if gpu else "gpu-check-cpu-part"
    if not script.is_file():
        return [result(name, FAIL, "gpu_check.py missing from the image")]
    argv = [sys.executable, str(script), "--version-vector", str(VECTOR), "--json"]
    if not gpu:
        argv.append("--cpu-only")
    proc = subprocess.run(argv, capture_output=True, text=True)
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    if proc.returncode == 77:
        return [result(name, FAIL, "--gpu given but no CUDA device is visible: " + tail)]
    report = _last_json(proc.stdout)
    if report is None:
        return [result(name, FAIL, f"exit {proc.returncode}, no report: {tail}")]
    count = {s: sum(c["status"] == s for c in report["checks"]) for s in ("PASS", "FAIL", "SKIP")}
    detail = f"mode {report['mode']}: {count['PASS']} pass, {count['FAIL']} fail, {count['SKIP']} skip"
    if not gpu:
        detail += "; the GPU part runs with --gpu"
    elif report.get("gpu_skipped"):
        detail += f"; GPU part skipped: {report['gpu_skipped']}"
    failed = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["status"] == "FAIL"]
    if failed:
        detail += "; " + "; ".join(failed)
    status = PASS if proc.returncode == 0 else FAIL
    return [result(name, status, detail, count["PASS"] + count["FAIL"])]


def check_mtp_grad() -> list[dict]:
    """The mode's gradient contract on the CPU, in every image, before any tag: gpu_check.py
    --cpu-model builds a tiny Megatron MTP model with this image's megatron-core (gloo), applies
    the installed verl's MTP patch as verl's patch_engine_mtp would for the profile's overrides
    (detach_encoder, mtp_detach_heads, recompute) and asserts the contract on the MTP loss alone:
    load-only MTP untouched; full the loss reaches trunk and MTP; mtp-only gradient to the MTP
    block only, the output layer counted; the same under full recompute. A result per check."""
    missing = [m for m in ("torch", "megatron.core") if _find_spec(m) is None]
    if missing:
        return [result("mtp-grad", SKIP, f"no {' or '.join(missing)} in this image: nothing to train", 0)]
    argv = [
        sys.executable,
        str(HERE / "gpu_check.py"),
        "--cpu-model",
        "--json",
        "--version-vector",
        str(VECTOR),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    report = _last_json(proc.stdout)
    if report is None:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        return [result("mtp-grad", FAIL, f"exit {proc.returncode}, no report: {tail}")]
    settings = (report.get("env") or {}).get("settings", "")
    out = []
    for c in report["checks"]:
        if c["name"] in ("torch-cuda", "nccl-allreduce"):
            continue  # the GPU group's, not run on the CPU
        status = {"PASS": PASS, "FAIL": FAIL}.get(c["status"], SKIP)
        rule = f" [rule {c['rule']}]" if c.get("rule") else ""
        out.append(result(f"mtp-grad:{c['name']}", status, c["detail"] + rule, 1 if status != SKIP else 0))
    if not out:
        out.append(result("mtp-grad", FAIL, f"gpu_check.py ran no training check ({settings})"))
    return out


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


TRAINER_OVERRIDES = Path("/opt/mtp/verl/sft.overrides")
RL_OVERRIDES = Path("/opt/mtp/verl/rl.overrides")


def _trainer_results(prefix: str, script: Path, overrides: Path) -> list[dict]:
    """Run one trainer check script (trainer_check.py, rl_check.py) and report a result per
    promise it judged, under `prefix` (its `info` findings pass as reported evidence)."""
    if not script.is_file():
        return [result(prefix, FAIL, f"{script.name} missing from the image")]
    argv = [
        sys.executable,
        str(script),
        "--json",
        "--version-vector",
        str(VECTOR),
        "--overrides",
        str(overrides),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True)
    report = _last_json(proc.stdout)
    if report is None:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        return [result(prefix, FAIL, f"exit {proc.returncode}, no report: {tail}")]
    notes = "; ".join(report.get("notes", []))
    out = [
        result(
            f"{prefix}:{r['id']}",
            PASS if r["status"] == "info" else r["status"],
            ("reported: " if r["status"] == "info" else "") + r["detail"],
            1,
        )
        for r in report["results"]
    ]
    if notes:
        out.append(result(f"{prefix}:notes", SKIP, notes))
    return out


def check_trainer(gpu: bool, vector: dict) -> list[dict]:
    """With --gpu: verl's own trainers on a tiny MTP model with this image's overrides, judged
    against the mode's promises, a result per promise: the SFT trainer (trainer_check.py,
    `trainer:*`) where the profile has the sft target, main_ppo with SGLang rollout
    (rl_check.py, `trainer:rl:*`) where it has the rl target and the image has sglang.
    Without a GPU: a skip that says so (both need CUDA)."""
    targets = vector.get("targets", ["sft"])
    if not gpu:
        return [result("trainer", SKIP, "verl's trainers run with --gpu (they need CUDA)")]
    out = []
    if "sft" in targets:
        out += _trainer_results("trainer", HERE / "trainer_check.py", TRAINER_OVERRIDES)
    if "rl" in targets:
        if importlib.util.find_spec("sglang") is None:
            out.append(result("trainer:rl", SKIP, "main_ppo with SGLang rollout: no sglang in this image"))
        else:
            out += _trainer_results("trainer:rl", HERE / "rl_check.py", RL_OVERRIDES)
    if not out:
        out.append(result("trainer", SKIP, f"the profile has neither an sft nor an rl target ({targets})"))
    return out


def gpu_only_modules() -> list[tuple[str, str]]:
    """Installed modules the skip list says need a GPU at import (reason (b)), with why."""
    out = []
    for name, why in sorted(skip_list().items()):
        if why.startswith("(b)") and importlib.util.find_spec(name.split(".")[0]) is not None:
            out.append((name, why))
    return out


def check_gpu_imports(gpu: bool) -> list[dict]:
    """The modules the import check leaves out because they need a GPU at import are not
    skipped silently: with --gpu each is imported in a fresh interpreter here; without, this
    reports them as a skip that names them and why."""
    mods = gpu_only_modules()
    if not mods:
        return [result("gpu-imports", PASS, "no installed module needs a GPU at import", 0)]
    names = ", ".join(f"{m} ({why.removeprefix('(b)').strip()[:60]})" for m, why in mods)
    if not gpu:
        return [result("gpu-imports", SKIP, f"need a GPU at import, imported with --gpu: {names}", 0)]
    failed = []
    for module, _why in mods:
        got = import_fresh(module, IMPORT_TIMEOUT)
        if not got.ok:
            failed.append(f"{module}: {got.detail}")
    if failed:
        return [result("gpu-imports", FAIL, "; ".join(failed), len(mods))]
    return [
        result(
            "gpu-imports",
            PASS,
            f"{len(mods)} imported on the GPU: {', '.join(m for m, _ in mods)}",
            len(mods),
        )
    ]


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


# ------------------------------------------------------------------------------- entry points
# What users start, without a GPU, each in its own interpreter: the components' entry_checks
# (components.yaml), carried by the version vector.


def _run_py(args: list[str], timeout: int = 600) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd="/"
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


# An entry check is split by what it reads. Importing what users start (a `code` check, or a
# `module` check's module and its also_import) reads only installed files: group
# "entry-imports", reusable like the import check. Composing a `module` check's hydra config
# with the mode's overrides reads the mode layer: group "entrypoints", always run, in an
# interpreter that imports hydra alone (what `python -m MODULE --cfg job` does after the module's
# own imports, which the other group proved), so a mode-layer change costs seconds, not a torch
# start-up per trainer. A module without a literal @hydra.main runs `python -m` as a whole.
COMPOSE = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
config_dir, name, version_base = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with initialize_config_dir(config_dir=config_dir, version_base=version_base, job_name="mtp-entry-check"):
    OmegaConf.to_yaml(compose(config_name=name, overrides=sys.argv[4:]))
"""


def hydra_main_of(module: str) -> tuple[str, str, str | None] | None:
    """(config dir, config name, version_base) of the module's literal @hydra.main, found by
    reading its file (ast; nothing of it is imported), or None."""
    import ast

    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found, not executed
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for deco in getattr(node, "decorator_list", ()):
            func = getattr(deco, "func", None)
            if func is not None and ast.unparse(func) == "hydra.main":
                kw = {k.arg: k.value for k in deco.keywords}
                try:
                    values = {k: ast.literal_eval(v) for k, v in kw.items()}
                except ValueError:
                    return None
                if isinstance(values.get("config_path"), str) and isinstance(values.get("config_name"), str):
                    return (
                        str(path.parent / values["config_path"]),
                        values["config_name"],
                        values.get("version_base"),
                    )
    return None


def _overrides(e: dict) -> list[str]:
    overrides_file = HERE.parent / "verl" / f"{e['target']}.overrides"
    return overrides_file.read_text().split() if overrides_file.is_file() else []


def _timed(cid: str, started: float, rc: int, detail: str) -> dict:
    out = result(cid, PASS if rc == 0 else FAIL, detail)
    return {**out, "seconds": round(time.monotonic() - started, 3)}


def _import_names(e: dict) -> list[str]:
    return [e["module"], *(e.get("also_import") or ())]


def entry_import(e: dict, forked: Imported | None = None) -> dict:
    """A `code` check, or the imports of a `module` check, in its own interpreter; `forked`:
    the imports' verdict from the import check's fork servers, which stands when it is ok."""
    if forked is not None and forked.ok:
        if e.get("code"):
            cid, detail = f"entry:{e['id']}", "ok"
        else:
            cid, detail = f"entry:{e['id']}:import", f"import {', '.join(_import_names(e))}"
        return {**result(cid, PASS, f"{detail} ({forked.how})"), "seconds": round(forked.seconds, 3)}
    started = time.monotonic()
    if e.get("code"):
        rc, last = _run_py(["-c", e["code"]])
        return _timed(f"entry:{e['id']}", started, rc, "ok" if rc == 0 else last)
    names = _import_names(e)
    rc, last = _run_py(["-c", "; ".join(f"import {m}" for m in names)])
    detail = f"import {', '.join(names)}" + ("" if rc == 0 else f": {last}")
    return _timed(f"entry:{e['id']}:import", started, rc, detail)


def entry_config(e: dict) -> dict:
    """A `module` check's config, composed with the mode's overrides."""
    started = time.monotonic()
    overrides = _overrides(e)
    found = hydra_main_of(e["module"])
    if found is None:
        detail = f"python -m {e['module']} --cfg job + {len(overrides)} overrides"
        rc, last = _run_py(["-m", e["module"], "--cfg", "job", *overrides])
    else:
        config_dir, name, version_base = found
        detail = f"{e['module']}: hydra config {name} + {len(overrides)} overrides"
        rc, last = _run_py(["-c", COMPOSE, config_dir, name, json.dumps(version_base), *overrides])
    return _timed(f"entry:{e['id']}:config", started, rc, detail if rc == 0 else f"{detail}: {last}")


def entry_checks(vector: dict) -> list[dict]:
    return [e for comp in vector.get("components", []) for e in comp.get("entry_checks") or []]


def _omitted(vector: dict) -> set[str]:
    return {s["detail"].split("==", 1)[0] for s in vector.get("substitutions", []) if s["what"] == "omitted"}


def _entries(vector: dict, group: str, run_one) -> list[dict]:
    omitted = _omitted(vector)
    entries = entry_checks(vector)
    if group == "entrypoints":
        entries = [e for e in entries if e.get("module")]
    out: dict[str, dict] = {}
    for e in entries:
        gone = [pkg for pkg in e.get("needs", []) if pkg in omitted]
        if gone:
            out[e["id"]] = result(
                f"entry:{e['id']}",
                SKIP,
                f"needs {', '.join(gone)}, omitted from this image (substitution); runs where it is installed",
            )
    # independent interpreters: as many at once as there are cores, reported in their order
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 2)) as pool:
        running = {e["id"]: pool.submit(run_one, e) for e in entries if e["id"] not in out}
        out.update({eid: f.result() for eid, f in running.items()})
    if not out:
        return [result(group, SKIP, "no component declares entry checks of this kind")]
    return [out[e["id"]] for e in entries]


def check_entry_imports(vector: dict) -> list[dict]:
    """A `code` check's code and a `module` check's imports go to the import check's fork
    servers first (each a child that is a fresh interpreter, torch preloaded when it asks for
    it), one item each; what a child cannot vouch for runs in its own interpreter, whose
    verdict counts."""
    joined = entry_items(vector)
    todo = sorted(set(joined.values()) - PREFETCHED.keys())
    verdicts = dict(PREFETCHED)
    if todo and forking():
        verdicts.update(import_modules(todo, check_preload=False)[0])
    forked = {eid: verdicts[item] for eid, item in joined.items() if item in verdicts}
    return _entries(vector, "entry-imports", lambda e: entry_import(e, forked.get(e["id"])))


def entry_items(vector: dict) -> dict[str, str]:
    """entry id -> its item for the fork servers: `code:HEX`, or the comma-joined imports."""
    omitted = _omitted(vector)
    entries = entry_checks(vector)
    return {
        e["id"]: "code:" + e["code"].encode().hex() if e.get("code") else ",".join(_import_names(e))
        for e in entries
        if (e.get("module") or e.get("code")) and not omitted.intersection(e.get("needs", []))
    }


def check_entrypoints(vector: dict) -> list[dict]:
    return _entries(vector, "entrypoints", entry_config)


# ------------------------------------------------------------------------------- reuse
# The groups whose verdict depends only on what is installed (the layers below the mode
# layer, which the host records by their diff IDs) and on what they read from the mode
# layer: the checks' own files and their slice of the version vector, hashed here. The host
# passes --reuse GROUP=DIGEST for a group that passed on an image with the same lower layers;
# with the same digest here it is not run again. The other groups (cuda-runtime, login-shell,
# launch-env, native-libs, entrypoints, gpu) read the mode layer's environment and overrides
# (LD_LIBRARY_PATH, PYTHONPATH): they always run.
REUSABLE = {
    "imports": (("run_checks.py", "import_server.py", "import_skip.txt"), ()),
    "pip-check": (("run_checks.py",), ("resolution", "components")),
    "versions": (("run_checks.py",), ("components", "packages", "python_packages", "substitutions")),
    "probes": (("run_checks.py",), ("probes", "components")),
    "entry-imports": (("run_checks.py", "import_server.py"), ("components", "substitutions")),
}


def inputs_digest(gid: str, vector: dict) -> str | None:
    """sha256 of what a reusable group reads from the mode layer; None for the others."""
    spec = REUSABLE.get(gid)
    if spec is None:
        return None
    files, keys = spec
    h = hashlib.sha256(gid.encode() + b"\0")
    for name in files:
        path = HERE / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    h.update(json.dumps({k: _slice(gid, k, vector.get(k)) for k in keys}, sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


def _slice(gid: str, key: str, value):
    """What a group reads of one version-vector key. The entry checks a component declares
    are read by entry-imports alone: a profile with fewer targets (mtp-rollout: RL only) then
    still reuses pip-check, versions and probes proved by one with more."""
    if key != "components" or gid == "entry-imports" or not isinstance(value, list):
        return value
    return [{k: v for k, v in comp.items() if k != "entry_checks"} for comp in value]


def run_group(gid: str, fn, digest: str | None, reuse: dict[str, set[str]]) -> list[dict]:
    """One group's results, each with its group, its time and (reusable groups) its inputs."""
    if digest is not None and digest in reuse.get(gid, ()):
        placeholder = result(gid, REUSED, "inputs unchanged since the run that proved them")
        return [{**placeholder, "group": gid, "inputs": digest, "seconds": 0.0}]
    started = time.monotonic()
    try:
        results = fn()
    except Exception as exc:  # noqa: BLE001 - a crashing check is a failed check
        results = [result(gid, FAIL, f"check crashed: {type(exc).__name__}: {exc}")]
    seconds = round(time.monotonic() - started, 3)
    extra = {"group": gid} if digest is None else {"group": gid, "inputs": digest}
    return [{"seconds": seconds, **settle(r), **extra} for r in results]


# ------------------------------------------------------------------------------- main
def run(
    gpu: bool = False, only: list[str] | None = None, reuse: dict[str, set[str]] | None = None
) -> list[dict]:
    """reuse: group -> the inputs digests the host holds results for (--reuse)."""
    vector = json.loads(VECTOR.read_text())
    reuse = reuse or {}
    PREFETCHED.clear()

    def runs(gid: str) -> bool:
        return (not only or gid in only) and inputs_digest(gid, vector) not in reuse.get(gid, ())

    shared = ()
    if runs("imports") and runs("entry-imports") and forking():
        shared = tuple(dict.fromkeys(entry_items(vector).values()))
    groups = [
        ("imports", lambda: check_imports(shared)),
        ("pip-check", lambda: check_pip(vector)),
        ("versions", lambda: check_versions(vector)),
        ("probes", lambda: check_probes(vector)),
        ("cuda-runtime", lambda: check_cuda(vector)),
        ("login-shell", check_login_shell),
        ("launch-env", lambda: check_launch_env(vector)),
        ("native-libs", lambda: check_native_libs(vector)),
        ("entry-imports", lambda: check_entry_imports(vector)),
        ("entrypoints", lambda: check_entrypoints(vector)),
        ("mtp-grad", check_mtp_grad),
    ]
    groups.append(("gpu", lambda: check_gpu(gpu)))
    groups.append(("gpu-imports", lambda: check_gpu_imports(gpu)))
    groups.append(("trainer", lambda: check_trainer(gpu, vector)))
    results = []
    for gid, fn in groups:
        if only and gid not in only:
            continue
        results.extend(run_group(gid, fn, inputs_digest(gid, vector), reuse))
    return results


def table(results: list[dict]) -> str:
    width = max(len(r["id"]) for r in results)
    return "\n".join(
        f"{r['status'].upper():<6} {r['id']:<{width}} {r.get('seconds', 0.0):>7.1f}s  {r['detail']}"
        for r in results
    )


def _reuse_arg(text: str) -> tuple[str, str]:
    gid, sep, digest = text.partition("=")
    if not sep or gid not in REUSABLE:
        raise argparse.ArgumentTypeError(f"{text!r}: want GROUP=DIGEST, GROUP one of {', '.join(REUSABLE)}")
    return gid, digest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--gpu", action="store_true", help="also run gpu_check.py (needs a GPU)")
    ap.add_argument("--only", nargs="*", help="check groups to run")
    ap.add_argument(
        "--reuse",
        action="append",
        type=_reuse_arg,
        default=[],
        metavar="GROUP=DIGEST",
        help="do not run GROUP when its inputs digest is DIGEST (repeatable, also per group): report "
        "it `reused` (the host holds its results from an image with the same lower layers)",
    )
    args = ap.parse_args(argv)
    reuse: dict[str, set[str]] = {}
    for gid, digest in args.reuse:
        reuse.setdefault(gid, set()).add(digest)
    results = run(args.gpu, args.only, reuse)
    failed = any(r["status"] == FAIL for r in results)
    if args.json:
        print(json.dumps({"ok": not failed, "results": results}, sort_keys=True))
    else:
        print(table(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
