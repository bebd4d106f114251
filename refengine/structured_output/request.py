"""What a request carries about its structured output (vLLM's StructuredOutputRequest)."""

from __future__ import annotations

from concurrent.futures import Future, wait
from typing import TYPE_CHECKING

from refengine.sampling_params import StructuredOutputsParams
from refengine.structured_output.grammar import Grammar

if TYPE_CHECKING:
    from llguidance import LLMatcher


class StructuredOutputRequest:
    """The constraint, and its grammar once compiled. The compile runs off the engine thread; until it
    is done the request waits (WAITING_FOR_FSM) and the batch goes on without it."""

    __slots__ = ("params", "_compiled", "_grammar")

    def __init__(self, params: StructuredOutputsParams, compiled: Future[LLMatcher]) -> None:
        self.params = params
        self._compiled = compiled
        self._grammar: Grammar | None = None

    def is_ready(self) -> bool:
        return self._compiled.done()

    def wait(self, timeout: float) -> None:
        """Until the grammar is compiled (or failed to), at most `timeout` seconds."""
        wait([self._compiled], timeout)

    @property
    def compile_error(self) -> str | None:
        """Why the grammar did not compile (only once is_ready)."""
        err = self._compiled.exception()
        return None if err is None else f"{type(err).__name__}: {err}"

    @property
    def grammar(self) -> Grammar:
        """This request's own matcher, a copy of the cached compiled one (only once ready and compiled)."""
        if self._grammar is None:
            self._grammar = Grammar(self._compiled.result().deep_copy())
        return self._grammar
