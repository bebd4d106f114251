"""The trainer's batched forwards compute what the drafters run: pass s of the unrolled hidden-state
heads equals the head's own paged forward after s - 1 correct drafts, and a DFlash block over its
anchor's context equals the head's block forward."""

import pytest
import torch

from refengine.model import AttentionMetadata, Numerics
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.registry import KVLayout, build_network
from refengine.train.forward import dflash_blocks, hidden_head_pass, num_kv_layers

BLOCK = 4
LAYOUT = KVLayout(num_blocks=32, block_size=BLOCK)
BLOCK_IDS = tuple(range(32))
T = 11


def _meta(start: int, num: int, causal: bool = True) -> AttentionMetadata:
    return build_attention_metadata([start], [num], [BLOCK_IDS], BLOCK, causal=causal)


def _features(head, tiny4, tokens):
    """The target features the head reads, for one sequence: `[T, F]`."""
    layers = head.capture_layers
    kv = __import__("refengine.model", fromlist=["KVCache"]).KVCache.allocate(tiny4.config, 32, BLOCK)
    out = tiny4.model(tokens, torch.arange(len(tokens)), _meta(0, len(tokens)), kv, capture_layers=layers)
    if not layers:
        return out.hidden_states
    return torch.cat([out.aux_hidden_states[i] for i in layers], dim=-1)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_unrolled_passes_match_the_drafting_forward(tiny4, method):
    head = build_network(SpeculativeConfig(method, 3), tiny4, LAYOUT, numerics=Numerics.FAST)
    tokens = torch.randint(3, tiny4.config.vocab_size, (T + 3,), generator=torch.Generator().manual_seed(1))
    features = _features(head, tiny4, tokens)
    num_passes = 3
    rows = T - 1 - num_passes
    with torch.no_grad():
        kv = [[] for _ in range(num_kv_layers(head))]
        hidden = head.combine(features[:rows])[None]
        batched = []
        for s in range(1, num_passes + 1):
            ids = tokens[s : s + rows][None]
            hidden = hidden_head_pass(head, ids, hidden, torch.arange(s - 1, s - 1 + rows)[None], kv)
            batched.append(hidden[0])
        for p in (0, 3, rows - 1):
            # The drafter: pass 1 over the committed rows 0..p, then one row per later pass.
            out = head.forward(
                tokens[1 : p + 2], head.combine(features[: p + 1]), torch.arange(p + 1), _meta(0, p + 1)
            )
            row = out[p : p + 1]
            torch.testing.assert_close(row[0], batched[0][p], atol=1e-4, rtol=1e-4)
            for s in range(2, num_passes + 1):
                position = p + s - 1
                row = head.forward(
                    tokens[p + s : p + s + 1], row, torch.tensor([position]), _meta(position, 1)
                )
                torch.testing.assert_close(row[0], batched[s - 1][p], atol=1e-4, rtol=1e-4)


def test_dflash_blocks_match_the_drafting_forward(tiny4):
    head = build_network(SpeculativeConfig("dflash", 3), tiny4, LAYOUT, numerics=Numerics.FAST)
    tokens = torch.randint(3, tiny4.config.vocab_size, (T,), generator=torch.Generator().manual_seed(2))
    k = 3
    anchors = torch.tensor([[2, 5, 7]])
    mask = head.mask_token_id
    block_ids = torch.stack([torch.tensor([int(tokens[a])] + [mask] * k) for a in anchors[0]])[None]
    with torch.no_grad():
        context = head.combine(_features(head, tiny4, tokens))
        batched = dflash_blocks(head, context[None], block_ids, anchors)
        for n, anchor in enumerate(anchors[0].tolist()):
            head.store_context(context[:anchor], torch.arange(anchor), _meta(0, anchor))
            out = head.forward(
                block_ids[0, n], torch.arange(anchor, anchor + k + 1), _meta(anchor, k + 1, causal=False)
            )
            torch.testing.assert_close(out, batched[0, n], atol=1e-4, rtol=1e-4)
