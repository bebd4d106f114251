"""A differential test of the ways a verify step can go (issue 56), through the real engine on a tiny qwen3:
the one-graph uniform step run eagerly (worker/spec_step_graphs.py, installed as the CPU runs it), the
general path under async scheduling (drafts in flight on the device) and sync scheduling (every step read
back). For drawn sampling parameters and drafters the three emit the same tokens and verify the same drafts,
and the uniform step is only ever taken by requests whose every field it honours, by the one declaration
in sample/step_support.py, which must name every field of SamplingParams."""

import dataclasses

import torch
from hypothesis import strategies as st

from refengine.engine.llm import LLM
from refengine.sample.step_support import UNIFORM_STEP_HONOURS, Honours, uniform_step_supports
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.worker.sampler_graphs import RejectionSamplerGraphs
from refengine.worker.spec_step_graphs import SpecStepGraphs
from refengine.worker.step_plan import Dispatcher
from tests.property_budget import property_tests

CPU = torch.device("cpu")
BATCH_SIZES = [1, 2, 3, 4]
PROMPTS = [[(37 * i + 11 * j) % 290 + 3 for j in range(4 + 5 * i)] for i in range(4)]


def _llm(tiny4, method: str, k: int, async_scheduling: bool, uniform: bool) -> LLM:
    llm = LLM(
        tiny4, num_blocks=96, block_size=4, max_model_len=64, max_num_seqs=4, record_steps=True,
        speculative_config=SpeculativeConfig(method, k), async_scheduling=async_scheduling,
    )  # fmt: skip
    if uniform:
        # What a GPU captures, run eagerly: the CPU's way (tests/worker/test_spec_step_graphs.py).
        runner, target = llm.engine.runner, llm.engine.runner.model
        drafter = DraftGraphs(
            runner.drafter.device_drafter, (target.config.hidden_size, target.embed_tokens.weight.dtype),
            runner.input_batch.block_table.table.shape[1], BATCH_SIZES, CPU,
        )  # fmt: skip
        sampler = RejectionSamplerGraphs(target.config.vocab_size, k, BATCH_SIZES, CPU, runner.accept)
        uniform = SpecStepGraphs(sampler, drafter, CPU)
        runner.dispatcher = Dispatcher(k, runner.input_batch, None, None, uniform, None, runner.drafter.capture_layers)
    return llm


plain = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.0, 0.7, 1.3]),
    seed=st.sampled_from([0, 1, 12345]),
    max_tokens=st.integers(3, 16),
    ignore_eos=st.just(True),
)


EXTRAS = {
    "top_k": st.sampled_from([-1, 1, 3, 40]),
    "top_p": st.sampled_from([0.3, 0.8]),
    "logprobs": st.sampled_from([0, 2]),
    "min_tokens": st.integers(1, 3),
    "bad_words_token_ids": st.sampled_from([[[7]], [[7, 8]], [[40], [41]]]),
    "stop_token_ids": st.sampled_from([[5], [60, 61]]),
}


@st.composite
def sampling_params(draw) -> SamplingParams:
    """Half the time what the uniform step takes as it is; else one field it may leave out, drawn."""
    params = draw(plain)
    field = draw(st.sampled_from([None, None, None, *EXTRAS]))
    if field is None:
        return params
    value = draw(EXTRAS[field])
    return dataclasses.replace(params, **{field: min(value, params.max_tokens) if field == "min_tokens" else value})


def check_every_step_path_emits_the_same_tokens_and_drafts(counts, tiny4, method, k, params):
    """Sync, async and the uniform step emit the same tokens and verify the same drafts; only requests the
    step honours take it. Across the examples: uniform steps ran, and batches with a request it refuses."""
    prompts = PROMPTS[: len(params)]
    arms = {
        "sync": _llm(tiny4, method, k, async_scheduling=False, uniform=False),
        "async": _llm(tiny4, method, k, async_scheduling=True, uniform=False),
        "uniform": _llm(tiny4, method, k, async_scheduling=True, uniform=True),
    }
    graphs = arms["uniform"].engine.runner.dispatcher.uniform
    run, taken_by = graphs.run, []

    def run_and_note(key, verified, input_batch, rows):
        taken_by.extend(int(r.state.req_id) for r in verified)
        return run(key, verified, input_batch, rows)

    graphs.run = run_and_note
    results = {name: llm.generate(prompts, params) for name, llm in arms.items()}
    tokens = {name: [o.token_ids for o in outs] for name, outs in results.items()}
    assert tokens["uniform"] == tokens["async"] == tokens["sync"]
    steps = {name: [o.steps for o in outs] for name, outs in results.items()}
    assert steps["uniform"] == steps["async"] == steps["sync"]
    # The eligibility, against the declaration: no request the step cannot honour took it.
    assert all(uniform_step_supports(params[i]) for i in taken_by), [params[i] for i in taken_by]
    counts["uniform steps"] += graphs.graphs.num_eager_steps
    counts["batches with a request it refuses"] += not all(map(uniform_step_supports, params))


test_every_step_path_emits_the_same_tokens_and_drafts, test_every_step_path_emits_the_same_tokens_and_drafts_slow = property_tests(
    check_every_step_path_emits_the_same_tokens_and_drafts, 10, 80,
    variants=("uniform steps", "batches with a request it refuses"),
    method=st.sampled_from(["eagle", "eagle3", "mtp", "dflash"]),
    k=st.sampled_from([1, 3]),
    params=st.lists(sampling_params(), min_size=1, max_size=3),
)  # fmt: skip


def test_the_declaration_names_every_sampling_field():
    """A new SamplingParams field fails here until step_support.py says whether the uniform step honours it."""
    assert set(UNIFORM_STEP_HONOURS) == {f.name for f in dataclasses.fields(SamplingParams)}


def check_a_field_the_step_leaves_out_refuses_it(counts, field, temperature):
    """A field declared left out refuses the step at any other value (top-k and top-p: unless greedy)."""
    values = {"top_k": 3, "top_p": 0.5, "min_tokens": 1, "bad_words": ["x"], "logprobs": 0,
              "bad_words_token_ids": [[7]]}  # fmt: skip
    honours = UNIFORM_STEP_HONOURS[field]
    params = SamplingParams(temperature=temperature, max_tokens=4)
    if honours is Honours.ALWAYS or field not in values:
        return
    counts["refused"] += 1
    changed = dataclasses.replace(params, **{field: values[field]})
    refused = honours is Honours.NEVER or temperature > 0
    assert uniform_step_supports(changed) is not refused
    assert uniform_step_supports(params)


test_a_field_the_step_leaves_out_refuses_it, test_a_field_the_step_leaves_out_refuses_it_slow = property_tests(
    check_a_field_the_step_leaves_out_refuses_it, 20, 100, variants=("refused",),
    field=st.sampled_from(sorted(UNIFORM_STEP_HONOURS)), temperature=st.sampled_from([0.0, 0.8]),
)  # fmt: skip
