"""SamplingParams: how one request samples and when it stops, validated at construction."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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
