"""The padded drafter batch the runner hands `propose` (draft_batch.py), read field by field in a real
run: each DraftInput's request id, token history, fed positions and prefix-cache start, and the input id
of every fed row (its committed successor, 0 for a rejected row). Greedy output and the acceptance
oracle cannot see most of these, since a random drafter's drafts are rejected either way."""

import dataclasses

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.proposer import PaddedDraftBatch, Proposer

K = 3
BLOCK_SIZE = 4
PROMPTS = [[(29 * i + 7 * j) % 250 + 3 for j in range(n)] for i, n in enumerate((9, 6))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@dataclasses.dataclass(frozen=True)
class _Seen:
    """One DraftInput and its slice of the batch, copied at `propose` time (the history is a view)."""

    req_id: object
    token_ids: list[int]
    first_position: object
    num_valid_rows: int
    propose: bool
    context_start: object
    positions: list[int]
    input_ids: list[int]


class _Recording:
    """Hands every call on to the real drafter and keeps what `propose` was given."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.capture_layers = inner.capture_layers
        self.random_init = inner.random_init
        self.steps: list[tuple[list[_Seen], list[int]]] = []

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor | None:
        seen = [
            _Seen(
                d.req_id,
                [int(t) for t in d.token_ids],
                d.first_position,
                d.num_valid_rows,
                d.propose,
                d.context_start,
                batch.positions[d.rows].tolist(),
                batch.input_ids[d.rows].tolist(),
            )
            for d in batch.requests
        ]
        self.steps.append((seen, batch.num_rejected_tokens.tolist()))
        return self.inner.propose(batch)

    def commit(self, requests, drafts):
        return self.inner.commit(requests, drafts)

    def remove(self, req_ids):
        self.inner.remove(req_ids)


@pytest.fixture
def llm(tiny4):
    # A fresh engine per test, its prefix cache empty. Sync scheduling: the positions the host plans are
    # the exact ones, so they can be checked here.
    return LLM(
        tiny4, num_blocks=64, block_size=BLOCK_SIZE, max_model_len=64, enable_prefix_caching=True,
        speculative_config=SpeculativeConfig("mtp", K), async_scheduling=False,
    )  # fmt: skip


def _run(llm, prompts):
    recorder = _Recording(llm.engine.runner.drafter)
    llm.engine.runner.drafter = recorder
    try:
        outs = llm.generate(prompts, PARAMS)
    finally:
        llm.engine.runner.drafter = recorder.inner
    return recorder.steps, {o.request_id: o.prompt_token_ids + o.token_ids for o in outs}


def test_each_request_of_the_padded_batch_is_its_own_fed_slice(llm):
    steps, final = _run(llm, PROMPTS)
    seen = [s for inputs, _ in steps for s in inputs]
    assert {s.req_id for s in seen} == set(final)
    for s in seen:
        # Its history so far: a prefix of what it finally committed, reaching past its first fed row.
        assert s.first_position < len(s.token_ids) <= s.first_position + s.num_valid_rows
        assert s.token_ids == final[s.req_id][: len(s.token_ids)]
        assert s.positions == list(range(s.first_position, s.first_position + s.num_valid_rows))
        assert s.context_start == 0  # nothing was cached yet


def test_input_ids_are_the_committed_successors_and_zero_where_rejected(llm):
    steps, final = _run(llm, PROMPTS)
    num_rejected_rows = 0
    for inputs, num_rejected in steps:
        rejected = iter(num_rejected)  # one per proposing request, in order
        for s in inputs:
            r = next(rejected) if s.propose else 0
            num_rejected_rows += r
            committed = s.positions[: len(s.positions) - r]
            sequence = final[s.req_id]
            # Past max_tokens a verified token is not in the output: those rows are not checked.
            expected = [sequence[p + 1] for p in committed if p + 1 < len(sequence)]
            assert s.input_ids[: len(expected)] == expected
            assert s.input_ids[len(committed) :] == [0] * r  # a rejected row's masked -1 is fed as 0
        assert next(rejected, None) is None
    assert num_rejected_rows > 0  # the random drafter's drafts were rejected: the zero rows were seen


def test_a_prefix_cache_hit_is_the_drafters_context_start(llm):
    """The same prompt again after it finished: its first two blocks come from the prefix cache, and
    every DraftInput of the second request says its context begins there."""
    prompt = PROMPTS[0]
    _run(llm, [prompt])
    steps, _ = _run(llm, [prompt])
    cached = (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert cached == 8
    assert [s.context_start for inputs, _ in steps for s in inputs] == [cached] * sum(
        len(i) for i, _ in steps
    )
