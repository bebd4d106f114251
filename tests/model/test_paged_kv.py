"""Paged KV: where a sequence's blocks live does not change its logits; the metadata is honoured."""

import random

import pytest
import torch
import torch.nn.functional as F
from model_drive import BLOCK_SIZE, new_cache, prefill_logits, step

from refengine.model import (
    AttentionMetadata,
    KVCache,
    LayerKVCache,
    LoadedModel,
    ModelInputError,
    Numerics,
    build_tiny_model,
    paged_attention,
)
from refengine.model.attention import ATTENTION_CALLS
from refengine.model.attention_metadata_builder import build_attention_metadata


@pytest.mark.parametrize("numerics", ["batch_invariant", "fast"])
def test_shuffled_block_tables_give_the_logits_of_contiguous_ones(numerics: str) -> None:
    loaded = build_tiny_model("qwen3", seed=4, numerics=numerics)
    rng = random.Random(4)
    prompts = [[rng.randrange(loaded.config.vocab_size) for _ in range(n)] for n in (29, 13, 40)]
    contiguous = [prefill_logits(loaded.model, ids) for ids in prompts]
    # All three sequences' blocks shuffled together through one pool, interleaved and out of order.
    pool = list(range(64))
    rng.shuffle(pool)
    tables, cursor = [], 0
    for ids in prompts:
        count = -(-len(ids) // BLOCK_SIZE)
        tables.append(pool[cursor : cursor + count])
        cursor += count
    paged = step(
        loaded.model,
        new_cache(loaded.model, 64),
        [(ids, 0, t) for ids, t in zip(prompts, tables, strict=True)],
    )
    for expected, got in zip(contiguous, paged, strict=True):
        if numerics == "batch_invariant":
            assert torch.equal(expected, got)
        else:
            torch.testing.assert_close(expected, got, rtol=1e-5, atol=1e-5)


def _layer_cache(num_blocks: int, num_kv_heads: int, head_dim: int) -> LayerKVCache:
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    return LayerKVCache(key=torch.zeros(shape), value=torch.zeros(shape))


def _reference_attention(q, k, v, causal: bool) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), is_causal=causal, scale=0.25
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("numerics", list(Numerics))
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_dense_reference_and_honours_causal_flag(numerics: Numerics, causal: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    num_tokens, heads, kv_heads, head_dim = 11, 4, 2, 16
    q = torch.randn(num_tokens, heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    meta = build_attention_metadata([0], [num_tokens], [[5, 2, 7]], BLOCK_SIZE, causal=causal)
    out = paged_attention(q, k, v, _layer_cache(8, kv_heads, head_dim), meta, 0.25, numerics)
    torch.testing.assert_close(out, _reference_attention(q, k, v, causal), rtol=1e-5, atol=1e-5)


MIXED = ([9, 0, 3, 14, 5], [1, 7, 0, 1, 4], [[3, 0, 8], [1, 6], [2], [4, 9, 5, 7], [10, 11, 12]])
EQUAL_DECODES = ([6, 6], [1, 1], [[3, 0], [1, 6]])  # every key read is seen: no mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("batch", [MIXED, EQUAL_DECODES], ids=["mixed", "equal-decodes"])
def test_fast_grouped_attention_matches_the_per_row_reference(causal: bool, batch: tuple) -> None:
    """Fast mode attends over groups of sequences at once, padded to the longest: decodes, prefill chunks
    and a sequence with no new token in one step give each row what the exact per-row attention gives."""
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim = 6, 2, 8
    computed, new, tables = batch
    meta = build_attention_metadata(computed, new, tables, BLOCK_SIZE, causal=causal)
    # The cache holds every earlier key already; this step's keys go in through paged_attention.
    cache = _layer_cache(13, kv_heads, head_dim)
    cache.key.normal_(generator=gen)
    cache.value.normal_(generator=gen)
    q = torch.randn(sum(new), heads, head_dim, generator=gen)
    k = torch.randn(sum(new), kv_heads, head_dim, generator=gen)
    v = torch.randn(sum(new), kv_heads, head_dim, generator=gen)
    caches = [LayerKVCache(cache.key.clone(), cache.value.clone()) for _ in range(2)]
    exact, fast = (
        paged_attention(q, k, v, c, meta, 0.3, numerics)
        for c, numerics in zip(caches, [Numerics.BATCH_INVARIANT, Numerics.FAST], strict=True)
    )
    torch.testing.assert_close(fast, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("new", [1, 5], ids=["decode", "chunk"])
@pytest.mark.parametrize("table", [[4, 5, 6], [6, 4, 5]], ids=["consecutive", "scattered"])
def test_a_lone_sequence_reads_its_keys_in_place_only_from_consecutive_blocks(new: int, table: list) -> None:
    """Fast mode reads a lone sequence's keys as a view of the cache when its blocks run consecutively,
    and gathers them otherwise: either way each row gets what the exact per-row attention gives."""
    gen = torch.Generator().manual_seed(6)
    heads, kv_heads, head_dim = 6, 2, 8
    meta = build_attention_metadata([11 - new], [new], [table], BLOCK_SIZE)
    cache = _layer_cache(8, kv_heads, head_dim)
    cache.key.normal_(generator=gen)
    cache.value.normal_(generator=gen)
    q, k, v = (torch.randn(new, h, head_dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    exact = paged_attention(q, k, v, LayerKVCache(cache.key.clone(), cache.value.clone()), meta, 0.3,
                            Numerics.BATCH_INVARIANT)
    views_before = ATTENTION_CALLS["reference-cache-view"]
    fast = paged_attention(q, k, v, cache, meta, 0.3, Numerics.FAST)
    torch.testing.assert_close(fast, exact, rtol=1e-5, atol=1e-5)
    assert ATTENTION_CALLS["reference-cache-view"] - views_before == (table == [4, 5, 6])


@pytest.mark.parametrize("numerics", list(Numerics))
def test_a_padded_sequence_attends_over_nothing(numerics: Numerics) -> None:
    """A CUDA graph's padded sequences (seq_len 0, slots -1; here every sequence of a pass, as when each
    request sits a draft pass out) come out zero in both numerics, as in the Triton kernels: no rows of
    NaN from a softmax over no keys."""
    heads, kv_heads, head_dim = 4, 2, 8
    q = torch.randn(3, heads, head_dim)
    k = torch.randn(3, kv_heads, head_dim)
    for seq_lens, slots in (([0, 0, 0], [-1, -1, -1]), ([0, 3, 0], [-1, 2, -1])):
        meta = AttentionMetadata(torch.tensor([0, 1, 2, 3]), torch.tensor(seq_lens), torch.tensor([[0], [1], [0]]),
                                 torch.tensor(slots), causal=True)
        out = paged_attention(q, k, k, _layer_cache(4, kv_heads, head_dim), meta, 1.0, numerics)
        padded = [i for i, n in enumerate(seq_lens) if n == 0]
        assert torch.equal(out[padded], torch.zeros_like(q[padded])), seq_lens
        assert out.isfinite().all()


def test_slot_minus_one_writes_nothing() -> None:
    kv_heads, head_dim = 2, 8
    cache = _layer_cache(4, kv_heads, head_dim)
    k = torch.ones(3, kv_heads, head_dim)
    meta = build_attention_metadata([0], [3], [[1]], BLOCK_SIZE)
    meta = AttentionMetadata(meta.query_start_loc, meta.seq_lens, meta.block_tables, torch.tensor([4, -1, 6]))
    paged_attention(torch.ones(3, 4, head_dim), k, k, cache, meta, 1.0, Numerics.FAST)
    written = cache.key.flatten(0, 1).abs().sum(dim=(1, 2)) > 0
    assert written.nonzero().flatten().tolist() == [4, 6]


def test_capture_layers_returns_each_layers_output(tiny_model: LoadedModel) -> None:
    model = tiny_model.model
    meta = build_attention_metadata([0], [6], [[0, 1]], BLOCK_SIZE)
    ids, positions = torch.arange(6), torch.arange(6)
    out = model(ids, positions, meta, new_cache(model), capture_layers=(0, 1))
    assert sorted(out.aux_hidden_states) == [0, 1]
    hidden = model.embed(ids)
    layer_cache = new_cache(model)
    for index, layer in enumerate(model.layers):
        hidden = layer(positions, hidden, meta, layer_cache.layers[index])
        assert torch.equal(hidden, out.aux_hidden_states[index])
    assert torch.equal(model.norm(hidden), out.hidden_states)


def test_bad_inputs_raise_model_input_error(tiny_model: LoadedModel) -> None:
    model = tiny_model.model
    meta = build_attention_metadata([0], [4], [[0]], BLOCK_SIZE)
    with pytest.raises(ModelInputError, match="capture_layers"):
        model(torch.arange(4), torch.arange(4), meta, new_cache(model), capture_layers=(7,))
    with pytest.raises(ModelInputError, match="describes 4 tokens"):
        model(torch.arange(5), torch.arange(5), meta, new_cache(model))
    with pytest.raises(ModelInputError, match="layers"):
        model(torch.arange(4), torch.arange(4), meta, KVCache(new_cache(model).layers[:1]))
    with pytest.raises(ModelInputError, match="do not fit"):
        build_attention_metadata([0], [9], [[0, 1]], BLOCK_SIZE)
