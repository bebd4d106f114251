"""Child processes that run in a process group of their own, so a deadline can kill all they spawned."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO


def run_group(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float | None,
    stdout: IO[bytes] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> int | None:
    """Run `cmd` in a new session; return its exit status, or None when it was killed at the deadline."""
    stderr = subprocess.STDOUT if stdout is not None else None
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        if on_start is not None:
            on_start(proc.pid)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        # Also after a normal exit (and on an interrupt): whatever the child left behind dies with it.
        kill_group(proc.pid)
        proc.wait()
    return proc.returncode


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; a group that is already gone (or is no longer ours) is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
