"""Incremental server-sent-events parser over raw bytes.

It works on bytes and hands out each event's data only once the event is complete, so a multi-byte UTF-8
character split across two reads is never decoded in halves (json.loads takes the bytes whole).
Handles `:` comment lines (keep-alive pings), CRLF / CR / LF line ends (also a CRLF split across reads),
several `data:` lines in one event, and ignores the event/id/retry fields, which OpenAI streams do not use.
"""


class SSEParser:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Return the data payload of every event completed by `data`, in order."""
        buf = self._buf + data if self._buf else data
        held = b""
        if b"\r" in buf:
            # NOTE: a trailing CR may be the first half of a CRLF; keep it until the next read decides.
            if buf.endswith(b"\r"):
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop() + held
        out = []
        for block in blocks:
            # Fast path: the shape every OpenAI-compatible server sends.
            if block.startswith(b"data: ") and b"\n" not in block:
                out.append(block[6:])
                continue
            lines = []
            for line in block.split(b"\n"):
                field, _, value = line.partition(b":")
                if field == b"data":
                    lines.append(value[1:] if value.startswith(b" ") else value)
            if lines:
                out.append(b"\n".join(lines))
        return out
