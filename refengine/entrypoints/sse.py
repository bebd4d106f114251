"""Server-sent events, and racing work against the client going away."""

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from refengine.entrypoints.responses import ResponseModel

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def event(payload: ResponseModel) -> bytes:
    return b"data: " + payload.model_dump_json().encode() + b"\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


async def wait_for_disconnect(receive: Receive) -> None:
    # Once the body has been read, the next ASGI message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Runs `work`; if the client disconnects first, cancels it (which aborts any engine request
    it was iterating) and raises ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


class EventStreamResponse(Response):
    """A text/event-stream response that stops its producer as soon as the client leaves.

    Starlette's StreamingResponse only watches for the disconnect under ASGI spec < 2.4; this one
    always does, so an abandoned stream never keeps generating (and holding KV blocks) until its
    next write happens to fail.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        # Response.__init__ would render a body and a Content-Length; a stream has neither.
        self.events = events
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def _produce(self, send: Send) -> None:
        async with contextlib.aclosing(self.events) as events:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A failed write means the client has gone (ASGI spec >= 2.4); that ends the stream quietly.
        # on_close runs whatever happened, even if the producer never started.
        try:
            with contextlib.suppress(ClientDisconnected, OSError):
                await until_disconnect(receive, self._produce(send))
        finally:
            self.on_close()
