"""What the engine hands to its callers."""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as one request saw it: the drafts it verified and how many were accepted.
    The oracle compares these between sync and async arms (identical tokens can hide a drafter fed
    the wrong state)."""

    draft_token_ids: tuple[int, ...]
    num_accepted: int


@dataclass(frozen=True, slots=True)
class RequestDelta:
    """New output of one request from one engine step; several tokens when drafts were accepted."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass(slots=True)
class RequestOutput:
    """A finished request, as LLM.generate returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
