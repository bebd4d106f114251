"""Focused pytest runs forked from a process that has already imported the heavy third-party modules.

A named mutant's focused run is mostly start-up: torch, hypothesis and pytest's plugins cost about 5 s of
CPU per process against about 1 s for a typical focused test. A server process started with the focused
runs' environment (hash seed and threads fixed at its start) imports them once and forks one child per
run; the child drops every module of the tree first, so the tree's code, mutated or not, is imported fresh,
then runs pytest.main in a session of its own with its output in the caller's file.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.metadata
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from pathlib import Path

from mutations.procs import kill_group

# The preloaded plugin modules cannot have their asserts rewritten in the child; pytest says so once each.
_QUIET = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]


class PreloadError(RuntimeError):
    """A preload names a module of the tree, or the server process died mid-request."""


def tree_modules(root: Path) -> set[str]:
    """Top-level names the tree can be imported under: its directories and its .py files."""
    return {p.name for p in root.iterdir() if p.is_dir()} | {p.stem for p in root.glob("*.py")}


class PreloadedPytest:
    """One server per tree: `run` forks a pytest run from it; `close` ends it."""

    def __init__(self, root: Path, env: dict[str, str], preload: tuple[str, ...]) -> None:
        inside = sorted(m for m in preload if m.partition(".")[0] in tree_modules(root))
        if inside:
            # A preloaded module of the tree would be the unmutated one; the child drops it, but refuse early.
            raise PreloadError(f"preload names modules of the tree: {inside}")
        self.root, self.env, self.preload = root, env, preload
        self._proc: subprocess.Popen | None = None
        self._pending = b""

    def run(self, args: list[str], out: Path, timeout_s: float | None, on_start=None) -> int | None:
        """pytest `args` with stdout and stderr into `out`; its exit status, or None when killed at the deadline."""
        proc = self._server()
        proc.stdin.write(json.dumps({"args": [*_QUIET, *args], "out": str(out)}).encode() + b"\n")
        proc.stdin.flush()
        pid = self._reply(None)["pid"]
        try:
            if on_start is not None:
                on_start(pid)
            reply = self._reply(timeout_s)
            if reply is None:
                kill_group(pid)
                self._reply(None)  # the server's verdict on the killed child, discarded
                return None
        finally:
            # After a normal exit too (and on an interrupt): whatever the child left behind dies with it.
            kill_group(pid)
        return reply["rc"]

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()  # the server ends at the end of its input
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self._proc.pid)
                self._proc.wait()
            self._proc = None

    def _server(self) -> subprocess.Popen:
        if self._proc is None:
            cmd = [sys.executable, "-c", "from mutations.preloaded import serve; serve()", *self.preload]
            self._proc = subprocess.Popen(cmd, cwd=self.root, env=self.env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, start_new_session=True, bufsize=0)
            self._pending = b""
        return self._proc

    def _reply(self, timeout_s: float | None) -> dict | None:
        """The server's next line, or None at the deadline."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not sel.select(left):
                    return None
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.close()
                    raise PreloadError("the preloaded pytest server died")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)


def serve() -> None:
    """The server: import the preloads and pytest's plugins, then one forked pytest run per request line."""
    for name in sys.argv[1:]:
        importlib.import_module(name)
    for plugin in importlib.metadata.entry_points(group="pytest11"):
        plugin.load()
    import pytest  # noqa: F401  (imported once here, for every child)

    tree = tree_modules(Path.cwd())
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, tree)
        _send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send({"rc": os.waitstatus_to_exitcode(status)})


def _send(reply: dict) -> None:
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def _child(request: dict, tree: set[str]) -> None:
    rc = 3  # pytest's "internal error", should the run not get as far as an exit status
    try:
        os.setsid()
        out = os.open(request["out"], os.O_WRONLY | os.O_APPEND)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        # The server imported this module (and so the tree's `mutations`) from the tree: drop every module
        # of the tree, so the run imports the tree as it is now.
        for name in [n for n in sys.modules if n.partition(".")[0] in tree]:
            del sys.modules[name]
        sys.argv = ["pytest", *request["args"]]
        import pytest

        rc = int(pytest.main(request["args"]))
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
