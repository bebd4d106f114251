"""The HTTP server around the app: uvicorn, with two changes. Requests that fail to parse as HTTP
(oversized headers above all) get an OpenAI-shaped error with h11's status, and the connection lingers
rather than resetting; SIGINT/SIGTERM drain first (503 for new requests, `shutdown_grace` for those in
flight) before uvicorn's own shutdown. Design: docs/design/architecture.md (the server).
"""

import asyncio
import logging
from types import FrameType

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from refengine.entrypoints.app import OpenAIServer
from refengine.entrypoints.errors import APIError

logger = logging.getLogger("refengine")

# The largest request head (request line and headers) accepted; uvicorn's default is h11's 16 KiB.
MAX_HEADER_BYTES = 64 * 1024
# Seconds a refused connection is kept half-open for the client to finish sending and read the answer.
LINGER_S = 2.0
# Seconds uvicorn waits for connections after the drain (streams to slow readers, for example).
CLOSE_CONNECTIONS_S = 5


class _Connection(h11.Connection):
    """Keeps the parse error, which uvicorn's protocol does not hand to send_400_response."""

    refusal: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.refusal = e
            raise


class OpenAIErrorH11Protocol(H11Protocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, MAX_HEADER_BYTES)
        self.refused = False

    def send_400_response(self, msg: str) -> None:
        refusal = self.conn.refusal
        status = refusal.error_status_hint if refusal is not None else 400
        if status == 431:
            error = APIError(431, f"the request headers exceed {MAX_HEADER_BYTES} bytes", code="headers_too_large")
        else:
            error = APIError(status, f"malformed HTTP request: {refusal or msg}", code="invalid_http")
        body = error.body().model_dump_json().encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.refused:  # after a refusal, input is read only to be discarded
            super().data_received(data)

    def eof_received(self) -> None:
        if self.refused:
            self.transport.close()
        else:
            super().eof_received()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, openai_server: OpenAIServer, shutdown_grace: float) -> None:
        super().__init__(config)
        self.openai_server = openai_server
        self.shutdown_grace = shutdown_grace
        self.leaked_blocks = 0
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or not self.started:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        # A signal handler runs between two bytecodes of the loop's thread: hand the drain to the loop.
        asyncio.get_event_loop().call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        asyncio.ensure_future(self._drain(sig))

    async def _drain(self, sig: int) -> None:
        server = self.openai_server
        logger.info(
            "draining on signal %d: %d requests in flight, up to %g s for them to finish",
            sig,
            server.gate.num_in_flight,
            self.shutdown_grace,
        )
        num_in_flight = server.gate.num_in_flight
        num_cut = await server.gate.drain(self.shutdown_grace)
        # Invariant: after the drain every KV block is back in the pool; run_server fails otherwise.
        self.leaked_blocks = await server.blocks_in_use_when_idle()
        logger.log(
            logging.ERROR if self.leaked_blocks else logging.INFO,
            "drained: %d requests finished within the grace period, %d aborted; %d KV blocks in use",
            num_in_flight - num_cut,
            num_cut,
            self.leaked_blocks,
        )
        super().handle_exit(sig, None)


def make_server(
    app, openai_server: OpenAIServer, *, host: str, port: int, log_level: str, shutdown_grace: float
) -> DrainingServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=OpenAIErrorH11Protocol,
        timeout_graceful_shutdown=CLOSE_CONNECTIONS_S,
    )
    return DrainingServer(config, openai_server, shutdown_grace)

