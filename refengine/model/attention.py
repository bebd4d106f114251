"""The attention op: store this step's K/V in the paged cache, then attend over each sequence's keys.

Everything that touches the cache layout sits behind `paged_attention`, so a GPU kernel can
replace this one function.
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F

from refengine.model import triton_attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import DEFAULT_KERNELS, Kernels, Numerics
from refengine.model.errors import ModelInputError
from refengine.model.kv_cache import LayerKVCache

# How often each implementation ran, counted when Python runs the op (a CUDA graph's replays run
# what its capture counted, without passing through here).
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
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    # Invariant: the batch holds exactly the rows the metadata describes.
    if (
        starts[-1] != q.shape[0]
        or len(seq_lens) != len(starts) - 1
        or meta.slot_mapping.shape[0] != q.shape[0]
    ):
        raise ModelInputError(
            f"attention metadata describes {starts[-1]} tokens in {len(starts) - 1} sequences with "
            f"{meta.slot_mapping.shape[0]} slots; got {q.shape[0]} tokens and {len(seq_lens)} seq_lens"
        )
    _store_kv(k, v, cache, meta.slot_mapping)
    attend = _attend_rows if numerics is Numerics.BATCH_INVARIANT else _attend_batched
    out = torch.empty_like(q)
    for seq, seq_len in enumerate(seq_lens):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        if seq_len == 0:
            # A padded sequence (its slots are -1): it attends over nothing, zeros, as in the Triton kernels.
            out[begin:end] = 0
            continue
        # A causal row at position p needs p + 1 keys; non-causal rows all see seq_len keys, and a
        # fixed-shape block may carry rows past its sequence's last real one (slot -1).
        if meta.causal and seq_len < end - begin:
            raise ModelInputError(f"sequence {seq}: seq_len {seq_len} < its {end - begin} new tokens")
        keys, values = _gather_kv(cache, meta.block_tables[seq], seq_len)
        out[begin:end] = attend(q[begin:end], keys, values, seq_len, meta.causal, scale)
    return out


def _store_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    slot_mapping = slot_mapping.to(cache.key.device)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    cache.key.view(-1, *cache.key.shape[2:]).index_copy_(0, slots, k[keep].to(cache.key.dtype))
    cache.value.view(-1, *cache.value.shape[2:]).index_copy_(0, slots, v[keep].to(cache.value.dtype))


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


def _attend_batched(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seq_len: int, causal: bool, scale: float
) -> torch.Tensor:
    num_rows, num_heads, _ = q.shape
    group = num_heads // keys.shape[1]
    keys_h = keys.transpose(0, 1).repeat_interleave(group, dim=0)
    values_h = values.transpose(0, 1).repeat_interleave(group, dim=0)
    mask = None
    if causal:
        row_positions = torch.arange(seq_len - num_rows, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= row_positions[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys_h, values_h, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)
