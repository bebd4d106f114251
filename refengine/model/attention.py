"""The attention op: store this step's K/V in the paged cache, then attend over each sequence's keys.

Everything that touches the cache layout sits behind `paged_attention`, so a GPU kernel can
replace this one function.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from refengine.model import triton_attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import DEFAULT_KERNELS, Kernels, Numerics
from refengine.model.errors import ModelInputError
from refengine.model.kv_cache import LayerKVCache

# How often each implementation ran, counted when Python runs the op (a CUDA graph's replays run
# what its capture counted, without passing through here); "reference-cache-view": of the reference's
# fast calls, those that read a lone sequence's keys as a view of the cache.
ATTENTION_CALLS: collections.Counter[str] = collections.Counter()


def attention_implementation(kernels: Kernels, device: torch.device | str) -> str:
    """What tensors on `device` run under `kernels.attention`: triton or reference. auto: the Triton
    kernels for CUDA tensors when triton is installed, else the reference."""
    if kernels.attention == "auto":
        usable = torch.device(device).type == "cuda" and triton_attention.triton_available()
        return "triton" if usable else "reference"
    return kernels.attention


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: LayerKVCache,
    meta: AttentionMetadata,
    scale: float,
    numerics: Numerics,
    kernels: Kernels = DEFAULT_KERNELS,
) -> torch.Tensor:
    """`q[T, Hq, D]`, `k`/`v[T, Hkv, D]` -> `out[T, Hq, D]`.

    Keys are always read back from the cache, so a token sees the same stored values whether its
    neighbours arrived in this step or an earlier one.
    """
    if attention_implementation(kernels, q.device) == "triton":
        ATTENTION_CALLS["triton"] += 1
        return triton_attention.triton_paged_attention(q, k, v, cache, meta, scale, numerics)
    ATTENTION_CALLS["reference"] += 1
    _check_rows(meta, q.shape[0])
    _store_kv(k, v, cache, meta)
    if numerics is Numerics.FAST:
        return _attend_grouped(q, cache, meta, scale)
    starts = meta.query_start_loc.tolist()
    out = torch.empty_like(q)
    for seq, seq_len in enumerate(meta.seq_lens.tolist()):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        keys, values = _gather_kv(cache, meta.block_tables[seq], seq_len)
        out[begin:end] = _attend_rows(q[begin:end], keys, values, seq_len, meta.causal, scale)
    return out


def _check_rows(meta: AttentionMetadata, num_tokens: int) -> None:
    """Invariant: the batch holds exactly the rows the metadata describes, and a causal sequence has
    keys for all its new tokens. Checked by a step's first layer (the metadata remembers it): every
    layer sees the same rows, and the host reads cost more than a decode step's attention."""
    key = ("checked", num_tokens)
    if key in meta.derived:
        return
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    if starts[-1] != num_tokens or len(seq_lens) != len(starts) - 1 or meta.slot_mapping.shape[0] != num_tokens:
        raise ModelInputError(
            f"attention metadata describes {starts[-1]} tokens in {len(starts) - 1} sequences with "
            f"{meta.slot_mapping.shape[0]} slots; got {num_tokens} tokens and {len(seq_lens)} seq_lens"
        )
    q_lens = [end - begin for begin, end in zip(starts, starts[1:])]
    # A causal row at position p needs p + 1 keys. Non-causal rows all see seq_len keys (a fixed-shape
    # block may carry rows past its sequence's last real one), and a padded sequence (seq_len 0, slots
    # -1) attends over no keys: its rows come out zero (softmax over nothing), as in the Triton kernels.
    short = next((seq for seq, (n, s) in enumerate(zip(q_lens, seq_lens)) if meta.causal and 0 < s < n), None)
    if short is not None:
        raise ModelInputError(f"sequence {short}: seq_len {seq_lens[short]} < its {q_lens[short]} new tokens")
    meta.derived[key] = True


def _store_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata) -> None:
    key = ("store", cache.key.device)
    if key not in meta.derived:  # once per step (the metadata caches it), not once per layer
        slot_mapping = meta.slot_mapping.to(cache.key.device)
        keep = slot_mapping >= 0
        meta.derived[key] = (slot_mapping, None) if bool(keep.all()) else (slot_mapping[keep], keep)
    slots, keep = meta.derived[key]
    if keep is not None:  # slots of -1: tokens whose K/V go nowhere
        k, v = k[keep], v[keep]
    cache.key.view(-1, *cache.key.shape[2:]).index_copy_(0, slots, k.to(cache.key.dtype))
    cache.value.view(-1, *cache.value.shape[2:]).index_copy_(0, slots, v.to(cache.value.dtype))


def _gather_kv(
    cache: LayerKVCache, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This sequence's keys and values, `[seq_len, Hkv, D]`, in position order."""
    block_size = cache.key.shape[1]
    blocks = block_table[: -(-seq_len // block_size)].to(cache.key.device)
    keys = cache.key.index_select(0, blocks).flatten(0, 1)[:seq_len]
    values = cache.value.index_select(0, blocks).flatten(0, 1)[:seq_len]
    return keys, values


def _attend_rows(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seq_len: int, causal: bool, scale: float
) -> torch.Tensor:
    """One query row at a time, over exactly its own keys.

    A row at position p reduces over p + 1 keys (causal) or seq_len keys, so every shape it passes
    through is fixed by p alone, never by the other rows or by padding.
    """
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    keys_t = keys.permute(1, 2, 0)  # [Hkv, D, L]
    values_h = values.transpose(0, 1)  # [Hkv, L, D]
    first_position = seq_len - num_rows
    out = torch.empty_like(q)
    for row in range(num_rows):
        num_keys = first_position + row + 1 if causal else seq_len
        q_row = q[row].reshape(num_kv_heads, group, head_dim)
        scores = torch.matmul(q_row, keys_t[:, :, :num_keys]).float() * scale
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out[row] = torch.matmul(probs, values_h[:, :num_keys]).reshape(num_heads, head_dim)
    return out


@dataclass(frozen=True, slots=True)
class _Group:
    """Sequences that feed the same number n of new tokens: one SDPA call."""

    rows: torch.Tensor | None  # their rows in the token batch; None: every row, in order (a decode step)
    num_seqs: int
    q_len: int
    block_table: torch.Tensor  # [G, blocks] covering the group's longest sequence; -1 replaced by 0
    num_keys: int  # keys read per sequence: the group's longest sequence
    mask: torch.Tensor | None  # [G, 1, n, num_keys] True where a row sees a key; None: it sees them all
    # A lone sequence whose blocks are consecutive in the cache (the usual case: the block pool hands
    # out free blocks in order): its first block. Its keys are then a view of the cache, not a gather.
    first_block: int | None


def _fast_plan(meta: AttentionMetadata, block_size: int, device: torch.device) -> tuple[_Group, ...]:
    """The groups of a step: host arithmetic done once per step, not once per layer (cached on the
    metadata). Grouping by the number of new tokens, rather than padding every sequence to the longest
    chunk, keeps a prefill chunk from multiplying the decodes' query rows."""
    key = ("fast", block_size, device)
    if key in meta.derived:
        return meta.derived[key]
    starts = meta.query_start_loc.cpu().numpy()
    seq_lens_all = meta.seq_lens.cpu().numpy()
    q_lens = np.diff(starts)
    groups = []
    for q_len in np.unique(q_lens[q_lens > 0]).tolist():
        seqs = np.flatnonzero(q_lens == q_len)
        rows = (starts[seqs, None] + np.arange(q_len)).ravel()
        seq_lens = seq_lens_all[seqs]
        num_keys = int(seq_lens.max())
        # Blocks past a sequence's own are -1 in the table: any real block stands in, its keys are masked.
        host_table = meta.block_tables[torch.from_numpy(seqs), : -(-num_keys // block_size)]
        table = host_table.to(device).clamp(min=0)
        mask = None
        # Row i of sequence g sits at position seq_len - n + i: it sees keys up to there (causal) or all.
        # With one row per sequence, or none causal, and equal lengths, every row sees every key read.
        if (q_len > 1 and meta.causal) or (seq_lens != num_keys).any():
            offsets = np.arange(q_len) - (q_len - 1) if meta.causal else np.zeros(q_len, dtype=np.int64)
            last_key = torch.from_numpy(seq_lens[:, None] - 1 + offsets).to(device)
            mask = (torch.arange(num_keys, device=device) <= last_key[:, :, None])[:, None]
        every_row = len(rows) == starts[-1]  # rows are in order, so they are all of the batch
        row_ids = None if every_row else torch.from_numpy(rows).to(device)
        groups.append(_Group(row_ids, len(seqs), q_len, table, num_keys, mask, _first_of_run(host_table)))
    meta.derived[key] = tuple(groups)
    return meta.derived[key]


def _first_of_run(table: torch.Tensor) -> int | None:
    """`table[1, blocks]`'s first block when the blocks run consecutively, else None. Read only from a
    host table: on a GPU the question would cost a synchronising read."""
    if table.shape[0] != 1 or table.shape[1] == 0 or table.device.type != "cpu":
        return None
    blocks = table[0]
    first = int(blocks[0])
    consecutive = torch.equal(blocks, torch.arange(first, first + blocks.shape[0], dtype=blocks.dtype))
    return first if first >= 0 and consecutive else None


def _attend_grouped(q: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Fast numerics: the sequences that feed the same number of new tokens attend in one SDPA call, so
    a decode step is one call per layer however many sequences it holds (a loop over sequences costs a
    few small ops per sequence and layer, more than the attention itself)."""
    groups = _fast_plan(meta, cache.key.shape[1], q.device)
    if len(groups) == 1 and groups[0].rows is None:
        return _attend_group(q, cache, groups[0], scale)
    out = torch.empty_like(q)
    for group in groups:
        out.index_copy_(0, group.rows, _attend_group(q.index_select(0, group.rows), cache, group, scale))
    return out


def _attend_group(q: torch.Tensor, cache: LayerKVCache, group: _Group, scale: float) -> torch.Tensor:
    """`q[G * n, Hq, D]`, the group's rows -> `out[G * n, Hq, D]`, over each sequence's keys padded to
    the group's longest.

    Grouped-query heads are folded into the query rows ([G, Hkv, heads_per_kv * n, D] against
    [G, Hkv, L, D]), so keys and values are never repeated per query head."""
    num_heads, head_dim = q.shape[1:]
    num_seqs, q_len, num_kv_heads = group.num_seqs, group.q_len, cache.key.shape[2]
    per_kv = num_heads // num_kv_heads
    if group.first_block is not None:
        ATTENTION_CALLS["reference-cache-view"] += 1
        blocks = slice(group.first_block, group.first_block + group.block_table.shape[1])
        keys, values = cache.key[blocks], cache.value[blocks]
    else:
        blocks = group.block_table.flatten()  # index_select: a plain gather, cheaper than advanced indexing
        keys, values = cache.key.index_select(0, blocks), cache.value.index_select(0, blocks)
    keys = keys.view(num_seqs, -1, num_kv_heads, head_dim)[:, : group.num_keys]
    values = values.view(num_seqs, -1, num_kv_heads, head_dim)[:, : group.num_keys]
    keys, values = keys.permute(0, 2, 1, 3), values.permute(0, 2, 1, 3)  # [G, Hkv, L, D]
    queries = q.view(num_seqs, q_len, num_kv_heads, per_kv, head_dim).permute(0, 2, 3, 1, 4)
    queries = queries.reshape(num_seqs, num_kv_heads, per_kv * q_len, head_dim)
    mask = group.mask
    if mask is not None:
        mask = mask[:, :, None].expand(num_seqs, 1, per_kv, q_len, group.num_keys).reshape(num_seqs, 1, per_kv * q_len, -1)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    out = out.view(num_seqs, num_kv_heads, per_kv, q_len, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_seqs * q_len, num_heads, head_dim)
