"""What the runner remembers about one request between steps, keyed by request id.

Invariant numbers refer to docs/invariants.md.
"""

from dataclasses import dataclass, field

from refengine.core.outputs import NewRequestData
from refengine.sample.sampler import RowParams
from refengine.sample.step_support import uniform_step_supports


@dataclass(slots=True)
class CachedRequestState:
    """`num_tokens` counts the runner's own view of the request's tokens: prompt plus every token it has
    sampled, -1 placeholders for those still in flight (as if every draft were accepted, invariant 48).
    The tokens themselves are kept once, in the request's InputBatch row. Under async scheduling the
    runner runs ahead of the scheduler, which learns the tokens one frame later.

    `num_computed_tokens` is exact: positions whose KV holds committed tokens. The scheduler's count is
    optimistic under async (it assumes every draft in flight is accepted); this one is corrected by the
    acceptance the runner already saw (invariant 18).
    """

    req_id: str
    num_tokens: int
    num_prompt_tokens: int
    num_computed_tokens: int
    block_ids: tuple[int, ...]
    params: RowParams
    num_logprobs: int | None  # None: the request wants no logprobs
    # Drafts this runner proposed after its last verification; they fill the scheduler's -1
    # placeholders (async) and are what take_draft_token_ids hands over (sync).
    pending_drafts: list[int] = field(default_factory=list)
    # The positions a prefix-cache hit covered when the request was (re)admitted.
    num_cached_tokens: int = 0
    # It has a constraint (bad words, a grammar): its drafts are judged on the host, its rows masked.
    constrained: bool = False
    # Every field it sets is one the uniform verify step honours (sample/step_support.py).
    uniform_step: bool = False

    @classmethod
    def from_new(cls, data: NewRequestData) -> "CachedRequestState":
        sp = data.sampling_params
        stop_ids = tuple(sp.stop_token_ids) + (
            (data.eos_token_id,) if data.eos_token_id is not None and not sp.ignore_eos else ()
        )
        params = RowParams(
            temperature=sp.temperature,
            top_k=sp.top_k if sp.top_k and sp.top_k > 0 else 0,
            top_p=sp.top_p,
            min_tokens=sp.min_tokens,
            stop_token_ids=stop_ids,
            bad_words_token_ids=tuple(tuple(w) for w in sp.bad_words_token_ids),
            rng_key=data.rng_key,
        )
        return cls(
            req_id=data.req_id,
            num_tokens=len(data.prompt_token_ids) + len(data.output_token_ids),
            num_prompt_tokens=len(data.prompt_token_ids),
            num_computed_tokens=data.num_computed_tokens,
            block_ids=data.block_ids,
            params=params,
            num_logprobs=sp.logprobs,
            num_cached_tokens=data.num_computed_tokens,
            constrained=bool(sp.bad_words or sp.bad_words_token_ids or sp.structured_outputs),
            uniform_step=uniform_step_supports(sp),
        )

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens
