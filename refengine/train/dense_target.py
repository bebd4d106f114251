"""The target's forward over a dense batch cache: the data generator's fast path.

The engine's paged forward attends one sequence at a time, which on a small CPU costs more in
Python than the matrix products it wraps. Generating distillation data needs no paging: B sequences
keep keys and values in `[B, Hkv, max_len, D]`. Projections and MLPs run on the packed rows that
are really fed (a long prompt and a one-token decode share a call without padding); only attention
lays the rows out as `[B, rows, ...]`, with one masked product per layer. The arithmetic is the
target's own (its weights, norms and rotary tables), checked against `Transformer.forward` in the
tests.
"""

import torch

from refengine.model.transformer import Transformer


class DenseTarget:
    def __init__(self, model: Transformer, batch: int, max_len: int) -> None:
        config = model.config
        self.model = model
        self.batch = batch
        self.max_len = max_len
        shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
        weight = model.embed_tokens.weight
        self.keys = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in model.layers]
        self.values = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in model.layers]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_ids: torch.Tensor,
        capture: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Packed rows `[N]`: row r is sequence seq_ids[r]'s token at positions[r]; a sequence's rows
        are contiguous and in position order. Returns the final-norm output `[N, H]` and layer i's
        output for i in `capture`."""
        counts = torch.bincount(seq_ids, minlength=self.batch)
        starts = torch.cumsum(counts, 0) - counts
        device = seq_ids.device
        slot = torch.arange(len(seq_ids), device=device) - starts[seq_ids]  # the row's index within its sequence
        num_rows, num_keys = int(counts.max()), int(positions.max()) + 1
        row_positions = torch.full((self.batch, num_rows), -1, dtype=torch.long, device=device)
        row_positions[seq_ids, slot] = positions
        # Query (b, s) sees keys 0..its position; padding queries (position -1) see none and are dropped.
        visible = torch.arange(num_keys, device=device)[None, None, :] <= row_positions[:, :, None]
        layout = (seq_ids, slot, positions, num_rows, num_keys, visible)
        hidden = self.model.embed(input_ids)
        aux = {}
        for index, layer in enumerate(self.model.layers):
            hidden = hidden + self._attention(layer.self_attn, layer.input_layernorm(hidden), index, layout)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if index in capture:
                aux[index] = hidden
        return self.model.norm(hidden), aux

    def _attention(self, attn, x: torch.Tensor, index: int, layout) -> torch.Tensor:
        seq_ids, slot, positions, num_rows, num_keys, visible = layout
        q_size, kv_size = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        q, k, v = attn.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, attn.num_heads, attn.head_dim)
        k = k.reshape(-1, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = attn.rotary(positions, q, k)
        self.keys[index][seq_ids, :, positions] = k
        self.values[index][seq_ids, :, positions] = v.reshape(-1, attn.num_kv_heads, attn.head_dim)
        # Grouped-query attention as plain batched products over the keys written so far (the fused
        # CPU kernel is several times slower for one query row per sequence).
        group = attn.num_heads // attn.num_kv_heads
        padded = q.new_zeros(self.batch, num_rows, attn.num_heads, attn.head_dim)
        padded[seq_ids, slot] = q
        padded = padded.reshape(self.batch, num_rows, attn.num_kv_heads, group, attn.head_dim)
        padded = padded.permute(0, 2, 3, 1, 4).flatten(2, 3)  # [B, Hkv, group * rows, D]
        keys, values = self.keys[index][:, :, :num_keys], self.values[index][:, :, :num_keys]
        scores = torch.matmul(padded, keys.transpose(-1, -2)) * attn.head_dim**-0.5
        scores = scores.reshape(self.batch, attn.num_kv_heads, group, num_rows, num_keys)
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).nan_to_num_(0.0).to(values.dtype).flatten(2, 3)
        out = torch.matmul(probs, values).reshape(
            self.batch, attn.num_kv_heads, group, num_rows, attn.head_dim
        )
        out = out.permute(0, 3, 1, 2, 4)[seq_ids, slot]  # [N, Hkv, group, D]
        return attn.o_proj(out.reshape(-1, q_size))
