"""The device-resident step pipeline on a CUDA device: the counter-based RNG's uniforms are bitwise the
CPU's, and under async scheduling the runner launches step n+1 before step n's sampled ids have landed
(the event-order witness), with the tokens of sync scheduling.

Run on a GPU machine with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.model.config import Numerics
from refengine.model.shapes import build_random_model
from refengine.sample import rng
from refengine.sampling_params import SamplingParams

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
