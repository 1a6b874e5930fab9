"""A build CLI run with its build context on stdin, its output read line by line: how both
engines build (`docker build -` / `docker buildx build -`, `buildah bud`). One function that
both engines import, so neither engine reaches into the other's module for it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from mtpimage import children, mirrors


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace")


def stream_build(
    argv: list[str], env: dict, context, log_path: Path | None, echo: bool, watch=None, on_line=None
) -> tuple:
    """Run the build with the context on stdin (bytes, or an iterable of chunks), echoing its
    output; (returncode, last lines). `watch` (a buildlog.Watcher) reads every line: pip's
    refusals span more than the tail. Every line is redacted first (mirrors.redact): a
    mirror's token in a URL pip prints reaches neither the terminal nor the log."""
    log = open(log_path, "wb") if log_path else None
    proc = None
    try:
        proc = children.spawn(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )

        def feed():
            try:
                for chunk in [context] if isinstance(context, bytes | bytearray) else context:
                    proc.stdin.write(chunk)
                proc.stdin.close()
            except OSError:  # the build ended before it read it all (interrupted): its status says why
                pass

        # fed from a thread: a context larger than the pipe would block before any output is read
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        tail: list[str] = []
        for raw in proc.stdout:
            line = mirrors.redact(_text(raw))
            if log:
                log.write(line.encode())
            tail = (tail + [line.rstrip()])[-25:]
            if watch is not None:
                watch.feed(line)
            if on_line is not None:
                on_line(line)
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()
        proc.wait()
        feeder.join(timeout=5)
    except BaseException:
        if proc is not None:
            children.end(proc)  # interrupted: the build must not outlive the tool (a SIGTERM reaches only us)
        raise
    finally:
        if log:
            log.close()
    return proc.returncode, tail
