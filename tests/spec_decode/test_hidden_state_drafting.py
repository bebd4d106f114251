"""The hidden-state drafter loop (EAGLE, EAGLE3, MTP) and DFlash's block drafter, called directly on
the target's real rows: chunked ingestion equals one-shot ingestion, the head's position limit caps
the drafts exactly, errors name the method, and a multi-layer feature input is concatenated per row."""

import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.hidden_state_proposer import HiddenStateProposer
from refengine.spec_decode.proposer import DraftBatch, DraftContextError, DraftInput, propose_committed
from refengine.spec_decode.registry import KVLayout, build_network, build_proposer

BLOCK_SIZE = 4
LAYOUT = KVLayout(num_blocks=8, block_size=BLOCK_SIZE)
PROMPT = [11, 42, 7, 99, 150, 3, 77, 21, 64, 5]
BLOCKS = (0, 1, 2)


def _target_rows(target, capture_layers, upto: int):
    """The target's final hidden rows and captured layer outputs for PROMPT[:upto] (one forward)."""
    meta = build_attention_metadata([0], [upto], [list(BLOCKS)], BLOCK_SIZE)
    cache = KVCache.allocate(target.config, 8, BLOCK_SIZE)
    with torch.inference_mode():
        return target.model(
            torch.tensor(PROMPT[:upto]), torch.arange(upto), meta, cache, capture_layers=capture_layers
        )


def _step(out, req_id, token_ids, first, last, propose=True) -> DraftBatch:
    """Rows first..last of `out` as one step of request `req_id`."""
    rows = slice(first, last + 1)
    d = DraftInput(req_id, token_ids, first, last - first + 1, slice(0, last - first + 1), BLOCKS, propose)
    return DraftBatch((d,), out.hidden_states[rows], {i: t[rows] for i, t in out.aux_hidden_states.items()})


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_chunked_prefill_with_the_whole_prompt_visible_drafts_as_one_shot(tiny4, method):
    """In the engine a prefill chunk's token_ids hold the whole prompt, past the chunk: the head must
    read exactly one next token per fed row, or the chunk's rows shift against their hidden states."""
    spec = SpeculativeConfig(method, 3)
    one_shot = build_proposer(spec, tiny4, LAYOUT)
    out = _target_rows(tiny4, one_shot.capture_layers, 8)
    expected = propose_committed(one_shot, _step(out, "r", PROMPT[:9], 0, 7), BLOCK_SIZE)
    chunked = build_proposer(spec, tiny4, LAYOUT)
    assert propose_committed(chunked, _step(out, "r", PROMPT, 0, 3, propose=False), BLOCK_SIZE) == {}
    assert propose_committed(chunked, _step(out, "r", PROMPT[:9], 4, 7), BLOCK_SIZE) == expected
    assert len(expected["r"]) == 3


@pytest.mark.parametrize(("max_positions", "expected"), [(5, 0), (6, 1), (7, 2), (8, 3)])
def test_head_position_limit_caps_the_drafts(tiny4, max_positions, expected):
    """Draft s comes from a row at last_position + s - 1; with last_position 5 a head whose position
    table ends at max_positions fits max_positions - 5 drafts (never fewer than 0, at most k=3)."""
    head = build_network(SpeculativeConfig("eagle", 3), tiny4, LAYOUT)
    drafter = HiddenStateProposer(head, "eagle", 3, BLOCK_SIZE, max_positions, random_init=True)
    out = _target_rows(tiny4, drafter.capture_layers, 6)
    drafts = propose_committed(drafter, _step(out, "r", PROMPT[:7], 0, 5), BLOCK_SIZE)
    assert list(drafts) == ["r"] and len(drafts["r"]) == expected


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_context_error_names_the_method(tiny4, method):
    drafter = build_proposer(SpeculativeConfig(method, 2), tiny4, LAYOUT)
    out = _target_rows(tiny4, drafter.capture_layers, 6)
    with pytest.raises(DraftContextError, match=rf"^{method} drafter, request 'r': context position"):
        propose_committed(drafter, _step(out, "r", PROMPT[:7], 2, 5), BLOCK_SIZE)


def test_dflash_with_two_target_layers_concatenates_their_features_per_row(tiny4):
    """With two target layers the fc input is [T, 2H]: the layers' rows side by side. The drafts of a
    request must not depend on which other request shares its batch (each row keeps its features)."""
    spec = SpeculativeConfig("dflash", 3, target_layer_ids=(1, 2))
    alone = build_proposer(spec, tiny4, LAYOUT)
    assert alone.capture_layers == (1, 2)
    out = _target_rows(tiny4, alone.capture_layers, 6)
    expected = propose_committed(alone, _step(out, "r", PROMPT[:7], 0, 5), BLOCK_SIZE)
    assert len(expected["r"]) == 3
    # The same request batched after another one, whose rows are a 4-row prefix of the same prompt.
    shared = build_proposer(spec, tiny4, LAYOUT)
    rows = torch.cat([out.hidden_states[:4], out.hidden_states])
    aux = {i: torch.cat([t[:4], t]) for i, t in out.aux_hidden_states.items()}
    batch = DraftBatch(
        (
            DraftInput("s", PROMPT[:5], 0, 4, slice(0, 4), (3, 4), True),
            DraftInput("r", PROMPT[:7], 0, 6, slice(4, 10), BLOCKS, True),
        ),
        rows,
        aux,
    )
    drafts = propose_committed(shared, batch, BLOCK_SIZE)
    assert drafts["r"] == expected["r"] and len(drafts["s"]) == 3


@pytest.mark.parametrize("method", ["eagle", "dflash"])
def test_drafts_for_the_wrong_number_of_requests_are_refused(tiny4, method):
    """Invariant 30 (docs/invariants.md): the host takes one row of drafts per proposing request, or refuses them all."""
    drafter = build_proposer(SpeculativeConfig(method, 2), tiny4, LAYOUT)
    requests = _step(_target_rows(tiny4, drafter.capture_layers, 6), "r", PROMPT[:7], 0, 5).requests
    with pytest.raises(DraftContextError, match=rf"^{method} drafter: 2 rows of drafts for 1 proposing requests"):
        drafter.commit(requests, [[1, 2], [3, 4]])
