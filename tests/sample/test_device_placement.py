"""The sampler makes its tensors on its inputs' device, so that a GPU step never mixes devices nor
copies from the host. On a host without a GPU, torch's meta device stands in for one: it runs every
operation on shapes alone, and an operation that mixes a meta tensor with a CPU tensor raises. (The
values on a real GPU are checked by tests/gpu.)"""

import dataclasses

import torch

from refengine.sample import rng
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, rejection_sample
from refengine.sample.sampler import unpack_bitmask

META = torch.device("meta")


def _to_meta(metadata):
    """A copy of built metadata with every tensor on the meta device (the host facts unchanged)."""
    fields = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)}
    return dataclasses.replace(metadata, **{k: v.to(META) for k, v in fields.items() if isinstance(v, torch.Tensor)})


def test_unpack_bitmask_stays_on_the_bitmask_device():
    allowed = unpack_bitmask(torch.zeros(2, 3, dtype=torch.int32, device=META), 70)
    assert allowed.device == META and allowed.shape == (2, 70) and allowed.dtype == torch.bool


def test_uniforms_stay_on_the_seeds_device():
    u = rng.uniforms(torch.zeros(3, dtype=torch.int64, device=META), 5)
    assert u.device == META and u.shape == (3, 5) and u.dtype == torch.float32


def test_a_step_without_drafts_builds_its_indices_on_the_device():
    spec = SpecDecodeMetadata.build([[], []], [0, 1], META)
    assert {spec.draft_token_ids.device, spec.num_draft_tokens.device, spec.target_logits_indices.device} == {META}


def test_random_verification_stays_on_the_logits_device():
    """Two requests with k = 2 and 1 and draft probabilities: rejection sampling proper, every draw and
    index on the device."""
    vocab = 6
    params = [RowParams(1.0, 0, 1.0, 0, (), (), rng_key=key) for key in (1, 1, 1, 2, 2)]
    md = _to_meta(SamplingMetadata.build(params, [4, 5, 6, 9, 10], [[]] * 5, torch.device("cpu")))
    draft_probs = torch.full((2, 2, vocab), 1.0 / vocab)
    spec = _to_meta(SpecDecodeMetadata.build([[1, 2], [3]], [0, 3], torch.device("cpu"), draft_probs))
    out = rejection_sample(torch.zeros(5, vocab, device=META), md, spec)
    assert out.device == META and out.shape == (2, 3)
