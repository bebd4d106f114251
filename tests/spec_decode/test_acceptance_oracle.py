"""Acceptance oracle (invariant 27): with a teacher network behind each method's input seam, every draft
is accepted, at c = 1 and at c = 4 with staggered arrivals, under sync and async scheduling; corrupted
at a chosen draft index, acceptance is exactly that index. Greedy output is lossless whatever the
drafter does, so only acceptance can show a seam fed a wrong row, a stale context or a wrong slot.

Invariant numbers refer to docs/invariants.md.
"""

import dataclasses

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.oracle.seam_teacher import CorruptingProposer, Trajectories, teacher_drafter
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.proposer import PaddedDraftBatch, Proposer

K = 3
# Different prompt lengths and max_tokens: at c = 4 the six requests join and leave at different steps.
PROMPT_LENGTHS = [5, 9, 13, 7, 11, 15]
MAX_TOKENS = [12, 6, 9, 15, 7, 10]
PROMPTS = [[(37 * i + 11 * j) % 250 + 3 for j in range(n)] for i, n in enumerate(PROMPT_LENGTHS)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
ASYNC_CAPABLE = ("eagle", "eagle3", "mtp", "dflash")


@pytest.fixture(scope="module")
def trajectories(tiny4):
    return Trajectories(tiny4, PROMPTS, max(MAX_TOKENS) + K + 2)


def _spec(method: str) -> SpeculativeConfig:
    return SpeculativeConfig(method, K, num_draft_layers=1 if method == "draft_model" else None)


def _run(tiny4, trajectories, method, max_num_seqs, wrap=lambda d: d, async_scheduling=None):
    llm = LLM(
        tiny4,
        num_blocks=128,
        block_size=4,
        max_model_len=64,
        max_num_seqs=max_num_seqs,
        speculative_config=_spec(method),
        async_scheduling=async_scheduling,
        record_steps=True,
    )
    llm.engine.runner.drafter = wrap(teacher_drafter(method, llm, trajectories))
    outs = llm.generate(PROMPTS, PARAMS)
    expected = [
        t.tokens[len(p) : len(p) + m] for t, p, m in zip(trajectories.items, PROMPTS, MAX_TOKENS, strict=True)
    ]
    assert [o.token_ids for o in outs] == expected  # lossless, and the teacher knows the target
    return llm, outs


def _expected_accepted(drafts: tuple[int, ...], first_corrupted: int) -> int:
    """Drafts before the first corrupted index and before the first -1 (an unfilled placeholder)."""
    first_pad = next((j for j, t in enumerate(drafts) if t < 0), len(drafts))
    return min(first_corrupted, first_pad)


CASES = [
    pytest.param(m, c, mode, id=f"{m}-c{c}-{mode}")
    for m in ("draft_model", "eagle", "eagle3", "mtp", "dflash")
    for c, mode in ((1, "default"), (4, "default"), (4, "flipped"))
    if not (mode == "flipped" and m not in ASYNC_CAPABLE)
]


@pytest.mark.parametrize("method, max_num_seqs, mode", CASES)
def test_teacher_acceptance_is_exactly_100_percent(tiny4, trajectories, method, max_num_seqs, mode):
    """'flipped' runs an async-capable method under sync scheduling (depth 1)."""
    llm, outs = _run(
        tiny4, trajectories, method, max_num_seqs, async_scheduling=False if mode == "flipped" else None
    )
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert all(r.num_accepted == len(r.draft_token_ids) == K for o in outs for r in o.steps)


@pytest.mark.parametrize("first_corrupted", [0, 1])
@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp", "dflash"])
def test_corrupted_teacher_accepts_exactly_the_scripted_drafts(tiny4, trajectories, method, first_corrupted):
    vocab = tiny4.config.vocab_size
    llm, outs = _run(
        tiny4, trajectories, method, 4, lambda d: CorruptingProposer(d, [first_corrupted], vocab)
    )
    records = [r for o in outs for r in o.steps]
    assert records and all(
        r.num_accepted == _expected_accepted(r.draft_token_ids, first_corrupted) for r in records
    )
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_accepted_tokens == sum(r.num_accepted for r in records)
    assert {r.num_accepted for r in records} == {first_corrupted}


class _EveryOtherStepCorrupted(CorruptingProposer):
    """Corrupts draft 0 on every other step only: a clean step follows one that rejected everything."""

    num_calls = 0

    def corrupts_this_step(self) -> bool:
        self.num_calls += 1
        return self.num_calls % 2 == 1


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_a_step_after_a_rejecting_one_accepts_every_draft(tiny4, trajectories, method):
    """After a step that rejected its drafts, the drafter must draft from the last committed row and
    position (invariant 30: the padded batch's pass 1 also ran over the rejected rows), so the next
    clean drafts are all accepted: every step accepts all of its drafts or none."""
    vocab = tiny4.config.vocab_size
    _, outs = _run(tiny4, trajectories, method, 4, lambda d: _EveryOtherStepCorrupted(d, [0], vocab))
    records = [r for o in outs for r in o.steps if r.draft_token_ids]
    full = [_expected_accepted(r.draft_token_ids, K) for r in records]
    assert [r.num_accepted for r in records] == [
        n if r.num_accepted else 0 for r, n in zip(records, full, strict=True)
    ]
    assert any(r.num_accepted == 0 for r in records) and any(
        n > 1 and r.num_accepted == n for r, n in zip(records, full, strict=True)
    )


class _RowShiftedProposer:
    """A seam fault: the drafter is handed every hidden/context row one row late (row r gets row r-1's
    state), as a wrong flattened-buffer offset would (invariant 17)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.capture_layers = inner.capture_layers
        self.random_init = False

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor | None:
        shift = lambda t: torch.roll(t, 1, dims=0)  # noqa: E731
        aux = {i: shift(t) for i, t in batch.aux_hidden_states.items()}
        return self.inner.propose(
            dataclasses.replace(batch, hidden_states=shift(batch.hidden_states), aux_hidden_states=aux)
        )

    def commit(self, requests, drafts):
        return self.inner.commit(requests, drafts)

    def remove(self, req_ids):
        self.inner.remove(req_ids)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "dflash"])
def test_teacher_notices_rows_from_the_wrong_offset(tiny4, trajectories, method):
    """The oracle is not vacuous: the same run with the rows misaligned stays lossless but loses
    nearly all acceptance."""
    llm, _ = _run(tiny4, trajectories, method, 4, _RowShiftedProposer)
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_accepted_tokens < 0.2 * stats.num_draft_tokens
