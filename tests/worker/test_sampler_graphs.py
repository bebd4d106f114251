"""The rejection sampler of a verify step as its CUDA graph runs it, run eagerly on the CPU: filled into
the static buffers and padded, every variant (greedy or seeded; masks, top-k and top-p each on or off;
verification or a synthetic accept rule) samples exactly what the eager sampler samples, and the padded
requests (an earlier, larger step's rows) come out as padding. Capture and replay are checked on a GPU
(tests/gpu)."""

import dataclasses

import numpy as np
import pytest
import torch

from refengine.sample import rng
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, rejection_sample
from refengine.worker.sampler_graphs import VARIANTS, RejectionSamplerGraphs, SamplerGraphKey
from refengine.worker.synthetic_acceptance import SyntheticAcceptance

K = 3
VOCAB = 40  # more than one 32-bit bitmask word


def _step(
    num_seqs: int, temperature: float, seed: int, *, masked=(), top_k=0, top_p=1.0, bitmask_rows=()
) -> tuple[torch.Tensor, SamplingMetadata, SpecDecodeMetadata]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_seqs * (K + 1), VOCAB, generator=g)
    # Drafts that the target's argmax accepts in part: the first one each request's own greedy token.
    greedy = logits.argmax(dim=-1).view(num_seqs, K + 1)
    drafts = [[int(greedy[r, 0]), int(greedy[r, 1]) if r % 2 else 5, 7] for r in range(num_seqs)]
    rows = num_seqs * (K + 1)
    # Grammar rows allow the even tokens only, which the unmasked argmax often is not.
    bitmask = np.full((len(bitmask_rows), (VOCAB + 31) // 32), 0x55555555, dtype=np.uint32).view(np.int32)
    md = SamplingMetadata.from_arrays(
        temperature=np.array([0.0 if r // (K + 1) % 2 else temperature for r in range(rows)], dtype=np.float32),
        top_p=np.full(rows, top_p, dtype=np.float32),
        top_k=np.full(rows, top_k, dtype=np.int64),
        key_words=np.array([rng.key_word(100 + r // (K + 1)) for r in range(rows)], dtype=np.int64),
        positions=np.array([20 + r % (K + 1) for r in range(rows)], dtype=np.int64),
        masked=list(masked),
        device=torch.device("cpu"),
        bitmask_rows=list(bitmask_rows),
        token_bitmask=bitmask,
    )
    spec = SpecDecodeMetadata.build(drafts, [r * (K + 1) for r in range(num_seqs)], torch.device("cpu"))
    return logits, md, spec


def _key(graphs: RejectionSamplerGraphs, md: SamplingMetadata, spec: SpecDecodeMetadata) -> SamplerGraphKey:
    """The variant the dispatcher (worker/step_plan.py) picks from the rows' host facts, as `md` has them."""
    greedy = md.all_greedy
    masked = bool(md.num_masked or md.num_bitmask_rows)
    padded = min(b for b in graphs.batch_sizes if b >= spec.draft_token_ids.shape[0])
    return SamplerGraphKey(padded, greedy, masked, md.any_top_k and not greedy, md.any_top_p and not greedy)


def _filled(graphs: RejectionSamplerGraphs, logits, md, spec) -> torch.Tensor:
    """The step as its graph replays it, after an earlier, larger step left its rows in the buffers."""
    bigger = _step(4, 0.9, seed=1, masked=[(0, 3), (5, 1)], top_k=2, top_p=0.5, bitmask_rows=[1, 2])
    graphs.fill(bigger[0], bigger[1], bigger[2].draft_token_ids, _key(graphs, bigger[1], bigger[2]))
    key = _key(graphs, md, spec)
    graphs.fill(logits, md, spec.draft_token_ids, key)
    return graphs.step(key)


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "seeded"])
def test_the_filled_step_samples_as_the_eager_sampler_and_pads_with_nothing(temperature):
    graphs = RejectionSamplerGraphs(VOCAB, K, [2, 4], torch.device("cpu"))
    logits, md, spec = _step(3, temperature, seed=2)
    assert _key(graphs, md, spec) == SamplerGraphKey(4, temperature == 0.0, False, False, False)
    tokens = _filled(graphs, logits, md, spec)
    assert torch.equal(tokens[:3], rejection_sample(logits, md, spec))
    assert (tokens[:3, 1:] >= 0).any()  # some draft was accepted: the comparison covers acceptance
    assert tokens[3].tolist() == [0] + [-1] * K  # zero logits, greedy, every draft -1: token 0 alone
    # Nothing is captured on the CPU: a step runs the graph's step eagerly on the buffers.
    assert torch.equal(graphs.run(_key(graphs, md, spec), logits, md, spec, None), tokens[:3])
    assert graphs.graphs.stats.num_eager_steps == 1 and graphs.graphs.stats.num_replays == 0


# Each variant's step: (row, token) masks on draft rows and a bonus row (on their argmax, so that they
# bite), grammar rows, top-k, top-p.
ARGMAX_ROWS = (0, 1, 3, 5, 8)
VARIANT_STEPS = {
    "masked pairs": dict(masked=ARGMAX_ROWS),
    "grammar rows": dict(bitmask_rows=[0, 1, 4, 6]),
    "top-k": dict(top_k=3),
    "top-p": dict(top_p=0.2),
    "everything": dict(masked=(2, 4), bitmask_rows=[1, 5], top_k=5, top_p=0.8),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
@pytest.mark.parametrize("variant", VARIANT_STEPS, ids=list(VARIANT_STEPS))
def test_every_variant_samples_as_the_eager_sampler(variant, temperature):
    graphs = RejectionSamplerGraphs(VOCAB, K, [2, 4], torch.device("cpu"))
    step = dict(VARIANT_STEPS[variant])
    argmax = _step(3, temperature, seed=5)[0].argmax(dim=1)
    step["masked"] = [(r, int(argmax[r])) for r in step.get("masked", ())]
    logits, md, spec = _step(3, temperature, seed=5, **step)
    key = _key(graphs, md, spec)
    assert (key.greedy, key.masked) == (temperature == 0.0, bool(md.num_masked or md.num_bitmask_rows))
    assert (key.top_k, key.top_p) == ((md.any_top_k, md.any_top_p) if temperature else (False, False))
    assert (key.greedy, key.masked, key.top_k, key.top_p) in VARIANTS  # a captured variant
    eager = rejection_sample(logits, md, spec)
    assert torch.equal(_filled(graphs, logits, md, spec)[:3], eager)
    # The variant changed what is sampled, so the comparison covers it (top-k and top-p only where a row
    # samples).
    if key.masked or temperature:
        assert not torch.equal(eager, rejection_sample(logits, _unconstrained(md), spec))


def _unconstrained(md: SamplingMetadata) -> SamplingMetadata:
    none = torch.zeros(0, dtype=torch.int64)
    return dataclasses.replace(
        md, top_k=torch.zeros_like(md.top_k), top_p=torch.ones_like(md.top_p), masked_rows=none,
        masked_token_ids=none, bitmask_rows=none, any_top_k=False, any_top_p=False, num_masked=0, num_bitmask_rows=0,
    )


def test_a_synthetic_accept_rule_is_the_graphs_as_the_runners():
    rule = SyntheticAcceptance(0.6)
    graphs = RejectionSamplerGraphs(VOCAB, K, [4], torch.device("cpu"), accept_rule=rule)
    logits, md, spec = _step(3, 0.0, seed=7)
    first = spec.target_logits_indices[:, 0]
    accept = lambda d, t: rule(d, t, key_words=md.key_words[first], first_positions=md.positions[first])  # noqa: E731
    synthetic = rejection_sample(logits, md, spec, accept)
    assert torch.equal(_filled(graphs, logits, md, spec)[:3], synthetic)
    assert not torch.equal(synthetic, rejection_sample(logits, md, spec))  # the rule accepted otherwise


def test_exact_device_positions_hash_the_seeds_the_eager_path_hashes():
    """Under async speculative decoding the rows' exact positions come from the device: the graph hashes
    their seeds inside, as the eager path's at_positions does, instead of the host's optimistic ones."""
    graphs = RejectionSamplerGraphs(VOCAB, K, [4], torch.device("cpu"))
    logits, md, spec = _step(3, 1.0, seed=9)
    exact = md.positions - 2  # two drafts of the previous step were rejected
    key = _key(graphs, md, spec)
    graphs.fill(logits, md, spec.draft_token_ids, key, positions=exact)
    moved = rejection_sample(logits, md.at_positions(exact), spec)
    assert torch.equal(graphs.step(key)[:3], moved)
    assert not torch.equal(moved, rejection_sample(logits, md, spec))  # the positions decide the draws
