"""Reading an SSE body the way benchmark clients do: `data:` lines, until `[DONE]`."""

import json


def parse_events(body: str) -> tuple[list[dict], bool]:
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    events, done = [], False
    for block in body.split("\n\n"):
        line = block.strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
        else:
            assert not done, "event after [DONE]"
            events.append(json.loads(data))
    return events, done


def streamed_token_ids(events: list[dict]) -> list[int]:
    return [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
