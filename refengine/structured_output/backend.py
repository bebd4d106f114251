"""The grammar backend: llguidance, vLLM's "guidance" backend (docs/structured-output.md says why it was
chosen over xgrammar, with the measured figures).

Torch-free on purpose: grammars, matchers and bitmasks are llguidance and numpy objects, so the
scheduler can own each request's matcher (as vLLM's does) while `core/` never imports torch.
llguidance is an optional dependency (the `structured` extra); without it, a request that asks for
structured output gets a one-line error naming the extra, and nothing else changes.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import TYPE_CHECKING

from refengine.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer

    from refengine.tokenizer import Tokenizer

# JSON is generated compact, with json.dumps' separators and no other whitespace: free whitespace lets a
# model pad an object forever (a random test model does), and compact output is what a client parses.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# llguidance's "any JSON object" (response_format json_object).
ANY_OBJECT_SCHEMA = {"type": "object"}


class StructuredOutputUnavailable(ValueError):
    """Structured output was asked for, but the grammar backend is not installed."""


class GrammarError(ValueError):
    """A schema, regex, choice set or grammar that the backend cannot compile; the message names why."""


def llguidance() -> ModuleType:
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 - the bitmask helpers, imported here so a missing piece fails early
    except ImportError:
        raise StructuredOutputUnavailable(
            "structured output needs the llguidance package: install the `structured` extra "
            "(pip install -e '.[structured]'; `make install` does)"
        ) from None
    return llguidance


def grammar_spec(params: StructuredOutputsParams) -> str:
    """The request's constraint as an llguidance grammar definition (not yet checked)."""
    llg = llguidance()
    matcher = llg.LLMatcher
    if params.json is not None or params.json_object:
        schema = ANY_OBJECT_SCHEMA if params.json_object else params.json
        try:
            return matcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as err:
            raise GrammarError(f"invalid JSON schema: {err}") from None
    if params.regex is not None:
        return matcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        # One alternative per string, each a Lark literal (a JSON string is a valid one).
        return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in params.choice))
    return llg.grammar_from("grammar", params.grammar or "")


class GuidanceBackend:
    """llguidance over the engine's tokenizer. `vocab_size` is the width of the model's logits, which
    may exceed the tokenizer's vocabulary: the extra ids are never allowed."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: LLTokenizer | None = None

    @property
    def ll_tokenizer(self) -> LLTokenizer:
        # Built on first use (about a second for a 49k vocabulary), on the compile thread.
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance().LLTokenizer(
                self.tokenizer.to_json(),
                n_vocab=self.vocab_size,
                eos_token=list(self.tokenizer.eos_token_ids) or None,
            )
        return self._ll_tokenizer

    def validate(self, params: StructuredOutputsParams) -> None:
        """Raises GrammarError naming the problem; cheap enough for a request handler."""
        error = llguidance().LLMatcher.validate_grammar(grammar_spec(params))
        if error:
            raise GrammarError(_one_line(error))

    def compile(self, params: StructuredOutputsParams) -> LLMatcher:
        """A matcher in its initial state, to be deep-copied for each request."""
        matcher = llguidance().LLMatcher(self.ll_tokenizer, grammar_spec(params), log_level=0)
        if matcher.is_error():
            raise GrammarError(_one_line(matcher.get_error()))
        return matcher


def _one_line(message: str) -> str:
    return " ".join(message.split())
