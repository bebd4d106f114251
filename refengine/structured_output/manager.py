"""StructuredOutputManager (vLLM's name): compiles grammars off the engine thread behind a cache, and
computes each step's token bitmasks.

Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from refengine.sampling_params import StructuredOutputsParams
from refengine.structured_output.backend import GuidanceBackend, llguidance
from refengine.structured_output.output import GrammarOutput
from refengine.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from llguidance import LLMatcher

    from refengine.tokenizer import Tokenizer

# Compiled grammars kept, most recently used first out last: a bound, so that a stream of distinct
# schemas cannot grow the cache without limit.
CACHE_SIZE = 256


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.backend = GuidanceBackend(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        # One thread: compiles run in arrival order, and never on the engine thread.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refengine-grammar")
        self._cache: OrderedDict[tuple[str, str], Future[LLMatcher]] = OrderedDict()
        self._lock = threading.Lock()  # the front end's threads and the engine thread both reach the cache
        self.num_compiles = 0
        # Rows whose bitmask forbade at least one token: the evidence that the masks bit.
        self.num_masked_rows = 0

    def validate(self, params: StructuredOutputsParams) -> None:
        """For the front ends, before a request is accepted: raises GrammarError naming the problem, or
        StructuredOutputUnavailable without the backend."""
        llguidance()
        self.backend.validate(params)

    def request(self, params: StructuredOutputsParams) -> StructuredOutputRequest:
        """The request's compiled grammar, from the cache or from a compile started now off this thread."""
        with self._lock:
            compiled = self._cache.get(params.key)
            if compiled is None:
                self.num_compiles += 1
                compiled = self._executor.submit(self.backend.compile, params)
                self._cache[params.key] = compiled
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(params.key)
        return StructuredOutputRequest(params, compiled)

    def grammar_bitmask(
        self,
        structured_requests: Mapping[str, StructuredOutputRequest],
        spec_decode_tokens: Mapping[str, Sequence[int]],
    ) -> GrammarOutput | None:
        """Bitmasks for every verified row of the step's sampling structured-output requests, which the
        scheduler picks (rows in the mapping's order): row j of a request (draft j, then the bonus row)
        is masked by the grammar advanced through drafts[:j].

        Invariant 25: the advance is tentative and rolled back exactly, so the matcher keeps only
        committed tokens. It stops at the first -1 (a placeholder or a pad, never a token) and at the
        first draft the grammar forbids: such a draft is always rejected, so the rows after it are
        never emitted from. It stops at the grammar's end too (the request ends there)."""
        rows: dict[str, tuple[int, int]] = {}
        num_rows = 0
        for req_id in structured_requests:
            num_drafts = len(spec_decode_tokens.get(req_id, ()))
            rows[req_id] = (num_rows, num_drafts + 1)
            num_rows += num_drafts + 1
        if not rows:
            return None
        bitmask = llguidance().numpy.allocate_token_bitmask(num_rows, self.vocab_size)
        for req_id, structured in structured_requests.items():
            drafts = spec_decode_tokens.get(req_id, ())
            grammar = structured.grammar
            first = rows[req_id][0]
            real = list(drafts[: next((j for j, t in enumerate(drafts) if t < 0), len(drafts))])
            num_valid = grammar.validate_tokens(real) if real else 0
            advanced = 0
            for j in range(len(drafts) + 1):
                grammar.fill_bitmask(bitmask, first + j)
                # The advance stops at the grammar's end: its matcher consumes nothing past it, not even
                # the EOS that validation allows there, and the failed consume is an error state that
                # rollback does not undo. Rows past the end allow EOS only, and none is emitted from.
                if j < num_valid and not grammar.is_terminated() and grammar.accept_tokens([real[j]]):
                    advanced += 1
            grammar.rollback(advanced)
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab_size]
        self.num_masked_rows += int((allowed == 0).any(axis=1).sum())
        return GrammarOutput(rows, bitmask)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
