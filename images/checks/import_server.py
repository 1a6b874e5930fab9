"""Fork server of the import check. run_checks.py starts it as

    python -c "exec(compile(open(PATH).read(), PATH, 'exec'))"     (job on stdin)

so that it is a fresh `python -c` interpreter, like the one each module used to get: the same
sys.path[0] (''), sys.argv and __main__. It imports the job's preload once (none, or the heavy
common base: torch on the real stack), then forks one child per module; the child imports
that one module and writes its verdict to a file, this process reaps it, kills its process
group past the timeout, and reads a death by signal as a crash. So every module is still
imported alone (its side effects and crashes stay in its child), without paying interpreter
start-up, and with a preload without paying torch's, for each one.

It imports nothing a fresh interpreter has not already imported (os, sys, time, builtins,
_signal are there at start-up): a child must see a fresh interpreter's modules plus the
preload, nothing else. run_checks.py runs two (docs/checks.md):
  - one without preload, whose children are fresh interpreters but for the fork; a child that
    asks for a module of `handoff` (torch) stops there and reports `needs`, having run its
    module's import up to that point as a fresh interpreter would;
  - one that preloads `handoff`, for the modules that reported `needs`: a child is `ok` only
    when its module asked for every preloaded module itself, before it loaded an extension
    module or changed the environment (with torch not loaded yet, those would have come
    first); otherwise `suspect`, and run_checks.py imports it again in a fresh interpreter,
    as it does with every failure. A child that is suspect when it first asks for the
    preload ends there: whatever the rest of its import did, a fresh interpreter decides.

  A module sent `after` (`module NAME after`) is one that loads only once the preload did, as
  its own package always imports it (a torch C++ extension: it NEEDs libc10.so without a
  path): its child is a fresh interpreter that ran `import torch, NAME`, so it need not ask
  for the preload itself.

Job on stdin, one item a line: `timeout SECONDS`, `jobs N`, `tmp DIR`, `preload NAME`...,
`handoff NAME`..., `start`, then `module NAME [PREFIX|after]` lines as they come, until stdin
closes. NAME may be several modules joined by commas, imported in that order in one child
(an entry check's module and what it also imports), or `code:HEX`: the child runs that code
as `python -c` would (an entry check's code, UTF-8 in hex). `FIRST|NAME`: FIRST is a module
whose import is the first thing NAME does (`verl` for `verl.trainer.main_ppo`, `mbridge` for
`from mbridge import AutoBridge`); the child imports it, says its verdict, and goes on with
NAME: two checks for the price of one, each as a fresh interpreter would have judged it.
Output on the stdout this process started with (anything the imports print goes to stderr),
one tab-separated line each:
    ready     fallback REASON     done
    result MODULE KIND SECONDS DETAIL    KIND: ok, needs, suspect, fail, crash, timeout
    part FIRST KIND SECONDS DETAIL       (before the result of FIRST|NAME, when FIRST ended)
Standard library only, and only modules a fresh interpreter already has.
"""

import _signal
import builtins
import os
import sys
import time


def clean(text):
    """One field of an output line: no tabs or newlines."""
    return " ".join(str(text).split())


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode(errors="replace"))
    finally:
        os.close(fd)


def asked_for(names, name, fromlist):
    """The names among `names` that `import name` / `from name import fromlist` asks for
    (`from torch import nn` asks for torch.nn too)."""
    asked = [name] + [f"{name}.{f}" for f in fromlist or () if isinstance(f, str)]
    return [n for n in names if any(a == n or a.startswith(n + ".") for a in asked)]


def mapped_libraries():
    """The shared libraries mapped into this process (/proc/self/maps; none elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return set()
    return {p for p in paths if p.startswith("/") and ".so" in p.rsplit("/", 1)[-1]}


def library_stem(path):
    """libcudart.so.13.0.96 -> libcudart: two files of one library under any version."""
    return path.rsplit("/", 1)[-1].split(".so")[0]


def read_prefix(path):
    """What a module did before it asked for the handoff module, as its bare child saw it:
    (modules it imported, shared libraries it mapped)."""
    mods, libs = set(), set()
    try:
        with open(path) as f:
            for line in f:
                kind, _, value = line.rstrip("\n").partition(" ")
                (mods if kind == "mod" else libs).add(value)
    except OSError:
        pass
    return mods, libs


class Watch:
    """Installed as builtins.__import__ in a child.

    Bare server (handoff): when the module asks for a handoff module, write what it did up to
    then (modules imported, libraries mapped: <result>.prefix) and end the child as `needs`.
    Preloading server: when the module first asks for each preloaded module, it must have
    done what its bare child did up to then (`expect`: the same new modules) and left the
    environment as it was, or the preload changed what it did: `suspect`."""

    def __init__(self, job, result_path, original, expect=None):
        self.pending = set(job["preload"])
        self.handoff = set(job["handoff"])
        self.result_path = result_path
        self.original = original
        self.expect = expect
        self.before = set(sys.modules)
        self.libraries = mapped_libraries() if self.handoff else set()
        self.environ = dict(os.environ)
        self.order = []
        # the top-level names it watches for: every other import (tens of thousands in a heavy
        # child) passes at the cost of one set lookup
        self.roots = {n.partition(".")[0] for n in self.pending | self.handoff}

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in self.roots:
            for p in asked_for(self.handoff, name, fromlist):
                self._hand_off(p)
            for p in asked_for(self.pending, name, fromlist):
                self._first_ask(p)
            if not self.pending and not self.handoff and builtins.__import__ is self:
                builtins.__import__ = self.original  # nothing left to watch for
        return self.original(name, globals, locals, fromlist, level)

    def _hand_off(self, p):
        lines = [f"mod {n}" for n in sorted(set(sys.modules) - self.before)]
        lines += [f"lib {path}" for path in sorted(mapped_libraries() - self.libraries)]
        write_file(self.result_path + ".prefix", "".join(line + "\n" for line in lines))
        write_file(self.result_path, f"needs\n{p} {self.result_path}.prefix\n")
        os._exit(0)

    def _first_ask(self, p):
        self.pending.discard(p)
        if dict(os.environ) != self.environ:
            self.order.append(f"changed the environment before importing {p}")
        if self.expect is not None:
            now = set(sys.modules) - self.before
            more, fewer = sorted(now - self.expect), sorted(self.expect - now)
            if more or fewer:
                self.order.append(
                    f"imported other modules before {p} than a fresh interpreter did: "
                    f"+{' +'.join(more[:3]) or '-'} -{' -'.join(fewer[:3]) or '-'}"
                )
            self.expect = None  # compared at the first preloaded module it asks for
        if self.order:
            # its verdict cannot stand (a fresh interpreter decides): the rest of its import,
            # often the bulk of it, would be paid twice
            write_file(self.result_path, f"suspect\n{clean('; '.join(self.order))}\n")
            os._exit(0)

    def verdict(self):
        if self.pending:
            return "suspect", "does not import " + ", ".join(sorted(self.pending)) + " (preloaded here)"
        if self.order:
            return "suspect", "; ".join(self.order)
        return "ok", ""


def first_part(first, watch, result_path):
    """Import `first` (a module whose import is the first thing the rest does) and write its
    own verdict to <result>.part: `KIND\\nDETAIL\\nSECONDS`. False when the rest cannot go on
    as a fresh interpreter would. (A FIRST that is suspect here only for not asking for the
    preload, as `megatron` does not, is judged apart; the rest goes on, and asks for it.)"""
    started = time.monotonic()
    going_on = False
    try:
        __import__(first)
        kind, detail = watch.verdict()
        going_on = True
    except SystemExit as exc:  # `python -c` would end here: the rest is judged apart
        kind, detail = ("ok", "") if exc.code in (None, 0) else ("fail", f"SystemExit: {exc.code}")
    except BaseException as exc:  # noqa: BLE001 - any failure of the import is the verdict
        kind, detail = "fail", f"{type(exc).__name__}: {exc}"
    write_file(result_path + ".part", f"{kind}\n{clean(detail)}\n{time.monotonic() - started:.3f}\n")
    return going_on


def child(module, job, result_path, log_path, expect=None, after=False):
    """In the forked child: import `module` (comma-joined: each in turn), write
    `KIND\\nDETAIL` to result_path, exit. `FIRST|REST`: FIRST's verdict first (first_part),
    then REST's, in one interpreter."""
    os.setpgid(0, 0)  # the server kills the whole group of a hung child
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    watch = Watch(job, result_path, builtins.__import__, expect)
    if after:
        watch.pending.clear()  # imported after the preload, as its package imports it
    if watch.pending or watch.handoff:
        builtins.__import__ = watch
    first, _, module = module.rpartition("|")
    if first and not first_part(first, watch, result_path):
        builtins.__import__ = watch.original
        write_file(result_path, f"suspect\n{clean('its first import, ' + first + ', did not pass here')}\n")
        os._exit(0)
    try:
        if module.startswith("code:"):
            # `python -c CODE` (an entry check); hex, since the line protocol and a fresh
            # interpreter's modules carry no other decoder
            code = bytes.fromhex(module[len("code:") :]).decode()
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        else:
            for name in module.split(","):
                __import__(name)
        kind, detail = watch.verdict()
    except SystemExit as exc:
        # `python -c "import m"` exits 0 when m calls sys.exit(0) or sys.exit()
        kind, detail = ("ok", "") if exc.code in (None, 0) else ("fail", f"SystemExit: {exc.code}")
    except BaseException as exc:  # noqa: BLE001 - any failure of the import is the verdict
        builtins.__import__ = watch.original  # traceback's own imports are not the module's
        kind, detail = "fail", f"{type(exc).__name__}: {exc}"
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - the verdict is written either way
            pass
    builtins.__import__ = watch.original
    write_file(result_path, f"{kind}\n{clean(detail)}\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        # no atexit handlers, no flushing of buffers copied from the server
        os._exit(0)


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


class Server:
    def __init__(self, job, say):
        self.job = job
        self.timeout = float(job["timeout"])
        self.jobs = max(1, int(job["jobs"]))
        self.say = say
        self.running = {}  # pid -> (module, started, result path, log path)
        self.killed = set()
        self.count = 0
        self.libraries = {}  # the preload's shared libraries: stem -> paths
        for path in mapped_libraries() if job["preload"] else ():
            self.libraries.setdefault(library_stem(path), set()).add(path)

    def start(self, module, expect=None, after=False):
        self.count += 1
        result_path = os.path.join(self.job["tmp"], f"{self.count}.result")
        log_path = os.path.join(self.job["tmp"], f"{self.count}.log")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(module, self.job, result_path, log_path, expect, after)
        try:
            os.setpgid(pid, pid)  # also here: a kill before the child ran its own setpgid
        except OSError:  # the child did it first, or is gone already
            pass
        self.running[pid] = (module, time.monotonic(), result_path, log_path)

    def finish(self, pid, status):
        module, started, result_path, log_path = self.running.pop(pid)
        seconds = f"{time.monotonic() - started:.3f}"
        if "|" in module:
            self.say_part(module, result_path)
        if pid in self.killed:
            self.say("result", module, "timeout", seconds, f"timed out after {self.timeout:g} s")
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            self.say("result", module, "crash", seconds, f"signal {sig}: {last_line(log_path)}")
        else:
            try:
                with open(result_path) as f:
                    kind, detail = (f.read().split("\n") + ["", ""])[:2]
            except OSError:
                code = os.WEXITSTATUS(status)
                kind, detail = "crash", f"exit {code} without a verdict: {last_line(log_path)}"
            self.say("result", module, kind, seconds, detail)

    def say_part(self, module, result_path):
        """The verdict a `FIRST|REST` child wrote for FIRST, if it got that far."""
        try:
            with open(result_path + ".part") as f:
                kind, detail, seconds = (f.read().split("\n") + ["", "", "0"])[:3]
        except OSError:
            return
        self.say("part", module.rpartition("|")[0], kind, seconds, detail)

    def reap(self):
        """Reap one finished child if there is one; kill children past their deadline."""
        pid, status = os.waitpid(-1, os.WNOHANG) if self.running else (0, 0)
        if pid:
            self.finish(pid, status)
            return True
        now = time.monotonic()
        for pid, (_m, started, _r, _l) in self.running.items():
            if pid not in self.killed and now - started > self.timeout:
                self.killed.add(pid)
                try:
                    os.killpg(pid, _signal.SIGKILL)
                except OSError:  # already gone: reaped on the next round
                    pass
        return False

    def conflicts(self, libraries):
        """Libraries a module mapped before asking for the preload that the preload maps from
        other files: loaded in the other order, one would stand in for the other."""
        return sorted(path for path in libraries if self.libraries.get(library_stem(path), {path}) != {path})

    def submit(self, module, prefix):
        """Fork a child for `module`; `prefix`: the file its bare child wrote when it asked for
        the preload, if it did."""
        first, _, rest = module.rpartition("|")
        names = ([first] if first else []) + ([] if rest.startswith("code:") else rest.split(","))
        if any(name in sys.modules for name in names):
            # imported by the preload: cannot be checked alone here
            self.say("result", module, "suspect", "0", "imported by the preload")
            return
        if prefix == "after":
            self.start(module, after=True)
            return
        expect = None
        if prefix:
            mods, libraries = read_prefix(prefix)
            clash = self.conflicts(libraries)
            if clash:
                self.say("result", module, "suspect", "0", "maps before the preload: " + " ".join(clash[:3]))
                return
            expect = mods - set(sys.modules)
        self.start(module, expect)

    def run(self, modules):
        """Import each module that `modules` yields (None: none yet), `jobs` at a time."""
        queue, more = [], True
        while more or queue or self.running:
            while more:
                module = next(modules)
                if module is None:
                    break
                if module is StopIteration:
                    more = False
                else:
                    queue.append(module)
            while queue and len(self.running) < self.jobs:
                self.submit(*queue.pop(0))
            if not self.reap():
                time.sleep(0.005)


def stdin_lines(fd):
    """The lines of fd as they arrive, without blocking: None when no whole line is there
    yet, StopIteration (the object) at its end."""
    os.set_blocking(fd, False)
    buf, eof = b"", False
    while True:
        if not eof:
            try:
                chunk = os.read(fd, 65536)
                buf += chunk
                eof = not chunk
            except BlockingIOError:
                pass
        if b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            yield line.decode()
        elif eof:
            if buf:
                line, buf = buf, b""
                yield line.decode()
            else:
                yield StopIteration
        else:
            yield None


def read_job(lines):
    """The job's header, up to its `start` line."""
    job = {"preload": [], "handoff": [], "timeout": "300", "jobs": "1", "tmp": "/tmp"}
    for line in lines:
        if line is None:
            time.sleep(0.005)
            continue
        if line is StopIteration or line == "start":
            return job
        key, _, value = line.partition(" ")
        if key in ("preload", "handoff"):
            job[key].append(value)
        elif key in job:
            job[key] = value


def module_names(lines):
    """(module, prefix file or "") per `module NAME [PREFIX]` line; None, StopIteration as is."""
    for line in lines:
        if line is None or line is StopIteration:
            yield line
        elif line.startswith("module "):
            name, _, prefix = line[len("module ") :].partition(" ")
            yield name, prefix


def cuda_initialised():
    """Forking after CUDA initialisation is unsafe: the children would share its state."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without cuda: nothing initialised
        return False


def main():
    out = os.dup(1)
    os.dup2(2, 1)  # what the imports print must not mix with the results

    def say(*fields):
        os.write(out, ("\t".join(clean(f) for f in fields) + "\n").encode())

    lines = stdin_lines(0)
    job = read_job(lines)
    sys.argv = ["-c"]
    for name in job["preload"]:
        try:
            __import__(name)
        except BaseException as exc:  # noqa: BLE001 - reported; run_checks.py imports all afresh
            say("fallback", f"preloading {name} failed: {type(exc).__name__}: {exc}")
            return
    if cuda_initialised():
        say("fallback", "CUDA was initialised by the preload; forking after that is unsafe")
        return
    say("ready")
    Server(job, say).run(module_names(lines))
    say("done")


if __name__ == "__main__":
    main()
