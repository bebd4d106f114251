"""The rejection sampler of a verify step as its CUDA graph runs it, run eagerly on the CPU: filled into
the static buffers and padded, greedy and seeded rows sample exactly what the eager sampler samples,
and the padded requests (an earlier, larger step's rows) come out as padding. Capture and replay are
checked on a GPU (tests/gpu)."""

import dataclasses

import numpy as np
import pytest
import torch

from refengine.sample import rng
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, rejection_sample
from refengine.worker.sampler_graphs import RejectionSamplerGraphs

K = 3
VOCAB = 17


def _step(num_seqs: int, temperature: float, seed: int) -> tuple[torch.Tensor, SamplingMetadata, SpecDecodeMetadata]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_seqs * (K + 1), VOCAB, generator=g)
    # Drafts that the target's argmax accepts in part: the first one each request's own greedy token.
    greedy = logits.argmax(dim=-1).view(num_seqs, K + 1)
    drafts = [[int(greedy[r, 0]), int(greedy[r, 1]) if r % 2 else 5, 7] for r in range(num_seqs)]
    rows = num_seqs * (K + 1)
    md = SamplingMetadata.from_arrays(
        temperature=np.array([0.0 if r // (K + 1) % 2 else temperature for r in range(rows)], dtype=np.float32),
        top_p=np.ones(rows, dtype=np.float32),
        top_k=np.zeros(rows, dtype=np.int64),
        key_words=np.array([rng.key_word(100 + r // (K + 1)) for r in range(rows)], dtype=np.int64),
        positions=np.array([20 + r % (K + 1) for r in range(rows)], dtype=np.int64),
        masked=[],
        device=torch.device("cpu"),
    )
    spec = SpecDecodeMetadata.build(drafts, [r * (K + 1) for r in range(num_seqs)], torch.device("cpu"))
    return logits, md, spec


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "seeded"])
def test_the_filled_step_samples_as_the_eager_sampler_and_pads_with_nothing(temperature):
    graphs = RejectionSamplerGraphs(VOCAB, K, [2, 4], torch.device("cpu"))
    graphs.fill(*_step(4, 0.9, seed=1), padded=4)  # an earlier, larger step
    logits, md, spec = _step(3, temperature, seed=2)
    key = graphs.key(logits, md, spec)
    assert key == (4, temperature == 0.0)
    graphs.fill(logits, md, spec, padded=4)
    tokens = graphs.step(*key)
    assert torch.equal(tokens[:3], rejection_sample(logits, md, spec))
    assert (tokens[:3, 1:] >= 0).any()  # some draft was accepted: the comparison covers acceptance
    assert tokens[3].tolist() == [0] + [-1] * K  # zero logits, greedy, every draft -1: token 0 alone
    # Nothing is captured on the CPU: a step asks for a replay and samples eagerly.
    assert graphs.run(logits, md, spec) is None


def test_masked_or_top_k_steps_are_left_to_the_eager_sampler():
    graphs = RejectionSamplerGraphs(VOCAB, K, [4], torch.device("cpu"))
    logits, md, spec = _step(2, 0.9, seed=3)
    assert graphs.key(logits, md, spec) == (4, False)
    for changed in ({"num_masked": 1}, {"any_top_k": True}, {"any_top_p": True}, {"num_bitmask_rows": 1}):
        assert graphs.key(logits, dataclasses.replace(md, **changed), spec) is None
    assert graphs.key(logits[:4], md, spec) is None  # not k + 1 rows per request
