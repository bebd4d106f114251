"""Differentiable forwards of the drafter heads over padded batches: what the trainer optimises.

The heads' own forwards write and read a paged KV cache one request at a time; training restates the
same arithmetic over `[B, T]` batches with the heads' own modules (the tests check both against each
other), unrolled over passes for the hidden-state heads ("training-time test": pass s of row p sees what
the drafter sees when drafts 1..s-1 were right) and as anchored blocks for DFlash.
Design: docs/design/spec-decode.md (the shipped heads and their training).
"""

import torch

from refengine.spec_decode.dflash import DFlashNetwork
from refengine.spec_decode.draft_layer import DraftAttention, DraftDecoderLayer
from refengine.spec_decode.eagle import Eagle3Network, EagleNetwork
from refengine.spec_decode.mtp import MtpNetwork

HiddenHead = EagleNetwork | Eagle3Network | MtpNetwork


def _split_heads(attn: DraftAttention, q, k, v, positions):
    """q/k/v rows `[..., width]` -> rotated `[..., heads, D]` (the heads' q_norm/k_norm applied)."""
    lead = q.shape[:-1]
    q = q.reshape(-1, attn.num_heads, attn.head_dim)
    k = k.reshape(-1, attn.num_kv_heads, attn.head_dim)
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    if attn.k_norm is not None:
        k = attn.k_norm(k)
    q, k = attn.rotary(positions.reshape(-1), q, k)
    return (
        q.reshape(*lead, attn.num_heads, attn.head_dim),
        k.reshape(*lead, attn.num_kv_heads, attn.head_dim),
        v.reshape(*lead, attn.num_kv_heads, attn.head_dim),
    )


def _qkv(attn: DraftAttention, x: torch.Tensor, positions: torch.Tensor):
    q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    return _split_heads(attn, q, k, v, positions)


def _heads_first(t: torch.Tensor, group: int) -> torch.Tensor:
    """`[B, R, Hkv, D]` -> `[B, Hkv * group, R, D]`: kv heads repeated for their query heads."""
    return t.transpose(1, 2).repeat_interleave(group, dim=1)


def unrolled_attention(attn: DraftAttention, q: torch.Tensor, passes: list) -> torch.Tensor:
    """q `[B, T, Hq, D]` of the current pass; passes[0] = pass-1 (k, v) `[B, T, Hkv, D]`, passes[i]
    = pass i+1's. Returns `[B, T, Hq, D]`."""
    group = attn.num_heads // attn.num_kv_heads
    scale = attn.head_dim**-0.5
    num_rows = q.shape[1]
    qh = q.transpose(1, 2)
    k1, v1 = (_heads_first(t, group) for t in passes[0])
    scores = torch.matmul(qh, k1.transpose(-1, -2)) * scale
    causal = torch.ones(num_rows, num_rows, dtype=torch.bool, device=q.device).tril()
    scores = [scores.masked_fill(~causal, float("-inf"))]
    own = [(_heads_first(k, group), _heads_first(v, group)) for k, v in passes[1:]]
    scores += [(qh * k).sum(-1, keepdim=True) * scale for k, _ in own]
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :num_rows], v1)
    for i, (_, v) in enumerate(own):
        out = out + probs[..., num_rows + i : num_rows + i + 1] * v
    return out.transpose(1, 2)


def _layer(layer: DraftDecoderLayer, positions, attn_input, residual, passes: list) -> torch.Tensor:
    attn = layer.self_attn
    q, k, v = _qkv(attn, attn_input, positions)
    passes.append((k, v))
    out = unrolled_attention(attn, q, passes)
    hidden = residual + attn.o_proj(out.flatten(-2))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def num_kv_layers(head: HiddenHead) -> int:
    return len(head.layers) if isinstance(head, EagleNetwork) else 1


def hidden_head_pass(
    head: HiddenHead, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, kv: list[list]
) -> torch.Tensor:
    """One pass over `[B, T]` rows; kv[l] collects layer l's (k, v) of every pass so far. Returns the
    pass's output rows (the next pass's hidden)."""
    embeds = head.target.embed(input_ids)
    if isinstance(head, EagleNetwork):
        h = head.fc(torch.cat([embeds, hidden], dim=-1))
        for layer, passes in zip(head.layers, kv, strict=True):
            h = _layer(layer, positions, layer.pre_norm(h), h, passes)
        return h
    if isinstance(head, Eagle3Network):
        layer = head.layers[0]
        attn_input = torch.cat([layer.pre_norm(embeds), layer.hidden_norm(hidden)], dim=-1)
        return _layer(layer, positions, attn_input, hidden, kv[0])
    x = head.eh_proj(torch.cat([head.enorm(embeds), head.hnorm(hidden)], dim=-1))
    return _layer(head.layer, positions, head.layer.pre_norm(x), x, kv[0])


def final_norm(head: HiddenHead | DFlashNetwork, out: torch.Tensor) -> torch.Tensor:
    """The norm between a head's output rows and the lm_head."""
    return head.shared_head["norm"](out) if isinstance(head, MtpNetwork) else head.norm(out)


def dflash_blocks(
    head: DFlashNetwork, context: torch.Tensor, block_ids: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """context `[B, T, H]` (combined rows at positions 0..T-1), block_ids `[B, N, K+1]` (the block
    [x[L], mask x K] of anchor L = anchors[b, n]). Returns the block rows' outputs `[B, N, K+1, H]`."""
    batch, num_blocks, width = block_ids.shape
    num_ctx = context.shape[1]
    device = anchors.device
    block_positions = anchors[..., None] + torch.arange(width, device=device)
    ctx_positions = torch.arange(num_ctx, device=device).expand(batch, num_ctx)
    # A block at anchor L sees context rows 0..L-1.
    ctx_visible = torch.arange(num_ctx, device=device)[None, None, :] < anchors[..., None]  # [B, N, T]
    h = head.target.embed(block_ids)
    for layer in head.layers:
        attn = layer.self_attn
        group = attn.num_heads // attn.num_kv_heads
        kv = torch.nn.functional.linear(context, attn.qkv_proj.weight[attn.q_size :])
        zeros = kv.new_zeros(*kv.shape[:-1], attn.q_size)
        _, kc, vc = _split_heads(attn, zeros, *kv.split([attn.kv_size, attn.kv_size], dim=-1), ctx_positions)
        q, kb, vb = _qkv(attn, layer.pre_norm(h), block_positions)  # [B, N, K+1, heads, D]
        kc, vc = _heads_first(kc, group), _heads_first(vc, group)  # [B, Hq, T, D]
        qh = q.permute(0, 3, 1, 2, 4)  # [B, Hq, N, K+1, D]
        kb, vb = (t.repeat_interleave(group, dim=3).permute(0, 3, 1, 2, 4) for t in (kb, vb))
        scale = attn.head_dim**-0.5
        ctx_scores = torch.matmul(qh.flatten(2, 3), kc.transpose(-1, -2)) * scale
        ctx_scores = ctx_scores.reshape(batch, attn.num_heads, num_blocks, width, num_ctx)
        ctx_scores = ctx_scores.masked_fill(~ctx_visible[:, None, :, None, :], float("-inf"))
        block_scores = torch.matmul(qh, kb.transpose(-1, -2)) * scale  # [B, Hq, N, K+1, K+1]
        probs = torch.softmax(torch.cat([ctx_scores, block_scores], dim=-1).float(), dim=-1).to(h.dtype)
        out = torch.matmul(probs[..., :num_ctx].flatten(2, 3), vc).reshape(qh.shape)
        out = out + torch.matmul(probs[..., num_ctx:], vb)
        h = h + attn.o_proj(out.permute(0, 2, 3, 1, 4).flatten(-2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h
