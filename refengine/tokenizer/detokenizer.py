"""Turning a growing list of token ids into text, emitting only complete UTF-8 characters."""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from refengine.tokenizer.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed token ids as they are generated; each `push` returns the text they completed.

    A character split across tokens (an emoji is often two or three byte tokens) is held back until
    its last byte arrives; invalid bytes become U+FFFD, as in `Tokenizer.decode`.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        data = b"".join(
            self._tokenizer.token_bytes(token_id)
            for token_id in token_ids
            if not (self._skip_special_tokens and self._tokenizer.is_special(token_id))
        )
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The end of the stream: whatever is held back, with an unfinished character as U+FFFD."""
        return self._utf8.decode(b"", final=True)
