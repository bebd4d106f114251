"""Per-row sampling. Each row is processed on its own, so a request's result never depends on the
other rows of the batch; greedy is an exact argmax."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refengine.request import Request
from refengine.sample import rng


@dataclass(frozen=True, slots=True)
class RowParams:
    """What the sampler needs to know about one request; built by the runner from SamplingParams."""

    temperature: float
    top_k: int  # <= 0 means off
    top_p: float  # 1.0 means off
    min_tokens: int
    stop_token_ids: tuple[int, ...]  # eos (unless ignore_eos) plus the request's stop ids
    bad_words_token_ids: tuple[tuple[int, ...], ...]
    rng_key: int

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def banned_next_tokens(history: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """Tokens that would complete a banned sequence, given the committed history."""
    banned = []
    for word in bad_words:
        prefix_len = len(word) - 1
        if prefix_len == 0 or (len(history) >= prefix_len and list(history[-prefix_len:]) == list(word[:-1])):
            banned.append(word[-1])
    return banned


def valid_draft_prefix(request: Request, drafts: list[int]) -> int:
    """How many leading drafts survive the request's bad_words, given its committed history: the
    constraint this engine validates drafts against, as a grammar would."""
    history = list(request.all_token_ids)
    for j, draft in enumerate(drafts):
        if draft in banned_next_tokens(history, request.sampling_params.bad_words_token_ids):
            return j
        history.append(draft)
    return len(drafts)


def apply_constraints(
    logits: torch.Tensor, params: RowParams, history: Sequence[int], num_output_tokens: int
) -> torch.Tensor:
    """Masks bad words and, below min_tokens, the stop tokens. `history` is prompt + outputs + any
    drafts before this row (so a verify row sees what the non-spec path would have seen)."""
    masked = []
    if params.bad_words_token_ids:
        masked += banned_next_tokens(history, params.bad_words_token_ids)
    if num_output_tokens < params.min_tokens:
        masked += params.stop_token_ids
    if not masked:
        return logits
    out = logits.clone()
    out[torch.tensor(masked, dtype=torch.long)] = float("-inf")
    return out


def probabilities(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of logits, as a float32 distribution."""
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p; the top token always survives.
        drop = order[before >= params.top_p]
        probs = probs.clone()
        probs[drop] = 0.0
        probs = probs / probs.sum()
    return probs


def race(weights: torch.Tensor, key: int, position: int, stream: int) -> int:
    """A sample proportional to `weights` (need not be normalised), keyed by (key, position)."""
    noise = rng.exponential(key, position, stream, weights.numel())
    return int(torch.argmax(weights / noise).item())


def sample(logits: torch.Tensor, params: RowParams, position: int) -> int:
    """One token for the sequence position `position` from processed logits."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    return race(probabilities(logits, params), params.rng_key, position, rng.STREAM_SAMPLE)
