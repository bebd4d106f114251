"""Admission: which requests the server takes on, and how long each may run.

The gate holds one Ticket per request between admission and its last byte. It refuses with 429 once
the engine holds its running batch (max_num_seqs) plus `max_waiting_requests` queued requests, and
with 503 once the server is draining for shutdown. A ticket carries the request's deadline (its own
`timeout`, capped by the server's `--request-timeout`); shutdown cuts every remaining deadline to now.
All of it lives on the event loop's thread, so no locks.
"""

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator

from refengine.entrypoints.errors import APIError

# Seconds a refused client should wait before retrying: one engine step frees seats at CPU speed.
RETRY_AFTER_S = 1
# Seconds requests get to end once cut off. A stream blocked on a client that stopped reading cannot
# notice its cutoff; the HTTP server closes its connection after this.
CUTOFF_WAIT_S = 5


class Cutoff(enum.Enum):
    """Why a request was ended before its last token."""

    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


class Ticket:
    """One admitted request: its deadline, and why it was cut off if it was."""

    def __init__(self, gate: "AdmissionGate", timeout: float | None) -> None:
        self._gate = gate
        self.timeout = timeout
        loop = asyncio.get_running_loop()
        self.deadline = None if timeout is None else loop.time() + timeout
        self.cutoff: Cutoff | None = None
        self._timeouts: set[asyncio.Timeout] = set()
        self._released = False

    @contextlib.asynccontextmanager
    async def limit(self) -> AsyncIterator[None]:
        """Bounds the work inside by the deadline; raises TimeoutError when it passes (see `cutoff`)."""
        try:
            async with asyncio.timeout_at(self.deadline) as timeout:
                self._timeouts.add(timeout)
                try:
                    yield
                finally:
                    self._timeouts.discard(timeout)
        except TimeoutError:
            if self.cutoff is None:
                self.cutoff = Cutoff.TIMEOUT
            raise

    @property
    def cutoff_reason(self) -> str:
        return (self.cutoff or Cutoff.TIMEOUT).value

    def cutoff_error(self, request_id: str) -> APIError:
        """What the client of a cut-off request is told."""
        if self.cutoff is Cutoff.SHUTDOWN:
            return APIError(
                503,
                f"request {request_id} was aborted: the server is shutting down and the request did "
                "not finish within the shutdown grace period",
                code="shutting_down",
            )
        return APIError(
            408,
            f"request {request_id} was aborted: it did not finish within its timeout of {self.timeout:g} s",
            code="request_timeout",
        )

    def cut_off(self, why: Cutoff) -> None:
        """Ends the request now: its deadline moves to the present, waking whatever it awaits."""
        if self.cutoff is None:
            self.cutoff = why
        self.deadline = asyncio.get_running_loop().time()
        for timeout in self._timeouts:
            timeout.reschedule(self.deadline)

    def release(self) -> None:
        """Idempotent: every exit path of a request releases, and only the first one counts."""
        if not self._released:
            self._released = True
            self._gate._release(self)


class AdmissionGate:
    def __init__(
        self, *, max_num_seqs: int, max_waiting_requests: int | None, request_timeout: float | None
    ) -> None:
        self.max_waiting_requests = max_waiting_requests
        self.capacity = None if max_waiting_requests is None else max_num_seqs + max_waiting_requests
        self.request_timeout = request_timeout
        self.draining = False
        self._held: set[Ticket] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_in_flight(self) -> int:
        return len(self._held)

    def admit(self, timeout: float | None) -> Ticket:
        if self.draining:
            raise APIError(
                503, "the server is shutting down and accepts no new requests", code="shutting_down"
            )
        if self.capacity is not None and len(self._held) >= self.capacity:
            raise APIError(
                429,
                f"the server is full: {len(self._held)} requests in flight, and its waiting queue "
                f"(--max-waiting-requests {self.max_waiting_requests}) is full; retry later",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        limits = [t for t in (timeout, self.request_timeout) if t is not None]
        ticket = Ticket(self, min(limits, default=None))
        self._held.add(ticket)
        self._idle.clear()
        return ticket

    def _release(self, ticket: Ticket) -> None:
        self._held.discard(ticket)
        if not self._held:
            self._idle.set()

    async def drain(self, grace: float) -> int:
        """Refuses new requests, lets those in flight finish for up to `grace` seconds, then cuts the
        rest off and waits for them to end. Returns how many were cut off."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        remaining = list(self._held)
        for ticket in remaining:
            ticket.cut_off(Cutoff.SHUTDOWN)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CUTOFF_WAIT_S):
                await self._idle.wait()
        return len(remaining)
