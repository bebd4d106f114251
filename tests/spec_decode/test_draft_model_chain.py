"""draft_model's drafts are the draft model's own greedy chain: with every target layer as the
self-draft, the drafter is the target itself, so its k drafts must equal the target's greedy
continuation computed independently (a fresh full forward per token, no paged incremental state)."""

import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.errors import ModelInputError
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_model import LayerStackNetwork
from refengine.spec_decode.proposer import DraftBatch, DraftInput, propose_committed
from refengine.spec_decode.registry import KVLayout, build_proposer

BLOCK_SIZE = 4
LAYOUT = KVLayout(num_blocks=8, block_size=BLOCK_SIZE)
PROMPT = [11, 42, 7, 99, 150, 3, 77, 21, 64, 5]


def _greedy_continuation(target, tokens: list[int], n: int) -> list[int]:
    """The target's next n greedy tokens, each from a fresh forward over the whole sequence."""
    seq = list(tokens)
    for _ in range(n):
        blocks = list(range(-(-len(seq) // BLOCK_SIZE)))
        meta = build_attention_metadata([0], [len(seq)], [blocks], BLOCK_SIZE)
        cache = KVCache.allocate(target.config, len(blocks), BLOCK_SIZE)
        with torch.inference_mode():
            out = target.model(torch.tensor(seq), torch.arange(len(seq)), meta, cache)
            seq.append(int(target.model.compute_logits(out.hidden_states[-1:]).argmax(-1)))
    return seq[len(tokens) :]


def _input(req_id, token_ids, first, last, block_ids, propose=True) -> DraftInput:
    num = last - first + 1
    return DraftInput(req_id, token_ids, first, num, slice(0, num), block_ids, propose)


def _batch(target, *inputs: DraftInput) -> DraftBatch:
    # draft_model reads tokens only; the target's hidden rows are not part of its input.
    return DraftBatch(inputs, torch.zeros(0, target.config.hidden_size), {})


@pytest.mark.parametrize("k", [1, 3])
def test_self_draft_with_all_layers_drafts_the_targets_greedy_chain(tiny4, k):
    # k=1 is the boundary where the just-sampled token (PROMPT[6]) alone must be fed before drafting.
    spec = SpeculativeConfig("draft_model", k, num_draft_layers=tiny4.config.num_hidden_layers)
    drafter = build_proposer(spec, tiny4, LAYOUT)
    drafts = propose_committed(drafter, _batch(tiny4, _input("r", PROMPT[:7], 0, 5, (0, 1, 2))), BLOCK_SIZE)
    expected = _greedy_continuation(tiny4, PROMPT[:7], k)
    assert drafts == {"r": expected}
    assert drafter.num_readbacks == k  # one host read per pass: the sync-only draft model's cost


def test_a_chunk_filling_its_last_block_exactly_is_ingested_alone(tiny4):
    """A prefill chunk that does not propose must write KV for its own rows only: its next prompt
    token has no slot yet (block 0 holds positions 0..3 and there is no second block)."""
    spec = SpeculativeConfig("draft_model", 2, num_draft_layers=tiny4.config.num_hidden_layers)
    drafter = build_proposer(spec, tiny4, LAYOUT)
    chunk = _input("chunk", PROMPT, 0, 3, (0,), propose=False)
    other = _input("other", PROMPT[:7], 0, 5, (1, 2, 3))
    drafts = propose_committed(drafter, _batch(tiny4, chunk, other), BLOCK_SIZE)
    assert drafts == {"other": _greedy_continuation(tiny4, PROMPT[:7], 2)}


@pytest.mark.parametrize("num_layers", [0, 5])
def test_layer_stack_refuses_a_layer_count_outside_the_model(tiny4, num_layers):
    cache = KVCache.allocate(tiny4.config, 2, BLOCK_SIZE)
    with pytest.raises(
        ValueError, match=rf"^draft model: num_draft_layers must be in 1\.\.4, got {num_layers}$"
    ):
        LayerStackNetwork(tiny4.model, num_layers, cache)


def test_layer_stack_refuses_a_kv_cache_of_another_depth(tiny4):
    cache = KVCache.allocate(tiny4.config, 2, BLOCK_SIZE)  # 4 layers of KV
    with pytest.raises(ValueError, match=r"^draft KV cache has 4 layers for 2 draft layers$"):
        LayerStackNetwork(tiny4.model, 2, cache)


def test_chunk_without_a_slot_for_its_rows_is_refused(tiny4):
    # The counterpart of the exact-fit chunk above: rows past the block table are an input error.
    spec = SpeculativeConfig("draft_model", 2, num_draft_layers=2)
    drafter = build_proposer(spec, tiny4, LAYOUT)
    with pytest.raises(ModelInputError, match=r"^5 tokens do not fit in 1 blocks of 4$"):
        propose_committed(drafter, _batch(tiny4, _input("r", PROMPT, 0, 4, (0,), propose=False)), BLOCK_SIZE)
