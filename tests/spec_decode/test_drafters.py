"""Proposer loops called directly: fewer drafts where the block table or the position table ends (a
lossless shortfall), nothing for a prefill chunk, and the context continuity check."""

import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.context import ContextLengths
from refengine.spec_decode.proposer import DraftBatch, DraftContextError, DraftInput, propose_committed
from refengine.spec_decode.registry import KVLayout, build_proposer

BLOCK_SIZE = 4
TOKENS = [11, 42, 7, 99, 150, 3, 77, 21, 64, 5]
SPECS = {
    "draft_model": SpeculativeConfig("draft_model", 3, num_draft_layers=2),
    "eagle": SpeculativeConfig("eagle", 3),
    "eagle3": SpeculativeConfig("eagle3", 3),
    "mtp": SpeculativeConfig("mtp", 3),
    "dflash": SpeculativeConfig("dflash", 3),
}


def _batch(
    target, drafter, first: int, last: int, block_ids: tuple[int, ...], propose: bool = True
) -> DraftBatch:
    """The target's rows for positions first..last of TOKENS, fed as one step of request "r"."""
    num = last - first + 1
    meta = build_attention_metadata([0], [last + 1], [list(block_ids)], BLOCK_SIZE)
    cache = KVCache.allocate(target.config, 8, BLOCK_SIZE)
    with torch.inference_mode():
        out = target.model(
            torch.tensor(TOKENS[: last + 1]),
            torch.arange(last + 1),
            meta,
            cache,
            capture_layers=drafter.capture_layers,
        )
    rows = slice(first, first + num)
    d = DraftInput("r", TOKENS[: last + 2], first, num, slice(0, num), block_ids, propose)
    return DraftBatch((d,), out.hidden_states[rows], {i: t[rows] for i, t in out.aux_hidden_states.items()})


# Blocks (0, 1) hold positions 0..7. Draft s of eagle/mtp comes from a row at last + s - 1, of
# draft_model from a row at last + s; DFlash's block needs last + 1 .. last + 1 + n.
ROOM = {"draft_model": (2, 0), "eagle": (3, 1), "eagle3": (3, 1), "mtp": (3, 1), "dflash": (1, 0)}


@pytest.mark.parametrize("method", list(SPECS))
def test_fewer_drafts_where_the_blocks_end(tiny4, method):
    for last, expected in zip((5, 7), ROOM[method], strict=True):
        drafter = build_proposer(SPECS[method], tiny4, KVLayout(8, BLOCK_SIZE))
        drafts = propose_committed(drafter, _batch(tiny4, drafter, 0, last, (0, 1)), BLOCK_SIZE)
        assert len(drafts["r"]) == expected
        assert all(0 <= t < tiny4.config.vocab_size for t in drafts["r"])
        # With room to spare, always k.
        drafter.remove(["r"])
        assert len(propose_committed(drafter, _batch(tiny4, drafter, 0, last, (0, 1, 2)), BLOCK_SIZE)["r"]) == 3


@pytest.mark.parametrize("method", list(SPECS))
def test_prefill_chunk_is_ingested_without_drafting(tiny4, method):
    drafter = build_proposer(SPECS[method], tiny4, KVLayout(8, BLOCK_SIZE))
    assert propose_committed(drafter, _batch(tiny4, drafter, 0, 3, (0, 1, 2), propose=False), BLOCK_SIZE) == {}
    # The next chunk continues at position 4; a batch starting anywhere else is refused.
    assert len(propose_committed(drafter, _batch(tiny4, drafter, 4, 6, (0, 1, 2)), BLOCK_SIZE)["r"]) == 3
    with pytest.raises(DraftContextError, match="context position discontinuity"):
        propose_committed(drafter, _batch(tiny4, drafter, 8, 8, (0, 1, 2)), BLOCK_SIZE)


def test_context_lengths_are_per_request():
    lengths = ContextLengths("dflash")
    lengths.advance("a", 0, 5)
    lengths.advance("b", 0, 2)
    lengths.advance("a", 5, 2)
    with pytest.raises(
        DraftContextError, match=r"request 'b': context position discontinuity .* 0\.\.1, .* start at 7"
    ):
        lengths.advance("b", 7, 1)
    lengths.remove(["a"])
    lengths.advance("a", 0, 3)  # a preempted request starts again from position 0
