"""ServerProcess: a server command the ladder starts, waits for, watches and stops (--serve-cmd)."""

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from time import perf_counter

from ladder.config import EMBEDDED_SERVE_CMD, SetupError
from ladder.endpoint import Endpoint, NotReadyError
from ladder.redact import redact, redact_cmd, secrets_in


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_serve_cmd() -> str:
    """`refengine serve` from the interpreter's own environment, so an unactivated venv works too."""
    exe = Path(sys.executable).parent / "refengine"
    return EMBEDDED_SERVE_CMD.replace("{refengine}", shlex.quote(str(exe)) if exe.exists() else "refengine")


class ServerProcess:
    """The command runs without a shell (wrap it in `sh -c '...'` for shell syntax), so the process the
    ladder watches and waits for is the server itself; it runs in its own session, so stop() also reaches
    every process the server spawned."""

    def __init__(self, cmd: str, log_path: Path):
        self.log_path = log_path
        self.secrets = secrets_in(cmd)  # a server may echo its arguments into the log: scrubbed at stop()
        try:
            argv = shlex.split(cmd)
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        except (ValueError, OSError) as e:  # unbalanced quotes, no such program
            raise SetupError(f"cannot start --serve-cmd {redact_cmd(cmd)!r}: {e}") from e

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def _log_tail(self) -> str:
        lines = redact(self.log_path.read_text(errors="replace"), self.secrets).strip().splitlines()
        return f"; last log line: {lines[-1][:200]!r}" if lines else ""

    async def wait_ready(self, endpoint: Endpoint, timeout_s: float) -> None:
        """Poll /v1/models until it answers. A server that exits or never answers is a SetupError."""
        deadline = perf_counter() + timeout_s
        while True:
            rc = self.exit_code()
            if rc is not None:
                raise SetupError(f"the server command exited with code {rc} before /v1/models answered"
                                 f"{self._log_tail()} (log: {self.log_path})")
            try:
                await endpoint.models()
                return
            except NotReadyError as e:
                if perf_counter() > deadline:
                    raise SetupError(f"the server did not answer /v1/models within {timeout_s:g} s "
                                     f"(log: {self.log_path})") from e
            await asyncio.sleep(0.25)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group, give the server grace_s to exit, then SIGKILL what is left of the group: the
        server if it ignored SIGTERM, and any helper process it left behind."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:  # the whole group is gone already
                pass
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        if self.secrets:
            self.log_path.write_bytes(redact(self.log_path.read_text(errors="surrogateescape"), self.secrets)
                                      .encode(errors="surrogateescape"))
