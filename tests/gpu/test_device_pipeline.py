"""The device-resident step pipeline on a CUDA device: the counter-based RNG's uniforms are bitwise the
CPU's, under async scheduling the runner launches step n+1 before step n's sampled ids have landed
(the event-order witness), with the tokens of sync scheduling, and the drafters' fixed-shape proposals
replay from their CUDA graphs with the drafts of the eager loop.

Run on a GPU machine with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.model.config import Numerics
from refengine.model.shapes import build_random_model
from refengine.sample import rng
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_uniforms_are_bitwise_equal_on_the_cpu_and_the_gpu():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**62, (64,), generator=generator).tolist() + [2**64 - 1, 0]
    seeds = torch.tensor([rng.row_seed(k, p, rng.STREAM_SAMPLE) for p, k in enumerate(keys)])
    cpu = rng.uniforms(seeds, 151_936)
    gpu = rng.uniforms(seeds.cuda(), 151_936)
    assert torch.equal(cpu, gpu.cpu())
    assert abs(float(cpu.mean()) - 0.5) < 1e-3  # a real stream of draws, not a constant


def _generate(loaded, async_scheduling: bool):
    llm = LLM(loaded, dtype="bfloat16", max_num_seqs=8, max_model_len=512, block_size=16, num_blocks=256,
              async_scheduling=async_scheduling)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(64 + 16 * i)] for i in range(8)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=48, ignore_eos=True) for i in range(8)]
    out = [o.token_ids for o in llm.generate(prompts, params)]
    runner = llm.engine.core.runner
    llm.engine.core.shutdown()
    return out, runner


def test_async_launches_the_next_step_before_the_previous_one_lands():
    """Event-order witness: at most launches of step n+1 the event recorded after step n's sampled-id
    copy has not fired yet (the GPU still runs n), and the tokens equal sync scheduling's."""
    # Real shapes: a qwen3-8b step (about 5 ms) outlasts the host's work for the next launch, which a
    # small model's step need not (then the previous step has landed before the launch, and nothing is
    # witnessed, rightly).
    loaded = build_random_model("qwen3-8b", seed=1, dtype=torch.bfloat16, numerics=Numerics.BATCH_INVARIANT,
                                device="cuda")
    sync, sync_runner = _generate(loaded, async_scheduling=False)
    overlapped, runner = _generate(loaded, async_scheduling=True)
    assert overlapped == sync
    # Sync applies every step's output before launching the next: the witness must read zero there.
    assert sync_runner.num_overlapped_launches == 0
    assert runner.num_in_flight_steps > 40
    print(f"overlapped launches {runner.num_overlapped_launches} of {runner.num_in_flight_steps} in-flight steps")
    assert runner.num_overlapped_launches > runner.num_in_flight_steps // 2


def test_zero_bubble_spec_launches_the_next_step_before_the_previous_one_lands():
    """Invariant 48 (docs/invariants.md) at real shapes: async EAGLE (k = 3, a random head on qwen3-8b)
    launches most spec steps before the previous step's verified ids, accepted counts and drafts have
    landed, waits for none of them, and emits sync's tokens."""
    loaded = build_random_model("qwen3-8b", seed=1, dtype=torch.bfloat16, numerics=Numerics.BATCH_INVARIANT,
                                device="cuda")
    runs = {}
    for on in (False, True):
        llm = LLM(loaded, dtype="bfloat16", max_num_seqs=8, max_model_len=512, block_size=16, num_blocks=256,
                  async_scheduling=on, speculative_config=SpeculativeConfig("eagle", 3))
        prompts = [[(7 * i + j) % 1000 + 3 for j in range(64 + 16 * i)] for i in range(8)]
        params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=48, ignore_eos=True) for i in range(8)]
        runs[on] = ([o.token_ids for o in llm.generate(prompts, params)], llm.engine.core.runner)
        llm.engine.core.shutdown()
    (sync, _), (overlapped, runner) = runs[False], runs[True]
    assert overlapped == sync
    assert runner.num_readback_steps == 0 and runner.num_corrected_launches > 20
    print(f"overlapped launches {runner.num_overlapped_launches} of {runner.num_in_flight_steps} in-flight spec steps")
    assert runner.num_overlapped_launches > runner.num_in_flight_steps // 2


def _drafted(loaded, method: str, drafter_graphs: bool):
    """Tokens and per-step drafts of three greedy requests (a padded batch of four) from an engine with
    CUDA graphs; without `drafter_graphs` its drafter runs eagerly (the target's steps still replay)."""
    llm = LLM(loaded, dtype="float32", max_num_seqs=4, max_model_len=256, block_size=16, num_blocks=64,
              speculative_config=SpeculativeConfig(method, 4), cuda_graphs=True, record_steps=True)
    runner = llm.engine.runner
    runner.dispatcher.uniform = None  # the drafter's own graphs (the one-graph step: test_gpu_paths.py)
    if not drafter_graphs:
        runner.dispatcher.draft_sizes = []  # the dispatcher gives the drafter no graph
    prompts = [[5, 9, 13, 200, 7] * 3, [100, 3, 3, 4], list(range(20, 60))]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    llm.engine.core.shutdown()
    assert runner.num_graph_steps > 0  # the target's steps replayed in both arms
    return [(o.token_ids, o.steps) for o in outs], runner.drafter


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_drafter_graphs_replay_the_eager_drafts(method):
    """Batch-invariant numerics: the drafter's graph replays (its whole step after a uniform verify step,
    pass 1 and the proposal; else EAGLE/EAGLE3/MTP passes 2..k, DFlash's block; padded to a captured batch
    size) propose exactly the drafts of its eager loop."""
    loaded = build_random_model(
        "qwen3-0.6b", seed=1, dtype=torch.float32, numerics=Numerics.BATCH_INVARIANT, device="cuda",
        num_hidden_layers=4, vocab_size=1024, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    eager, eager_drafter = _drafted(loaded, method, drafter_graphs=False)
    graphed, drafter = _drafted(loaded, method, drafter_graphs=True)
    assert eager_drafter.num_graph_steps == 0 and eager_drafter.num_eager_steps > 0
    assert drafter.graphs.steps.num_replays > 0
    assert drafter.num_graph_steps == drafter.graphs.proposals.num_replays + drafter.graphs.steps.num_replays
    print(f"{method}: {drafter.num_graph_steps} graph proposals, {drafter.num_eager_steps} eager")
    assert sum(len(steps) for _, steps in graphed) > 0  # drafts were verified, so there is something to compare
    assert graphed == eager
