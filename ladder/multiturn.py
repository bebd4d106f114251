"""Multi-turn sessions (`--multi-turn N`), as a chat client resends a conversation: turn k's request carries
the session's history (its k - 1 earlier user turns, each followed by the reply to it) and then the turn's
new user message. The reply is the server's own answer to that turn, its streamed content, or with
`--multi-turn-reply dataset` the dataset's reply (ShareGPT's gpt turn; seeded words for random prompts),
the same whatever the server said.

A session's turns go in order, each once the answer before it is complete (ladder.client.run_sessions); up
to c sessions run at once, so at most c requests are in flight, each from a different session.

With cache busting each session draws its own tag when its first turn is sent, at the front of its first
message: every turn of the session starts with it, so the history stays a prefix that the server's cache
can serve, while no other session, repeat or run shares it.
"""

from collections.abc import Sequence
from itertools import groupby

from ladder.client import Messages
from ladder.records import RequestRecord
from ladder.workload import Builder, Request, new_nonce, with_nonce


class SessionOrderError(RuntimeError):
    """A turn was built before every earlier turn of its session was answered."""


def history(turns: Sequence[Request], replies: Sequence[str]) -> Messages:
    """The messages of turn len(replies) + 1: each earlier turn with its reply, then the new user turn."""
    messages: list[tuple[str, str]] = []
    for turn, reply in zip(turns, replies, strict=False):
        messages += [*turn.messages, ("assistant", reply)]
    return [*messages, *turns[len(replies)].messages]


class SessionPhase:
    """One phase's sessions as they run: the records of each, and each turn's body, built when it is sent
    from the history so far."""

    def __init__(self, requests: Sequence[Request], records: Sequence[RequestRecord], builder: Builder,
                 server_replies: bool, cache_bust: bool, save_text: bool):
        self.requests = [list(g) for _, g in groupby(requests, key=lambda r: r.session)]
        self.records = [list(g) for _, g in groupby(records, key=lambda r: r.session)]
        self.builder, self.server_replies, self.save_text = builder, server_replies, save_text
        self.cache_bust = cache_bust
        self.tags: dict[int, str | None] = {}
        for rec in records:
            rec.output_text = ""  # the server's reply is the next turn's history

    def body(self, session: int, turn: int) -> bytes:
        """The request of 0-based `turn` of `session`; its earlier turns have been answered."""
        turns, records = self.requests[session], self.records[session]
        # Invariant: a turn is built only once every earlier turn of its session is answered ([DONE] came),
        # since its history holds their replies; anything else is a bug in the sender, never a VOID rung.
        if not all(rec.done for rec in records[:turn]):
            raise SessionOrderError(f"turn {turn + 1} of session {session} was built before the turns before it "
                                    f"were answered")
        replies = ([rec.output_text for rec in records[:turn]] if self.server_replies
                   else [req.reply for req in turns[:turn]])
        tag = self.tags.setdefault(session, new_nonce() if self.cache_bust else None)
        messages = with_nonce(tuple(history(turns, replies)), tag)
        if self.save_text:
            records[turn].prompt = list(messages)
        return self.builder.messages_body(messages, turns[turn].max_tokens)
