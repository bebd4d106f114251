"""One request's grammar matcher (vLLM's StructuredOutputGrammar), torch-free.

Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from refengine.structured_output.backend import llguidance

if TYPE_CHECKING:
    from llguidance import LLMatcher


class GrammarStateError(RuntimeError):
    """The matcher no longer holds the committed output (invariant 25)."""


class Grammar:
    """The scheduler advances it by committed tokens only (accept_tokens, in update_from_output). Masks
    for draft rows advance it tentatively and roll back exactly what they advanced."""

    __slots__ = ("_matcher", "num_processed_tokens")

    def __init__(self, matcher: LLMatcher) -> None:
        self._matcher = matcher
        # Tokens consumed and not rolled back: what a test reads to see a tentative advance undone.
        self.num_processed_tokens = 0

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Consume the tokens; False (and an error state) if the grammar forbids one of them."""
        ok = self._matcher.consume_tokens(list(token_ids))
        if ok:
            self.num_processed_tokens += len(token_ids)
        return ok

    def validate_tokens(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens the grammar allows from the current state; the state does not move."""
        return self._matcher.validate_tokens(list(token_ids))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            self.num_processed_tokens -= num_tokens
        # Invariant 25: after a tentative advance the matcher holds the committed output, usable. A
        # consume it refused leaves an error state that rollback keeps, and every later token of the
        # request would be refused: refuse it here, where it happened.
        if self._matcher.is_error():
            raise GrammarStateError(f"the grammar's matcher is in an error state after a rollback: {self.error[:200]}")

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Row `row` of an int32 [rows, ceil(vocab / 32)] bitmask: bit t set = token t allowed next."""
        llguidance().numpy.fill_next_token_bitmask(self._matcher, bitmask, row)

    def is_terminated(self) -> bool:
        """The grammar is complete and admits nothing more (but EOS)."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str:
        return self._matcher.get_error()
