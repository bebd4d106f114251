"""SamplingParams: how one request samples and when it stops, validated at construction."""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_LOGPROBS = 20


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(name: str, value: object) -> list[str]:
    # A bare string is refused rather than split into characters.
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"SamplingParams.{name} must be a list of strings, got {value!r}")
    if not all(isinstance(s, str) and s for s in value):
        raise ValueError(f"SamplingParams.{name} must hold non-empty strings, got {value!r}")
    return list(value)


def _token_id_list(name: str, value: object) -> list[int]:
    if not isinstance(value, Sequence) or not all(_is_int(t) and t >= 0 for t in value):
        raise ValueError(f"SamplingParams.{name} must be a list of token ids >= 0, got {value!r}")
    return list(value)


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """The constraint a structured output follows (vLLM's name and fields): exactly one of a JSON schema,
    any JSON object, a regular expression, a choice among strings, or a Lark grammar."""

    json: str | dict[str, Any] | None = None  # a JSON schema, as an object or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark syntax, as llguidance reads it
    json_object: bool | None = None  # any JSON object (response_format json_object)

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(
                "StructuredOutputsParams needs exactly one of json, regex, choice, grammar or json_object, "
                f"got {given or 'none'}"
            )
        if isinstance(self.json, str):
            try:
                json.loads(self.json)
            except ValueError as err:
                raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {err}") from None
        elif self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"StructuredOutputsParams.json must be a JSON schema object, got {self.json!r}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"StructuredOutputsParams.{name} must be a string, got {getattr(self, name)!r}")
        if self.choice is not None:
            choice = _str_list("structured_outputs.choice", self.choice)
            if not choice:
                raise ValueError("StructuredOutputsParams.choice must hold at least one string")
            object.__setattr__(self, "choice", choice)

    @property
    def key(self) -> tuple[str, str]:
        """What a compiled grammar is cached under: the kind and a canonical spelling of the constraint."""
        if self.json is not None:
            schema = json.loads(self.json) if isinstance(self.json, str) else self.json
            return ("json", json.dumps(schema, sort_keys=True, separators=(",", ":")))
        if self.choice is not None:
            return ("choice", json.dumps(self.choice))
        if self.json_object:
            return ("json_object", "")
        return ("regex", self.regex) if self.regex is not None else ("grammar", self.grammar or "")


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (exact argmax)
    top_k: int = 0  # 0 (or -1) = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # None: the engine derives the request's key from its own seed
    max_tokens: int = 16
    min_tokens: int = 0  # eos, stop_token_ids and stop strings cannot end the request before this
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    bad_words: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None: none; n: the emitted token's logprob and the n most likely
    # The tokenized bad_words, filled in by the engine with its tokenizer.
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {t!r}")
        self.temperature = float(t)
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(
                f"SamplingParams.top_k must be -1 or 0 (off) or a positive integer, got {self.top_k!r}"
            )
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {p!r}")
        self.top_p = float(p)
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"SamplingParams.seed must be an integer or None, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        self.stop = _str_list("stop", self.stop)
        self.stop_token_ids = _token_id_list("stop_token_ids", self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(
                f"SamplingParams.logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}"
            )
        self.bad_words = _str_list("bad_words", self.bad_words)
        if not isinstance(self.bad_words_token_ids, Sequence) or not all(
            isinstance(w, Sequence) and w for w in self.bad_words_token_ids
        ):
            raise ValueError(
                f"SamplingParams.bad_words_token_ids must be a list of non-empty token id lists, "
                f"got {self.bad_words_token_ids!r}"
            )
        self.bad_words_token_ids = [
            _token_id_list("bad_words_token_ids", w) for w in self.bad_words_token_ids
        ]
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError(
                    "SamplingParams.structured_outputs must be a StructuredOutputsParams, "
                    f"got {self.structured_outputs!r}"
                )
            # Either could mask every token the grammar allows (eos held back by min_tokens when the grammar
            # is complete; a banned word that is the only way on), and a row with nothing left to sample
            # would emit a token the grammar forbids.
            if self.min_tokens or self.bad_words or self.bad_words_token_ids:
                raise ValueError(
                    "SamplingParams.structured_outputs cannot be combined with min_tokens or bad_words"
                )
