"""A `refengine serve` subprocess on a free loopback port."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from server_helpers import free_port

HERE = Path(__file__).parent
# The installed console script, as a user runs it.
REAL_SERVE = [str(Path(sys.executable).with_name("refengine")), "serve"]


class ServerProcess:
    def __init__(
        self,
        command: list[str],
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        wait: bool = True,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.timeout = timeout
        argv = [*command, "--port", str(self.port), "--log-level", "warning", *args]
        self.proc = subprocess.Popen(
            argv,
            cwd=HERE,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited early: {self.proc.communicate()}")
            try:
                httpx.get(f"{self.url}/v1/models", timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise
                time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGINT) -> tuple[int, str]:
        """Signals the server and waits; returns its exit status and stderr."""
        self.proc.send_signal(sig)
        _, stderr = self.proc.communicate(timeout=30)
        return self.proc.returncode, stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
