"""Paged attention as Triton kernels: the GPU replacement for `attention.paged_attention`.

Three launches per call (store, split, combine), none of which reads a value back to the host, so a
CUDA graph can capture them. A slot of -1 writes nothing and a token with no keys gets zeros (padded rows).
Under Numerics.BATCH_INVARIANT the key splits sit at fixed positions and combine in a fixed order, so a
token's result depends only on its own query and keys; Numerics.FAST sizes the splits from the batch.
A split program holds a sequence's rows within one aligned window of positions, so a verify step's rows read
their keys once, each in the tile slot of its position in every launch (invariant 52).
Under TRITON_INTERPRET=1 (read at import) the kernels run on CPU tensors, which is how CI tests them.
Design: docs/design/architecture.md (kernels).
"""

from __future__ import annotations

import functools

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import Numerics
from refengine.model.device import on_device
from refengine.model.errors import ModelInputError
from refengine.model.kv_cache import LayerKVCache

try:
    import triton
    import triton.language as tl
except ImportError:  # the `gpu` extra; the reference path needs none of this
    triton = None
    tl = None

# Keys per inner iteration of the split kernel, and the split size of Numerics.BATCH_INVARIANT.
BLOCK_N = 64
INVARIANT_SPLIT_KEYS = 256
# FAST: aim for this many (row block, KV head, split) programs per multiprocessor before splitting stops.
_PROGRAMS_PER_SM = 4
# A split program holds up to VERIFY_ROWS query rows of a sequence (a verify step's k + 1 rows with k <= 7)
# beside its GQA group, in at most MAX_BLOCK_M slots (the registers of its softmax state).
VERIFY_ROWS = 8
MAX_BLOCK_M = 64


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _store_kv_kernel(
        k_ptr,
        v_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_ptr,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_cb,
        stride_cs,
        stride_ch,
        num_kv_heads,
        head_dim,
        PAGE: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        token = tl.program_id(0)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        if slot >= 0:
            offs_h = tl.arange(0, BLOCK_H)
            offs_d = tl.arange(0, BLOCK_D)
            mask = (offs_h < num_kv_heads)[:, None] & (offs_d < head_dim)[None, :]
            dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cs
            dst = dst + offs_h[:, None] * stride_ch + offs_d[None, :]
            k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
            tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)

    # Runtime integers that change from step to step stay unspecialised: no recompilation as a
    # sequence grows or the batch changes.
    @triton.jit(do_not_specialize=["num_seqs", "split_keys", "num_splits", "stride_bt"])
    def _split_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        seq_lens_ptr,
        query_start_loc_ptr,
        out_ptr,
        part_acc_ptr,
        part_m_ptr,
        part_l_ptr,
        scale,
        num_seqs,
        split_keys,
        num_splits,
        stride_qt,
        stride_qh,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_bt,
        stride_ot,
        stride_oh,
        head_dim,
        GROUP: tl.constexpr,
        ROWS: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_B: tl.constexpr,
        CAUSAL: tl.constexpr,
        DIRECT: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """One program per (row window, KV head, key split): the query rows of one sequence whose positions
        fall in one aligned window of ROWS positions, each with its GROUP query heads, share every K/V tile
        (invariant 52, docs/invariants.md). Slot m of the tile is position (window * ROWS + m // GROUP), head m % GROUP: a
        token sits in the same slot whether it is decoded alone, verified with drafts or prefilled, so
        its arithmetic never depends on the rows beside it. Each slot keeps its own causal limit and
        softmax state; a tile past a slot's limit leaves that slot's state untouched."""
        block = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_kv_heads = tl.num_programs(1)

        # The program's sequence and window: sequence s owns the windows its rows' positions touch, in order.
        offs_b = tl.arange(0, BLOCK_B)
        b_mask = offs_b < num_seqs
        starts = tl.load(query_start_loc_ptr + offs_b, mask=b_mask, other=0).to(tl.int32)
        ends = tl.load(query_start_loc_ptr + 1 + offs_b, mask=b_mask, other=0).to(tl.int32)
        lens = tl.load(seq_lens_ptr + offs_b, mask=b_mask, other=0).to(tl.int32)
        first_pos = tl.maximum(lens - (ends - starts), 0)  # the first row's position (0 for padding)
        first_window = first_pos // ROWS
        last_window = (first_pos + ends - starts - 1) // ROWS
        windows = tl.where(b_mask & (ends > starts), last_window - first_window + 1, 0)
        windows_end = tl.cumsum(windows, axis=0)
        seq = tl.sum((windows_end <= block).to(tl.int32), axis=0)
        # Past the last window no sequence matches: everything picked is 0 and no slot is a row.
        pick = offs_b == seq
        window = tl.sum(tl.where(pick, first_window - (windows_end - windows), 0), axis=0) + block
        q_start = tl.sum(tl.where(pick, starts, 0), axis=0)
        q_end = tl.sum(tl.where(pick, ends, 0), axis=0)
        seq_len = tl.sum(tl.where(pick, lens, 0), axis=0)
        rows = q_start - tl.sum(tl.where(pick, first_pos, 0), axis=0) + window * ROWS
        seq = tl.minimum(seq, num_seqs - 1)

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        rows = rows + offs_m // GROUP
        heads = kv_head * GROUP + offs_m % GROUP
        m_mask = (offs_m < ROWS * GROUP) & (rows >= q_start) & (rows < q_end)
        d_mask = offs_d < head_dim
        if CAUSAL:
            num_keys = seq_len - (q_end - 1 - rows)
        else:
            num_keys = tl.zeros([BLOCK_M], tl.int32) + seq_len
        num_keys = tl.where(m_mask, tl.maximum(num_keys, 0), 0)

        start = split * split_keys
        row_end = tl.minimum(start + split_keys, num_keys)
        end = tl.max(row_end, axis=0)
        md_mask = m_mask[:, None] & d_mask[None, :]
        if start < end:
            q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=md_mask, other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            for key_start in range(start, end, BLOCK_N):
                positions = key_start + offs_n
                valid = positions < end  # the longest row's keys: the tile is read once for every row
                page = tl.load(block_tables_ptr + seq * stride_bt + positions // PAGE, mask=valid, other=0)
                slot_off = page.to(tl.int64) * stride_cb + (positions % PAGE) * stride_cs + kv_head * stride_ch
                kv_mask = valid[:, None] & d_mask[None, :]
                k = tl.load(k_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
                if IEEE:
                    scores = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    scores = tl.dot(q, tl.trans(k))
                scores = tl.where(positions[None, :] < row_end[:, None], scores * scale, float("-inf"))
                # A slot whose keys ended before this tile keeps its state bit for bit.
                active = key_start < row_end
                m_new = tl.where(active, tl.maximum(m_i, tl.max(scores, axis=1)), m_i)
                alpha = tl.exp(m_i - m_new)
                p = tl.where(active[:, None], tl.exp(scores - m_new[:, None]), 0.0)
                l_i = tl.where(active, l_i * alpha + tl.sum(p, axis=1), l_i)
                v = tl.load(v_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
                if IEEE:
                    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = tl.where(active[:, None], acc * alpha[:, None] + pv, acc)
                m_i = m_new
            has_keys = start < row_end
            if DIRECT:
                out = tl.where(has_keys[:, None], acc / l_i[:, None], 0.0)
                tl.store(
                    out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                    out.to(out_ptr.dtype.element_ty),
                    mask=md_mask,
                )
            else:
                part = ((rows * num_kv_heads + kv_head) * num_splits + split) * GROUP + offs_m % GROUP
                tl.store(part_m_ptr + part, m_i, mask=m_mask & has_keys)
                tl.store(part_l_ptr + part, l_i, mask=m_mask & has_keys)
                tl.store(
                    part_acc_ptr + part[:, None] * head_dim + offs_d[None, :],
                    acc,
                    mask=md_mask & has_keys[:, None],
                )
        elif DIRECT:
            # No keys at all (padded rows): zeros, as the combine step writes them.
            tl.store(
                out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                tl.zeros([BLOCK_M, BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty),
                mask=md_mask,
            )

    @triton.jit(do_not_specialize=["num_seqs", "split_keys", "num_splits"])
    def _combine_kernel(
        seq_lens_ptr,
        query_start_loc_ptr,
        out_ptr,
        part_acc_ptr,
        part_m_ptr,
        part_l_ptr,
        num_seqs,
        split_keys,
        num_splits,
        stride_ot,
        stride_oh,
        head_dim,
        GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_B: tl.constexpr,
        CAUSAL: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        num_kv_heads = tl.num_programs(1)
        offs_b = tl.arange(0, BLOCK_B)
        ends = tl.load(query_start_loc_ptr + 1 + offs_b, mask=offs_b < num_seqs, other=2**62)
        seq = tl.sum((ends <= row).to(tl.int32), axis=0)
        in_batch = seq < num_seqs
        seq = tl.minimum(seq, num_seqs - 1)
        seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
        if CAUSAL:
            q_end = tl.load(query_start_loc_ptr + 1 + seq).to(tl.int32)
            num_keys = seq_len - (q_end - 1 - row)
        else:
            num_keys = seq_len
        num_keys = tl.where(in_batch, tl.maximum(num_keys, 0), 0)
        used = tl.cdiv(num_keys, split_keys)

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        g_mask = offs_g < GROUP
        gd_mask = g_mask[:, None] & (offs_d < head_dim)[None, :]
        m_run = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_run = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for split in range(0, used):
            part = (row * num_kv_heads + kv_head) * num_splits + split
            m_s = tl.load(part_m_ptr + part * GROUP + offs_g, mask=g_mask, other=0.0)
            l_s = tl.load(part_l_ptr + part * GROUP + offs_g, mask=g_mask, other=0.0)
            a_s = tl.load(part_acc_ptr + (part * GROUP + offs_g[:, None]) * head_dim + offs_d[None, :], mask=gd_mask, other=0.0)
            m_new = tl.maximum(m_run, m_s)
            alpha = tl.exp(m_run - m_new)
            beta = tl.exp(m_s - m_new)
            l_run = l_run * alpha + l_s * beta
            acc = acc * alpha[:, None] + a_s * beta[:, None]
            m_run = m_new
        out = tl.where(l_run[:, None] > 0, acc / l_run[:, None], 0.0)
        heads = kv_head * GROUP + offs_g
        tl.store(
            out_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=gd_mask,
        )


    @triton.jit(do_not_specialize=["num_seqs", "split_keys", "num_splits"])
    def _combine_heads_kernel(
        seq_lens_ptr,
        query_start_loc_ptr,
        out_ptr,
        part_acc_ptr,
        part_m_ptr,
        part_l_ptr,
        num_seqs,
        split_keys,
        num_splits,
        stride_ot,
        stride_oh,
        head_dim,
        GROUP: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_B: tl.constexpr,
        CAUSAL: tl.constexpr,
    ):
        """Numerics.FAST: one program per (token, query head) merges all its splits with one round of
        loads (a tree reduction whose shape follows the launch's split count)."""
        row = tl.program_id(0)
        head = tl.program_id(1)
        num_heads = tl.num_programs(1)
        kv_head = head // GROUP
        g = head % GROUP
        offs_b = tl.arange(0, BLOCK_B)
        ends = tl.load(query_start_loc_ptr + 1 + offs_b, mask=offs_b < num_seqs, other=2**62)
        seq = tl.sum((ends <= row).to(tl.int32), axis=0)
        in_batch = seq < num_seqs
        seq = tl.minimum(seq, num_seqs - 1)
        seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
        if CAUSAL:
            q_end = tl.load(query_start_loc_ptr + 1 + seq).to(tl.int32)
            num_keys = seq_len - (q_end - 1 - row)
        else:
            num_keys = seq_len
        num_keys = tl.where(in_batch, tl.maximum(num_keys, 0), 0)
        used = tl.cdiv(num_keys, split_keys)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        s_mask = offs_s < used
        part = ((row * (num_heads // GROUP) + kv_head) * num_splits + offs_s) * GROUP + g
        m_s = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
        l_s = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
        a_s = tl.load(
            part_acc_ptr + part[:, None] * head_dim + offs_d[None, :],
            mask=s_mask[:, None] & (offs_d < head_dim)[None, :],
            other=0.0,
        )
        m_max = tl.max(m_s, axis=0)
        weight = tl.where(s_mask, tl.exp(m_s - m_max), 0.0)
        total = tl.sum(weight * l_s, axis=0)
        acc = tl.sum(weight[:, None] * a_s, axis=0)
        out = tl.where(total > 0, acc / total, 0.0)
        tl.store(
            out_ptr + row * stride_ot + head * stride_oh + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=offs_d < head_dim,
        )


# The kernels find a row's sequence among BLOCK_B sequence ends. A floor of 64 keeps every batch of up to
# 64 sequences on one compiled variant: with BLOCK_B the next power of two, an eager drafter pass (its
# variant is not one that graph capture compiles) stalled about a second in Triton's compiler at each new
# power of two of running requests (reports/heads-gpu.md). 64 ends are 512 bytes a program, beside its keys.
MIN_BLOCK_B = 64


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def block_m(group: int) -> int:
    """Query slots of one split program: a function of the model alone, never of the batch, so every
    launch (decode, verify, prefill) runs the same tile shapes and a row's bits do not depend on its
    neighbours (invariant 52). Room for VERIFY_ROWS rows of the group, within MAX_BLOCK_M."""
    return max(16, _next_pow2(group), min(MAX_BLOCK_M, _next_pow2(group * VERIFY_ROWS)))


def rows_per_program(group: int) -> int:
    return block_m(group) // group


def num_row_blocks(num_tokens: int, num_seqs: int, rows: int) -> int:
    """The split kernel's first grid dimension: a bound, from shapes alone (a captured graph keeps it), on
    the windows of `rows` positions that the sequences' rows touch (q rows touch at most
    (q + 2 * rows - 2) // rows, each at least one row); programs past the real windows exit."""
    return max(1, min(num_tokens, (num_tokens + num_seqs * (2 * rows - 2)) // rows))


def kv_bytes_read(
    query_lens: list[int], seq_lens: list[int], num_kv_heads: int, head_dim: int, dtype_bytes: int, rows: int
) -> int:
    """Bytes of K and V that one layer's split kernel reads for a causal step, from its launch grid: each
    program reads its longest row's keys once (the splits partition them), and a program holds the
    sequence's rows within one window of `rows` positions. `rows=1`: a program per token, the kernel
    before invariant 52."""
    keys = 0
    for q_len, seq_len in zip(query_lens, seq_lens, strict=True):
        first = max(seq_len - q_len, 0)
        for position in range(first, first + q_len):
            if position == first + q_len - 1 or (position + 1) % rows == 0:  # the last row of its window
                keys += max(0, seq_len - (first + q_len - 1 - position))
    return keys * num_kv_heads * head_dim * dtype_bytes * 2


def split_plan(
    num_blocks: int, num_kv_heads: int, max_keys: int, numerics: Numerics, num_sms: int
) -> tuple[int, int]:
    """(split_keys, num_splits) for a launch of `num_blocks` row blocks whose rows have at most `max_keys` keys.

    `max_keys` comes from the block table's width, a shape, so a captured graph keeps its plan."""
    max_keys = max(max_keys, 1)
    if numerics is Numerics.BATCH_INVARIANT:
        split_keys = INVARIANT_SPLIT_KEYS
    else:
        programs = num_blocks * num_kv_heads
        wanted_splits = max(1, (_PROGRAMS_PER_SM * num_sms) // max(programs, 1))
        split_keys = -(-max_keys // wanted_splits)
        split_keys = -(-split_keys // BLOCK_N) * BLOCK_N
    num_splits = -(-max_keys // split_keys)
    return split_keys, num_splits


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor if tensor.device == device else tensor.to(device, non_blocking=True)


def triton_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: LayerKVCache,
    meta: AttentionMetadata,
    scale: float,
    numerics: Numerics,
) -> torch.Tensor:
    """Same contract as `attention.paged_attention`, without host synchronisation.

    Only shapes are checked here (values would need a device-to-host read); the reference path
    checks the values."""
    with on_device(q.device):  # the kernels launch on the current device: make it q's
        return _paged_attention(q, k, v, cache, meta, scale, numerics)


def _paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: LayerKVCache,
    meta: AttentionMetadata,
    scale: float,
    numerics: Numerics,
) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("the Triton attention backend needs the `triton` package (extra `gpu`)")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    num_seqs = meta.seq_lens.shape[0]
    if meta.slot_mapping.shape[0] != num_tokens or meta.query_start_loc.shape[0] != num_seqs + 1:
        raise ModelInputError(
            f"attention metadata has {meta.slot_mapping.shape[0]} slots and {meta.query_start_loc.shape[0] - 1} "
            f"sequences for {num_tokens} tokens and {num_seqs} seq_lens"
        )
    if k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1:
        raise ModelInputError("q, k and v need a contiguous last dimension")
    device = q.device
    key_cache, value_cache = cache.key, cache.value
    if key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1:
        raise ModelInputError("key and value caches need the same contiguous layout")
    page = key_cache.shape[1]
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    slot_mapping = _on(meta.slot_mapping, device)
    query_start_loc = _on(meta.query_start_loc, device)
    seq_lens = _on(meta.seq_lens, device)
    block_tables = _on(meta.block_tables, device)
    if block_tables.shape[1] == 0 or block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous() if block_tables.shape[1] else block_tables.new_zeros(num_seqs, 1)

    block_d = max(16, _next_pow2(head_dim))
    _store_kv_kernel[(num_tokens,)](
        k, v, key_cache, value_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        num_kv_heads, head_dim,
        PAGE=page, BLOCK_H=_next_pow2(num_kv_heads), BLOCK_D=block_d,
    )  # fmt: skip

    group = num_heads // num_kv_heads
    rows = rows_per_program(group)
    num_blocks = num_row_blocks(num_tokens, num_seqs, rows)
    max_keys = block_tables.shape[1] * page
    split_keys, num_splits = split_plan(num_blocks, num_kv_heads, max_keys, numerics, _num_sms(device))
    direct = num_splits == 1
    if direct:
        part_acc = part_m = part_l = out  # unused
    else:
        part_acc = torch.empty(num_tokens * num_kv_heads * num_splits * group * head_dim, dtype=torch.float32, device=device)
        part_m = torch.empty(num_tokens * num_kv_heads * num_splits * group, dtype=torch.float32, device=device)
        part_l = torch.empty_like(part_m)
    common = {
        "GROUP": group,
        "BLOCK_D": block_d,
        "BLOCK_B": max(MIN_BLOCK_B, _next_pow2(num_seqs)),
        "CAUSAL": bool(meta.causal),
    }
    _split_kernel[(num_blocks, num_kv_heads, num_splits)](
        q, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        out, part_acc, part_m, part_l,
        scale, num_seqs, split_keys, num_splits,
        q.stride(0), q.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), head_dim,
        ROWS=rows, PAGE=page, BLOCK_M=block_m(group), BLOCK_N=BLOCK_N, DIRECT=direct, IEEE=q.dtype == torch.float32,
        **common,
    )  # fmt: skip
    if not direct and numerics is not Numerics.BATCH_INVARIANT:
        _combine_heads_kernel[(num_tokens, num_heads)](
            seq_lens, query_start_loc, out, part_acc, part_m, part_l,
            num_seqs, split_keys, num_splits,
            out.stride(0), out.stride(1), head_dim,
            GROUP=group, BLOCK_S=max(64, _next_pow2(num_splits)), BLOCK_D=block_d, BLOCK_B=common["BLOCK_B"],
            CAUSAL=common["CAUSAL"],
        )  # fmt: skip
    elif not direct:
        _combine_kernel[(num_tokens, num_kv_heads)](
            seq_lens, query_start_loc, out, part_acc, part_m, part_l,
            num_seqs, split_keys, num_splits,
            out.stride(0), out.stride(1), head_dim,
            BLOCK_G=max(16, _next_pow2(group)), **common,
        )  # fmt: skip
    return out
