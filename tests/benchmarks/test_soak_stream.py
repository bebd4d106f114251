"""The soak client's stream reader: SSE lines end at CR, LF or CRLF only. A completion whose text holds
U+2028, U+0085 or a form feed (a random model's tokens do) is one JSON event, and pydantic writes those
characters raw: a reader that split lines where str.splitlines does cut the event in two and counted a
healthy stream as broken. A stand-in transport serves that exact stream (a model cannot be made to)."""

import asyncio
import json

import httpx

from benchmarks.soak.load import Recorder

TEXT = "a\u2028b\x85c\x0cd"


def sse(*events: dict) -> bytes:
    body = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


def test_a_stream_whose_text_holds_unicode_line_separators_completes():
    body = sse(
        {"choices": [{"index": 0, "text": TEXT, "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "e", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    )
    assert "\u2028".encode() in body  # written raw, as the server writes it
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    recorder = Recorder()

    async def run():
        async with httpx.AsyncClient(transport=transport, base_url="http://soak") as client:
            await recorder.stream(client, "/v1/completions", {}, abort_after=None, read_delay=0.0)

    asyncio.run(run())
    assert recorder.tally.completed["length"] == 1
    assert not recorder.tally.server_errors and recorder.tally.completion_tokens == 2
