"""draft_model: a separate causal model with its own paged KV, run autoregressively k times.

The draft KV uses the target's block ids (the KV manager reserves k lookahead slots past the scheduled
tokens), so it needs no allocator of its own. A self-draft is the target's first layers plus its final
norm and lm_head: it shares the target's weights and only owns its KV.
"""

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import Transformer
from refengine.spec_decode.network_proposer import NetworkProposer
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch


class TokenDraftNetwork(Protocol):
    """The draft model as the drafter drives it (the teacher drafter in the tests stands in here)."""

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Write the rows' KV and return their output rows, `[T, ...]`."""
        ...

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        """Output rows -> the argmax next token of each, `[N]`."""
        ...


class LayerStackNetwork:
    """The first `num_layers` layers of a Transformer, then its final norm and lm_head, over `kv_cache`
    (one entry per layer run). With all layers it is the model itself: a separate draft model."""

    def __init__(self, model: Transformer, num_layers: int, kv_cache: KVCache) -> None:
        if not 1 <= num_layers <= len(model.layers):
            raise ValueError(
                f"draft model: num_draft_layers must be in 1..{len(model.layers)}, got {num_layers}"
            )
        if len(kv_cache.layers) != num_layers:
            raise ValueError(
                f"draft KV cache has {len(kv_cache.layers)} layers for {num_layers} draft layers"
            )
        self.model = model
        self.layers = list(model.layers)[:num_layers]
        self.kv_cache = kv_cache

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.model.embed(input_ids)
        for layer, cache in zip(self.layers, self.kv_cache.layers, strict=True):
            hidden = layer(positions, hidden, meta, cache)
        return self.model.norm(hidden)

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(out).argmax(dim=-1)


class DraftModelProposer(NetworkProposer):
    """Per step: ingest the committed rows (token_ids[p] at position p), then feed the just-sampled
    token at last_position + 1 and draft k tokens autoregressively. A request whose draft positions run
    past its blocks or the draft model's context gets fewer drafts, which stays lossless."""

    method = "draft_model"
    network: TokenDraftNetwork
    capture_layers: tuple[int, ...] = ()  # it reads tokens, not the target's hidden states

    @property
    def modules(self) -> tuple[nn.Module, ...]:
        return (self.network.model,)  # a plain holder of the draft model's layers

    def propose(self, batch: PaddedDraftBatch) -> None:
        """Nothing before the host knows what was accepted: each pass reads the previous one's token
        back (sync scheduling only), so the whole chain runs in commit."""

    def commit(self, requests: Sequence[DraftInput], drafts: None) -> dict[str, list[int]]:
        wanted: dict[str, int] = {}  # drafts each proposing request has room for
        for d in requests:
            self.context.advance(d.req_id, d.first_position, d.num_valid_rows, d.context_start)
            if d.propose:
                wanted[d.req_id] = self._num_drafts(d)
        # Pass 1: the committed rows, plus the just-sampled token where the request drafts.
        rows = [
            tuple(d.token_ids[d.first_position : d.last_position + 1 + (wanted.get(d.req_id, 0) > 0)])
            for d in requests
        ]
        sampled = self._run(rows, [d.first_position for d in requests], [d.block_ids for d in requests])
        proposed = {d.req_id: [tok] for d, tok in zip(requests, sampled, strict=True) if wanted.get(d.req_id, 0)}
        by_id = {d.req_id: d for d in requests}
        # Pass s + 1 feeds draft s at last_position + 1 + s.
        for step in range(1, self.k):
            active = [r for r in proposed if wanted[r] > step]
            if not active:
                break
            sampled = self._run(
                [(proposed[r][-1],) for r in active],
                [by_id[r].last_position + 1 + step for r in active],
                [by_id[r].block_ids for r in active],
            )
            for r, tok in zip(active, sampled, strict=True):
                proposed[r].append(tok)
        return {r: proposed.get(r, []) for r in wanted}

    def _num_drafts(self, d: DraftInput) -> int:
        """Draft s is sampled from a row at last_position + s, which needs a slot and a position."""
        limit = min(len(d.block_ids) * self.block_size, self.max_positions)
        return max(0, min(self.k, limit - d.last_position - 1))

    def _run(
        self, ids: list[tuple[int, ...]], starts: list[int], block_ids: list[tuple[int, ...]]
    ) -> list[int]:
        """One batched call, request b's rows at positions starts[b]..; the token sampled at each
        request's last row."""
        meta = build_attention_metadata(starts, [len(row) for row in ids], block_ids, self.block_size)
        input_ids = torch.tensor([t for row in ids for t in row], dtype=torch.long)
        positions = torch.tensor(
            [s + i for s, row in zip(starts, ids, strict=True) for i in range(len(row))], dtype=torch.long
        )
        out = self.network.forward(input_ids, positions, meta)
        last_rows = (meta.query_start_loc[1:] - 1).tolist()
        self.num_readbacks += 1
        return self.network.greedy_tokens(out[last_rows]).tolist()
