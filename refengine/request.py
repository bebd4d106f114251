"""Request: one generation's tokens, scheduling counters and lifecycle status."""

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from refengine.sample.splitmix import MASK64, splitmix64
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.metrics import SpecDecodingStats

if TYPE_CHECKING:
    from refengine.structured_output.request import StructuredOutputRequest


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class RequestStatus(enum.IntEnum):
    """Ordered: every status after PREEMPTED is a finished one."""

    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()  # waiting for its grammar to compile (vLLM's name)
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


def derive_rng_key(seed: int | None, engine_seed: int, arrival_index: int) -> int:
    """The request's 64-bit randomness key: its own seed if it has one, else a mix of the engine seed
    and its arrival index, so that a rerun of the same request sequence draws the same numbers."""
    if seed is not None:
        return seed & MASK64
    return splitmix64(splitmix64(engine_seed & MASK64) ^ arrival_index)


class Request:
    """Token lists are private and grow only through append_output_token_ids; the counters below are
    written by the scheduler alone.

    nc = num_computed_tokens: positions whose KV is written or scheduled to be (optimistic: it includes
        drafts and in-flight positions until their output says otherwise).
    spec_token_ids: drafts to verify next step (sync), or -1 placeholders for them (async).
    num_output_placeholders: tokens that frames in flight will deliver (async only).
    num_in_flight_tokens: tokens scheduled in frames that have not returned yet.
    num_stale_output_tokens: the in-flight tokens that belong to frames scheduled before a preemption.
    """

    __slots__ = (
        "request_id",
        "sampling_params",
        "eos_token_id",
        "arrival_index",
        "rng_key",
        "_prompt_token_ids",
        "_output_token_ids",
        "status",
        "stop_reason",
        "num_computed_tokens",
        "spec_token_ids",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_output_tokens",
        "num_preemptions",
        "num_cached_tokens",
        "is_prefill_chunk",
        "spec_decoding_stats",
        "structured_output_request",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        eos_token_id: int | None = None,
        arrival_index: int = 0,
        engine_seed: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_index = arrival_index
        self.rng_key = derive_rng_key(sampling_params.seed, engine_seed, arrival_index)
        self._prompt_token_ids = list(prompt_token_ids)
        self._output_token_ids: list[int] = []
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.num_computed_tokens = 0
        self.spec_token_ids: list[int] = []
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.num_preemptions = 0
        # Prompt tokens its first admission found in the prefix cache (-1 until admitted), as vLLM's.
        self.num_cached_tokens = -1
        # Set when scheduled: the step's positions end before the last known token, so it samples nothing.
        self.is_prefill_chunk = False
        self.spec_decoding_stats = SpecDecodingStats()
        # Its grammar, set by the scheduler when a request asks for structured output.
        self.structured_output_request: StructuredOutputRequest | None = None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, nt={self.num_tokens}, "
            f"nc={self.num_computed_tokens}, ph={self.num_output_placeholders}, "
            f"inf={self.num_in_flight_tokens}, st={self.num_stale_output_tokens}, spec={self.spec_token_ids})"
        )

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
        else:
            self._output_token_ids.extend(token_ids)

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return tuple(self._prompt_token_ids)

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(self._output_token_ids)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return (*self._prompt_token_ids, *self._output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self._prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._prompt_token_ids) + len(self._output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def has_constraint(self) -> bool:
        """Whether drafts must be checked against the output so far (bad_words, a grammar)."""
        params = self.sampling_params
        return bool(params.bad_words or params.bad_words_token_ids or params.structured_outputs)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished()

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.status.finish_reason
