"""The rest of a uniform verify step as one graph (worker/spec_step_graphs.py), run eagerly on the CPU
through the real engine: verification, the drafter's step and the frame's columns from the target's
outputs, with nothing between them on the host. Async generation with it equals sync generation without
it token for token, greedy and seeded, for every device drafter; steps it cannot take (top-k, top-p,
logprobs, bad words) go the general way in the same run. Capture and replay run on a GPU (tests/gpu)."""

import dataclasses

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.transformer import ModelOutput
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.worker.device_inputs import CompletedInputs
from refengine.worker.sampler_graphs import RejectionSamplerGraphs
from refengine.worker.spec_step_graphs import SampledStep, SpecStepGraphs
from refengine.worker.step_frame import FrameColumns
from refengine.worker.step_plan import Dispatcher
from refengine.worker.target_step import TargetStep
from tests.worker.test_zero_bubble import PROMPTS

K = 3
CPU = torch.device("cpu")


def _llm(tiny4, method: str, async_scheduling: bool, spec_step: bool) -> LLM:
    llm = LLM(
        tiny4,
        num_blocks=96,
        block_size=4,
        max_model_len=64,
        max_num_seqs=4,
        speculative_config=SpeculativeConfig(method, K),
        async_scheduling=async_scheduling,
    )
    if spec_step:
        runner = llm.engine.runner
        sizes = [1, 2, 3, 4]
        target = runner.model
        drafter = DraftGraphs(
            runner.drafter.device_drafter,
            (target.config.hidden_size, target.embed_tokens.weight.dtype),
            runner.input_batch.block_table.table.shape[1],
            sizes,
            CPU,
        )
        sampler = RejectionSamplerGraphs(target.config.vocab_size, K, sizes, CPU, runner.accept)
        uniform = SpecStepGraphs(sampler, drafter, CPU)
        runner.dispatcher = Dispatcher(K, runner.input_batch, None, None, uniform, None, runner.drafter.capture_layers)
    return llm


def _params(i: int, **extra) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0 if i % 2 else 0.8, "seed": i, "max_tokens": 14 + i, "ignore_eos": True, **extra})


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_async_steps_through_the_one_graph_equal_sync_steps_without_it(tiny4, method):
    params = [_params(i) for i in range(4)]
    sync = _llm(tiny4, method, async_scheduling=False, spec_step=False)
    expected = [o.token_ids for o in sync.generate(PROMPTS, params)]
    llm = _llm(tiny4, method, async_scheduling=True, spec_step=True)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
    runner, stats = llm.engine.runner, llm.engine.core.scheduler.spec_decoding_stats
    # The path ran, on steps that rejected drafts (random heads) and were moved back for it.
    assert runner.dispatcher.uniform.graphs.num_eager_steps > 10
    assert runner.num_readback_steps == 0 and runner.num_corrected_launches > 10
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_all_greedy_steps_take_it_and_top_k_or_logprobs_steps_go_the_general_way(tiny4):
    """Greedy alone is its own variant; a top-k row makes a step one no graph holds; logprobs make every
    step read back, and bad words judge drafts on the host. Request 0, the one with them, outlives the
    others, so it is in every step: all equal sync generation, and only the greedy run took the graph."""
    sync = _llm(tiny4, "eagle", async_scheduling=False, spec_step=False)
    longest = {"max_tokens": 24}
    cases = {
        "greedy": [SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)] * 4,
        "top_k": [_params(0, top_k=5, **longest)] + [_params(i) for i in range(1, 4)],
        "logprobs": [_params(0, logprobs=2, **longest)] + [_params(i) for i in range(1, 4)],
        "bad_words": [_params(0, bad_words_token_ids=[[7, 8]], **longest)] + [_params(i) for i in range(1, 4)],
    }
    taken = {}
    for name, params in cases.items():
        llm = _llm(tiny4, "eagle", async_scheduling=True, spec_step=True)
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in sync.generate(PROMPTS, params)]
        taken[name] = llm.engine.runner.dispatcher.uniform.graphs.num_eager_steps
    assert taken["greedy"] > 10 and taken["top_k"] == taken["logprobs"] == taken["bad_words"] == 0


def _as_padded_graph_rows(rows: TargetStep, padded: int) -> TargetStep:
    """A step's target outputs as the target's graph of `padded` requests lays them out (target_graphs.py):
    behind the step's rows, padding rows at position 0 that write no KV (slot -1), in sequences of length 0
    without blocks, whose logits are row 0's (the padding logits index) and whose id is any valid one."""
    done = rows.inputs
    n = done.positions.shape[0]
    extra = padded * (K + 1) - n
    meta, out = done.attn_metadata, rows.model_output
    b, width = meta.seq_lens.shape[0], meta.block_tables.shape[1]

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([t, t.new_full((extra, *t.shape[1:]), value)])

    meta = AttentionMetadata(
        meta.query_start_loc,
        torch.cat([meta.seq_lens, meta.seq_lens.new_zeros(padded - b)]),
        torch.cat([meta.block_tables, meta.block_tables.new_zeros(padded - b, width)]),
        pad(meta.slot_mapping, -1),
        causal=True,
    )
    return TargetStep(
        ModelOutput(pad(out.hidden_states, 0.0), {i: pad(t, 0.0) for i, t in out.aux_hidden_states.items()}),
        torch.cat([rows.logits, rows.logits[:1].expand(extra, -1)]),
        CompletedInputs(None, pad(done.positions, 0), meta, pad(done.gathered, int(done.gathered[0]))),
        None,
    )


def test_a_padded_step_gives_its_requests_what_the_unpadded_one_gives_and_the_padding_no_drafts(tiny4):
    """What a GPU replays for 2 requests in the graph of 4: the step of the same rows behind the target's
    padding verifies and drafts the 2 as the unpadded step does (batch-invariant numerics), proposes
    nothing for the padding, and lays out the frame's source with the drafts after all 4 rows."""
    llm = _llm(tiny4, "eagle3", async_scheduling=True, spec_step=True)
    graphs = llm.engine.runner.dispatcher.uniform
    run, compared = graphs.run, []

    def run_and_pad(key, verified, input_batch, rows):
        out = run(key, verified, input_batch, rows)
        if len(verified) == 2 and not compared:
            frame = FrameColumns(*(t.clone() for t in (out.frame.results, out.frame.source, out.frame.num_rejected)))
            out = SampledStep(out.tokens.clone(), out.proposed.clone(), frame)
            padded = dataclasses.replace(key, padded=4)
            compared.append((out, run(padded, verified, input_batch, _as_padded_graph_rows(rows, 4))))
        return out

    graphs.run = run_and_pad
    llm.generate(PROMPTS[:2], [_params(i) for i in range(2)])
    (alone, padded), = compared
    assert torch.equal(padded.tokens[:2], alone.tokens) and torch.equal(padded.proposed[:2], alone.proposed)
    assert torch.equal(padded.frame.results[:2], alone.frame.results)
    assert torch.equal(padded.frame.num_rejected[:2], alone.frame.num_rejected)
    assert (padded.proposed[2:] == -1).all()
    # Each row's last valid token, then the drafts of all 4 rows: the next step reads request i's j-th
    # draft at P + i * k + j.
    assert torch.equal(padded.frame.source[:2], alone.frame.source[:2])
    assert torch.equal(padded.frame.source[4 : 4 + 2 * K], alone.frame.source[2:])
