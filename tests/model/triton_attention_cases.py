"""Cases for the Triton paged-attention kernels, checked against the torch reference.

Run by test_triton_attention.py under Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set
before triton is imported, so that runs in a subprocess), and by tests/gpu on a GPU at these and at
real shapes. Shapes stay small so the interpreter takes seconds.
"""

import collections
import os
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from refengine.model import attention  # noqa: E402
from refengine.model import triton_attention as kernels  # noqa: E402
from refengine.model.attention_metadata import AttentionMetadata  # noqa: E402
from refengine.model.attention_metadata_builder import build_attention_metadata  # noqa: E402
from refengine.model.config import Kernels, Numerics  # noqa: E402
from refengine.model.kv_cache import LayerKVCache  # noqa: E402
from refengine.worker.device_inputs import DeviceInputIndices  # noqa: E402
from refengine.worker.target_graphs import TargetGraphs  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(
    computed: list[int],
    new: list[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    causal: bool = True,
):
    """A random cache already holding every sequence's first `computed` keys, plus this step's q/k/v."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-(c + n) // block_size) for c, n in zip(computed, new)]
    num_blocks = sum(blocks_needed) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()  # scattered, not in order
    block_ids, at = [], 0
    for count in blocks_needed:
        block_ids.append(order[at : at + count])
        at += count
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    cache = LayerKVCache(
        key=torch.randn(shape, generator=generator).to(dtype).to(DEVICE),
        value=torch.randn(shape, generator=generator).to(dtype).to(DEVICE),
    )
    tokens = sum(new)
    q = torch.randn(tokens, num_heads, head_dim, generator=generator).to(dtype).to(DEVICE)
    k = torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype).to(DEVICE)
    v = torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype).to(DEVICE)
    meta = build_attention_metadata(computed, new, block_ids, block_size, causal=causal)
    return q, k, v, cache, meta


def clone_cache(cache: LayerKVCache) -> LayerKVCache:
    return LayerKVCache(cache.key.clone(), cache.value.clone())


def reference(q, k, v, cache, meta, scale=None):
    """The torch reference (one row at a time), in float64 on the CPU."""
    c64 = LayerKVCache(cache.key.double().cpu(), cache.value.double().cpu())
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    result = attention.paged_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), c64, meta, scale, Numerics.BATCH_INVARIANT,
        Kernels(attention="reference"),
    )
    return result, c64


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


# decode rows, a verify block, a prefill chunk over cached keys, and a first prefill
MIXED = ([37, 66, 3, 0], [1, 4, 5, 6])


@pytest.mark.parametrize("numerics", [Numerics.BATCH_INVARIANT, Numerics.FAST])
@pytest.mark.parametrize("split_keys", [64, 256])
def test_matches_reference_and_stores(numerics, split_keys, monkeypatch):
    monkeypatch.setattr(kernels, "INVARIANT_SPLIT_KEYS", split_keys)
    if split_keys == 64:  # FAST: ask for many programs, so its plan splits the keys too
        monkeypatch.setattr(kernels, "_PROGRAMS_PER_SM", 1024)
    q, k, v, cache, meta = make_case(*MIXED)
    blocks = kernels.num_row_blocks(q.shape[0], len(MIXED[0]), kernels.rows_per_program(q.shape[1] // k.shape[1]))
    plan = kernels.split_plan(blocks, k.shape[1], meta.block_tables.shape[1] * 4, numerics, kernels._num_sms(q.device))
    assert plan[1] > 1 or split_keys == 256
    ours = clone_cache(cache)
    out = kernels.triton_paged_attention(q, k, v, ours, meta, q.shape[-1] ** -0.5, numerics)
    ref, ref_cache = reference(q, k, v, cache, meta)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5
    # The store is a copy: bit-exact, and every other slot untouched.
    assert torch.equal(ours.key.cpu(), ref_cache.key.float())
    assert torch.equal(ours.value.cpu(), ref_cache.value.float())


def test_padding_sentinel_writes_nothing_and_gives_zeros():
    """A captured batch pads with sequences of seq_len 0 and slot -1: no KV write, zero output."""
    q, k, v, cache, meta = make_case([9, 0], [2, 3])
    slots = meta.slot_mapping.clone()
    slots[2:] = -1
    padded = AttentionMetadata(
        meta.query_start_loc, torch.tensor([11, 0]), meta.block_tables, slots, causal=True
    )
    ours = clone_cache(cache)
    out = kernels.triton_paged_attention(q, k, v, ours, padded, 0.25, Numerics.FAST)
    assert torch.equal(out[2:].cpu(), torch.zeros_like(out[2:].cpu()))
    changed = (ours.key != cache.key).any(dim=(2, 3)).flatten().nonzero().flatten().tolist()
    assert changed == sorted(meta.slot_mapping[:2].tolist())


@pytest.mark.parametrize("split_keys", [64, 256])
def test_batch_invariant_rows(split_keys, monkeypatch):
    """A sequence's rows are bitwise the same alone and next to other sequences."""
    monkeypatch.setattr(kernels, "INVARIANT_SPLIT_KEYS", split_keys)
    q, k, v, cache, meta = make_case([70, 5], [3, 2], seed=1)
    together = kernels.triton_paged_attention(q, k, v, clone_cache(cache), meta, 0.25, Numerics.BATCH_INVARIANT)
    alone_meta = build_attention_metadata([70], [3], [meta.block_tables[0].tolist()[: -(-73 // 4)]], 4)
    alone = kernels.triton_paged_attention(
        q[:3], k[:3], v[:3], clone_cache(cache), alone_meta, 0.25, Numerics.BATCH_INVARIANT
    )
    assert torch.equal(together[:3], alone)


def decode_rows_of(meta: AttentionMetadata, block_size: int) -> AttentionMetadata:
    """The same rows as a decode step: every row its own sequence of one new token at its own position,
    over its sequence's blocks."""
    starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    computed, block_ids = [], []
    for seq, seq_len in enumerate(lens):
        q_len = starts[seq + 1] - starts[seq]
        for i in range(q_len):
            computed.append(seq_len - q_len + i)
            block_ids.append(meta.block_tables[seq].tolist()[: -(-(computed[-1] + 1) // block_size)])
    return build_attention_metadata(computed, [1] * len(computed), block_ids, block_size)


SHAPES = [(4, 2, 16), (6, 2, 24), (2, 2, 16), (8, 1, 16), (16, 1, 16)]  # (heads, KV heads, head_dim): GQA 2, 3, 1, 8, 16
CONTEXT = st.one_of(st.sampled_from([0, 3, 4, 7, 8, 15, 16, 63, 64, 65, 127, 128]), st.integers(0, 140))
VERIFY_COUNTS: collections.Counter = collections.Counter()


@settings(derandomize=True, database=None, deadline=None, max_examples=6, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    shape=st.sampled_from(SHAPES),
    split_keys=st.sampled_from([64, 256]),
    seqs=st.lists(st.tuples(CONTEXT, st.integers(1, 5)), min_size=1, max_size=3),
)
@example(shape=(4, 2, 16), split_keys=64, seqs=[(61, 5), (64, 1), (3, 4)])  # across a window and a split
def _verify_rows_match_decode_rows(dtype, shape, split_keys, seqs):
    heads, kv_heads, head_dim = shape
    q, k, v, cache, meta = make_case(
        [c for c, _ in seqs], [n for _, n in seqs], num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        dtype=dtype, seed=len(seqs),
    )  # fmt: skip
    saved = kernels.INVARIANT_SPLIT_KEYS
    kernels.INVARIANT_SPLIT_KEYS = split_keys
    try:
        verified_cache = clone_cache(cache)
        verified = kernels.triton_paged_attention(q, k, v, verified_cache, meta, 0.25, Numerics.BATCH_INVARIANT)
        decoded = kernels.triton_paged_attention(
            q, k, v, clone_cache(verified_cache), decode_rows_of(meta, 4), 0.25, Numerics.BATCH_INVARIANT
        )
    finally:
        kernels.INVARIANT_SPLIT_KEYS = saved
    assert torch.equal(verified, decoded), (verified != decoded).any(dim=-1).nonzero().tolist()
    rows = kernels.rows_per_program(heads // kv_heads)
    for c, n in seqs:
        VERIFY_COUNTS["rows sharing a window"] += n > 1 and c // rows == (c + n - 1) // rows
        VERIFY_COUNTS["rows across windows"] += c // rows != (c + n - 1) // rows
        VERIFY_COUNTS["keys across splits"] += c + n > split_keys


@pytest.mark.parametrize("dtype", [
    torch.float32,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="Triton's interpreter computes bfloat16 dots wrongly (3.9)")),
])  # fmt: skip
def test_verify_rows_are_bitwise_the_decode_rows(dtype):
    """Invariant 52 (docs/invariants.md): a verify step's rows (several rows of a sequence in one program, sharing its K/V
    tiles) give bit for bit what each row gives decoded alone at its position, under batch-invariant
    numerics: spec on then emits spec off's tokens."""
    VERIFY_COUNTS.clear()
    _verify_rows_match_decode_rows(dtype)
    assert all(VERIFY_COUNTS[v] for v in ("rows sharing a window", "rows across windows", "keys across splits")), VERIFY_COUNTS


@pytest.mark.parametrize("numerics", [Numerics.BATCH_INVARIANT, Numerics.FAST])
def test_a_mixed_step_in_a_graphs_padded_layout_attends_as_it_does_unpadded(numerics):
    """worker/target_graphs.py: decode, verify and prefill rows staged into a larger graph's buffers, with
    a padding sequence behind them and empty sequences past it, give each real row its unpadded result
    (bit for bit under batch-invariant numerics), store the same KV, and give the padding zeros."""
    q, k, v, cache, meta = make_case(*MIXED)
    t, padded = q.shape[0], q.shape[0] + 7
    # Only the buffers are used: no model runs, and the cache stands in for where they live.
    graphs = TargetGraphs(None, types.SimpleNamespace(device=torch.device("cpu")), [padded], [6], max_num_seqs=6,
                          max_logits=padded, max_blocks_per_seq=meta.block_tables.shape[1] + 2)  # fmt: skip
    n = meta.seq_lens.shape[0]
    seq_of_token = np.repeat(np.arange(n), np.diff(meta.query_start_loc.numpy()))
    indices = DeviceInputIndices.build([], [], [-1] * n, [0] * n, seq_of_token)  # nothing read from a frame
    graphs.stage(padded, torch.zeros(t, dtype=torch.int64), torch.zeros(t, dtype=torch.int64), meta, None, indices)
    views = graphs.static_inputs(padded)[2]
    staged = AttentionMetadata(*(x.to(DEVICE) for x in (views.query_start_loc, views.seq_lens, views.block_tables, views.slot_mapping)))
    noise = torch.randn(padded - t, *q.shape[1:]).to(DEVICE)
    pad = lambda x: torch.cat([x, noise[:, : x.shape[1]]])  # noqa: E731
    unpadded_cache, padded_cache = clone_cache(cache), clone_cache(cache)
    alone = kernels.triton_paged_attention(q, k, v, unpadded_cache, meta, 0.25, numerics)
    out = kernels.triton_paged_attention(pad(q), pad(k), pad(v), padded_cache, staged, 0.25, numerics)
    if numerics is Numerics.BATCH_INVARIANT:
        assert torch.equal(out[:t], alone)
    ref, ref_cache = reference(q, k, v, cache, meta, scale=0.25)
    assert rel_err(out[:t], ref) < 1e-5
    assert torch.equal(out[t:].cpu(), torch.zeros_like(out[t:].cpu()))
    assert torch.equal(padded_cache.key.cpu(), ref_cache.key.float())
    assert torch.equal(padded_cache.value.cpu(), ref_cache.value.float())


def test_odd_shapes_and_non_causal():
    """head_dim not a power of two, group of 3, non-causal (DFlash's query block)."""
    q, k, v, cache, meta = make_case([10, 2], [3, 4], num_heads=6, num_kv_heads=2, head_dim=24, causal=False)
    out = kernels.triton_paged_attention(q, k, v, clone_cache(cache), meta, 0.2, Numerics.FAST)
    ref, _ = reference(q, k, v, cache, meta, scale=0.2)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="Triton's interpreter computes bfloat16 dots wrongly (3.9)"
)
def test_bfloat16_close_to_float64():
    q, k, v, cache, meta = make_case([40, 3], [1, 4], dtype=torch.bfloat16, seed=2)
    out = kernels.triton_paged_attention(q, k, v, clone_cache(cache), meta, q.shape[-1] ** -0.5, Numerics.FAST)
    ref, _ = reference(q, k, v, cache, meta)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 1e-2


# ---- the fused token-local ops (triton_ops.py) ---------------------------------------------------


def test_fused_rms_norm_and_silu_match_the_torch_ops():
    from refengine.model import ops, triton_ops

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(5, 96, generator=generator).to(DEVICE)
    w = (1 + 0.1 * torch.randn(96, generator=generator)).to(DEVICE)
    ref_norm = ops.rms_norm(x.cpu(), w.cpu(), 1e-6, fused=False)
    gate_up = torch.randn(3, 2 * 1500, generator=generator)
    ref_silu = ops.silu_and_mul(gate_up, fused=False)
    assert rel_err(triton_ops.rms_norm(x, w, 1e-6), ref_norm) < 1e-6
    assert rel_err(triton_ops.silu_and_mul(gate_up.to(DEVICE)), ref_silu) < 1e-6


@pytest.mark.parametrize("norm", [True, False])
def test_fused_norm_rope_matches_norm_then_rotary(norm):
    from refengine.model import triton_ops
    from refengine.model.layers import RMSNorm, RotaryEmbedding

    generator = torch.Generator().manual_seed(5)
    rotary = RotaryEmbedding(32, 64, 10000.0, None)
    head_norm = RMSNorm(32, 1e-6, torch.float32)
    head_norm.weight.data = 1 + 0.1 * torch.randn(32, generator=generator)
    qkv = torch.randn(4, (6 + 2 + 2) * 32, generator=generator)
    q = qkv[:, : 6 * 32].reshape(4, 6, 32)  # strided views, as the layer passes them
    k = qkv[:, 6 * 32 : 8 * 32].reshape(4, 2, 32)
    k_norm = RMSNorm(32, 1e-6, torch.float32)
    k_norm.weight.data = 1 + 0.1 * torch.randn(32, generator=generator)
    positions = torch.tensor([0, 5, 17, 63])
    ref_q, ref_k = rotary(positions, head_norm(q) if norm else q, k_norm(k) if norm else k)
    ours_q, ours_k = triton_ops.norm_rope(
        q.to(DEVICE), k.to(DEVICE), head_norm.weight.to(DEVICE) if norm else None,
        k_norm.weight.to(DEVICE) if norm else None, 1e-6, positions.to(DEVICE),
        rotary.cos.to(DEVICE), rotary.sin.to(DEVICE),
    )
    assert rel_err(ours_k, ref_k) < 1e-6
    ours = ours_q
    ref = ref_q
    assert rel_err(ours, ref) < 1e-6


def test_fused_add_rms_norm():
    from refengine.model import triton_ops

    generator = torch.Generator().manual_seed(6)
    x, d = torch.randn(2, 3, 80, generator=generator).unbind(0)
    w = 1 + 0.1 * torch.randn(80, generator=generator)
    total, normed = triton_ops.add_rms_norm(x.to(DEVICE), d.to(DEVICE), w.to(DEVICE), 1e-5)
    ref_total = x + d
    ref = w * (ref_total * torch.rsqrt(ref_total.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(total.cpu(), ref_total)
    assert rel_err(normed, ref) < 1e-6
