"""The persistent input batch (refengine/worker/input_batch.py) in a real engine: a step whose requests
are the last step's writes only what it adds (sampled tokens, drafts, new blocks), however long the
contexts; rows change only when requests join or leave; and after every step each held row equals its
request's history, blocks and sampling parameters."""

import random

import numpy as np
import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sample import rng
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=1)


# Contexts of 40 to 75 tokens: a step that rewrote a row would write tens of entries per request.
PROMPTS = [[random.Random(i).randrange(3, 300) for _ in range(40 + 7 * i)] for i in range(6)]


class StepWatch:
    """Wraps the runner's two step calls: after each sample, the step's writes to the batch and a check
    of every held row against the runner's per-request state."""

    def __init__(self, runner):
        self.runner = runner
        self.batch = runner.input_batch
        self.steps: list[tuple[object, int, int, int]] = []  # (so, token, block, row writes)
        self.mismatches: list[str] = []
        self._so = None
        self._last = self._counters()
        execute, sample = runner.execute_model, runner.sample_tokens

        def execute_model(so):
            self._so = so
            return execute(so)

        def sample_tokens(*args, **kwargs):
            out = sample(*args, **kwargs)
            now = self._counters()
            self.steps.append((self._so, *(a - b for a, b in zip(now, self._last, strict=True))))
            self._last = now
            self._check_rows()
            return out

        runner.execute_model, runner.sample_tokens = execute_model, sample_tokens

    def _counters(self) -> tuple[int, int, int]:
        return self.batch.num_token_writes, self.batch.block_table.num_writes, self.batch.num_row_writes

    def _check_rows(self) -> None:
        batch = self.batch
        if sorted(batch.req_ids) != sorted(self.runner.requests):
            self.mismatches.append(f"rows {batch.req_ids} for requests {sorted(self.runner.requests)}")
        for req_id, state in self.runner.requests.items():
            row = batch.req_id_to_index.get(req_id)
            if row is None or row >= batch.num_reqs or batch.req_ids[row] != req_id:
                self.mismatches.append(f"{req_id}: no row")
                continue
            blocks = batch.block_table.table[row, : batch.block_table.num_blocks[row]]
            params = state.params
            if (
                blocks.tolist() != list(state.block_ids)
                or (batch.temperature[row], batch.top_p[row], batch.top_k[row])
                != (np.float32(params.temperature), np.float32(params.top_p), params.top_k)
                or batch.key_words[row] != rng.key_word(params.rng_key)
            ):
                self.mismatches.append(f"{req_id}: row {row} differs from its request")

    def steady(self) -> list[tuple[object, int, int, int]]:
        """Steps whose SchedulerOutput added, resumed, finished and preempted nothing."""
        return [
            s for s in self.steps
            if not (s[0].scheduled_new_reqs or s[0].finished_req_ids or s[0].preempted_req_ids)
        ]  # fmt: skip


def _params(n: int, max_tokens: int = 16) -> list[SamplingParams]:
    # Greedy and seeded rows, and lengths that make requests leave from the middle of the batch.
    return [
        SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=10 + i, max_tokens=max_tokens - 3 * (i % 3), ignore_eos=True)
        for i in range(n)
    ]


def _generate(tiny, params, prompts=PROMPTS, **kwargs):
    llm = LLM(tiny, num_blocks=128, block_size=4, max_model_len=128, **kwargs)
    watch = StepWatch(llm.engine.core.runner)
    out = [o.token_ids for o in llm.generate(prompts[: len(params)], params)]
    return out, watch


@pytest.mark.parametrize(
    "kwargs",
    [
        {"async_scheduling": False},
        {"async_scheduling": True},
        {"speculative_config": SpeculativeConfig("mtp", 3)},
    ],
    ids=["sync", "async", "mtp-async"],
)
def test_a_steady_step_writes_only_what_it_adds(tiny, kwargs):
    """In a step with the same requests as the last one, no row is written whole, the blocks written
    are at most one per request (block_size 4, at most 4 tokens a step), and the token ids written are
    the step's drafts, its sampled tokens and the in-flight ids that landed: a bound in the scheduled
    tokens, not in the 40 to 75 tokens of context each request carries."""
    _, watch = _generate(tiny, _params(3, max_tokens=14), max_num_seqs=3, **kwargs)
    steady = watch.steady()
    assert len(steady) > 5, "the variant did not run: no steady steps"
    for so, tokens, blocks, rows in steady:
        assert rows == 0
        assert blocks <= len(so.num_scheduled_tokens)
        assert tokens <= 2 * so.total_num_scheduled_tokens + len(so.num_scheduled_tokens)
    assert not watch.mismatches


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_rows_follow_membership_through_chunking_preemption_and_condensing(tiny, async_scheduling):
    """Six requests through four rows, prefills chunked by a 9-token budget, and a KV pool small enough to
    preempt: requests join, leave from the middle (the last row moves into the hole) and come back. Every
    held row equals its request after every step, rows were moved, and the tokens equal each request
    generated alone."""
    params = _params(6)
    llm = LLM(tiny, num_blocks=44, block_size=4, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=9,
              async_scheduling=async_scheduling)
    watch = StepWatch(llm.engine.core.runner)
    together = [o.token_ids for o in llm.generate(PROMPTS, params)]
    alone = [_generate(tiny, [sp], [prompt], async_scheduling=False)[0][0] for sp, prompt in zip(params, PROMPTS)]
    assert not watch.mismatches
    assert together == alone
    num_added = sum(len(so.scheduled_new_reqs) for so, *_ in watch.steps)
    assert watch.batch.num_row_writes > num_added, "no row was moved: the condensing variant did not run"
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert any(
        so.num_scheduled_tokens[new.req_id] < len(new.prompt_token_ids) for so, *_ in watch.steps for new in so.scheduled_new_reqs
    ), "no prefill was chunked"
