"""The fixed-shape proposals that a CUDA graph captures per padded batch size (EAGLE/EAGLE3/MTP passes
2..k, DFlash's query block), run eagerly on the CPU: the device-side metadata every pass builds equals
the host builder's, padded and sat-out rows write no KV, and each pass writes its KV one position
further on. The replay itself is checked on a GPU (tests/gpu/test_device_pipeline.py); here a CPU
stand-in takes the graph path, so the proposals' host inputs must survive the graph's padding."""


import dataclasses

import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata, uniform_query_metadata
from refengine.model.config import Numerics
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import (
    DraftBatch,
    DraftGraph,
    DraftInput,
    ProposalInputs,
    propose_committed,
)
from refengine.spec_decode.registry import KVLayout, build_proposer

BLOCK_SIZE = 4
TOKENS = [11, 42, 7, 99, 150, 3, 77, 21, 64, 5]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_query", [1, 3])
def test_device_metadata_equals_the_host_builder_and_pads_with_nothing(num_query, causal):
    """Three real sequences (blocks in any order, a start at a block boundary, one mid-block) equal
    build_attention_metadata's tensors exactly; a padded sequence attends over nothing and writes no
    KV, and a non-causal sequence with fewer real tokens than the query writes none for the rest."""
    starts = [5, 0, 12]
    blocks = [[3, 1], [2], [0, 4, 6, 7, 5]]
    host = build_attention_metadata(starts, [num_query] * 3, blocks, BLOCK_SIZE, causal=causal)
    width = host.block_tables.shape[1]
    tables = torch.cat([host.block_tables, torch.tensor([[9] * width, [3, 1] + [-1] * (width - 2)])])
    # The last sequence at 5..: all real under causal attention (its rows must be its last positions),
    # only its first token real without (a DFlash block ending in rows past its real ones).
    last_real = num_query if causal else 1
    num_valid = torch.tensor([num_query] * 3 + [0, last_real])
    meta, positions = uniform_query_metadata(
        torch.tensor(starts + [0, 5]), num_valid, tables, BLOCK_SIZE, num_query, causal
    )
    real = 3 * num_query
    assert torch.equal(meta.query_start_loc[:4], host.query_start_loc)
    assert torch.equal(meta.seq_lens[:3], host.seq_lens)
    assert torch.equal(meta.slot_mapping[:real], host.slot_mapping)
    assert torch.equal(meta.block_tables[:3], host.block_tables)
    assert meta.causal is causal
    assert positions[:real].tolist() == [s + j for s in starts for j in range(num_query)]
    # The padded sequence: its rows still exist (the shape is fixed) but touch nothing.
    assert meta.query_start_loc[4:].tolist() == [4 * num_query, 5 * num_query]
    assert meta.seq_lens[3].item() == 0
    assert meta.slot_mapping[real : real + num_query].tolist() == [-1] * num_query
    assert positions[real : real + num_query].tolist() == [0] * num_query
    # Its real tokens sit at 5, 6, 7 (block 1 of its table, offsets 1..3): slots 5, 6, 7; its keys end there.
    pad = num_query - last_real
    assert meta.seq_lens[4].item() == 5 + last_real
    assert meta.slot_mapping[real + num_query :].tolist() == [5 + j for j in range(last_real)] + [-1] * pad
    assert positions[real + num_query :].tolist() == [5 + j for j in range(last_real)] + [0] * pad

def _batch(target, drafter, requests) -> DraftBatch:
    """One step of each (req_id, last, block_ids): positions 0..last of TOKENS, fed from position 0."""
    lasts = [last for _, last, _ in requests]
    meta = build_attention_metadata([0] * len(requests), [n + 1 for n in lasts], [list(b) for _, _, b in requests], BLOCK_SIZE)
    cache = KVCache.allocate(target.config, 16, BLOCK_SIZE)
    ids = torch.tensor([t for n in lasts for t in TOKENS[: n + 1]])
    with torch.inference_mode():
        out = target.model(
            ids, torch.tensor([p for n in lasts for p in range(n + 1)]), meta, cache, capture_layers=drafter.capture_layers
        )
    inputs, first = [], 0
    for req_id, last, block_ids in requests:
        inputs.append(DraftInput(req_id, TOKENS[: last + 2], 0, last + 1, slice(first, first + last + 1), block_ids, True))
        first += last + 1
    return DraftBatch(tuple(inputs), out.hidden_states, out.aux_hidden_states)


def _head_keys(drafter, blocks) -> torch.Tensor:
    """The head's first-layer keys at the positions `blocks` hold, in position order."""
    return drafter.network.kv_cache.layers[0].key[list(blocks)].flatten(0, 1)


def _propose(target, method, requests):
    drafter = build_proposer(SpeculativeConfig(method, 3), target, KVLayout(16, BLOCK_SIZE))
    with torch.inference_mode():
        drafts = propose_committed(drafter, _batch(target, drafter, requests), BLOCK_SIZE)
    return drafter, drafts


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_each_pass_writes_its_kv_one_position_further(tiny4, method):
    """Pass 1 writes positions 0..5; passes 2 and 3 write 6 and 7 (draft s from the row at last + s - 1),
    and nothing lands at 8."""
    drafter, drafts = _propose(tiny4, method, [("r", 5, (0, 1, 2))])
    assert len(drafts["r"]) == 3
    written = _head_keys(drafter, (0, 1, 2)).abs().sum(dim=(1, 2)) > 0
    assert written.tolist() == [True] * 8 + [False] * 4
    assert drafter.num_eager_steps == 1 and drafter.num_graph_steps == 0


@pytest.mark.parametrize("method", ["eagle", "mtp", "dflash"])
def test_a_request_that_wants_fewer_drafts_writes_no_kv_for_them(tiny4, method):
    """Request "b" ends at its blocks' last slot, so it sits out the passes (or block rows) a full request
    needs: they must write nothing, or they would land in its committed KV. Its committed keys equal those
    of the same request with a block to spare, and its neighbour's drafts do not change."""
    full = ("a", 5, (0, 1, 2))
    last = 5 if method == "dflash" else 7  # one draft: DFlash's block needs last + 1 .. last + 2
    short, short_drafts = _propose(tiny4, method, [full, ("b", last, (3, 4))])
    roomy, roomy_drafts = _propose(tiny4, method, [full, ("b", last, (3, 4, 5))])
    assert len(short_drafts["b"]) == 1 and len(roomy_drafts["b"]) == 3
    assert short_drafts["a"] == roomy_drafts["a"]
    assert short_drafts["b"] == roomy_drafts["b"][:1]
    assert torch.equal(_head_keys(short, (3, 4))[: last + 1], _head_keys(roomy, (3, 4))[: last + 1])


@pytest.mark.parametrize("numerics", [Numerics.BATCH_INVARIANT, Numerics.FAST])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_padded_rows_write_no_kv_and_leave_the_real_drafts_alone(tiny4, method, numerics):
    """The proposal a CUDA graph captures, run on the CPU on the graph's padded buffers (draft_graphs.py):
    the padded rows' table points at block 0, which must stay empty, and the real row drafts what it
    drafts alone, under both attentions (fast: padded sequences join no SDPA group and come out zero)."""
    drafter = build_proposer(SpeculativeConfig(method, 3), tiny4, KVLayout(16, BLOCK_SIZE))
    for module in drafter.network.modules():
        if hasattr(module, "numerics"):
            module.numerics = numerics
    hidden = None
    if drafter.reads_hidden:
        hidden = torch.randn(1, tiny4.config.hidden_size, generator=torch.Generator().manual_seed(0))
    # Positions 6.. of a request holding blocks 1, 2, 3: nothing of it lives in block 0.
    real = ProposalInputs(torch.tensor([42]), torch.tensor([6]), torch.tensor([3]), torch.tensor([[1, 2, 3]]), hidden)
    graphs = DraftGraphs(drafter, (tiny4.config.hidden_size, torch.float32), 5, [4], torch.device("cpu"))
    with torch.inference_mode():
        alone = drafter.draft(real)
        padded = graphs.run_proposal(real, 4)
    assert graphs.proposals.stats.num_eager_steps == 1  # the graph's step on its 4 padded rows
    assert torch.equal(padded, alone)
    assert not any(layer.key[0].any() or layer.value[0].any() for layer in drafter.network.kv_cache.layers)
    # The real row did write: positions 6 and 7 sit in its second block, block 2.
    assert all(layer.key[2].any() for layer in drafter.network.kv_cache.layers)



@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_replayed_proposals_draft_as_eager_ones(tiny4, method):
    """Two steps of one request (the prompt at 0..5, then the sampled token at 6 after a rejection), run
    eagerly and through the graph path: every proposal's host inputs survive the graph's padding and
    the replay drafts what the eager run drafts."""
    meta = build_attention_metadata([0], [7], [[0, 1, 2]], BLOCK_SIZE)
    cache = KVCache.allocate(tiny4.config, 16, BLOCK_SIZE)
    eager = build_proposer(SpeculativeConfig(method, 3), tiny4, KVLayout(16, BLOCK_SIZE))
    replayed = build_proposer(SpeculativeConfig(method, 3), tiny4, KVLayout(16, BLOCK_SIZE))
    graphs = DraftGraphs(replayed, (tiny4.config.hidden_size, torch.float32), 5, [4], torch.device("cpu"))
    replayed.use_graphs(graphs)
    # The dispatcher's choice, as the runner hands it over: the proposal's graph of 4 rows.
    propose = replayed.propose
    replayed.propose = lambda batch: propose(dataclasses.replace(batch, graph=DraftGraph(False, 4)))
    with torch.inference_mode():
        out = tiny4.model(torch.tensor(TOKENS[:7]), torch.arange(7), meta, cache, capture_layers=eager.capture_layers)
        for first, num in [(0, 6), (6, 1)]:
            d = DraftInput("r", TOKENS[: first + num + 1], first, num, slice(first, first + num), (0, 1, 2), True)
            batch = DraftBatch((d,), out.hidden_states, out.aux_hidden_states)
            drafts = propose_committed(eager, batch, BLOCK_SIZE)
            assert len(drafts["r"]) == 3 and propose_committed(replayed, batch, BLOCK_SIZE) == drafts
    assert graphs.proposals.stats.num_eager_steps == replayed.num_graph_steps == 2 and replayed.num_eager_steps == 0
