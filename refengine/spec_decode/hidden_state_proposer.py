"""The drafter loop shared by the heads that read the target's hidden states: EAGLE, EAGLE3 and MTP.

Pass 1 runs the head over a request's committed rows: the row at position p gets token_ids[p + 1]
and the target's hidden state at p, so the head's KV at p is built from (token p + 1, hidden p); the
last row's input is the just-sampled token, and its output gives draft 1. Pass s (2..k) feeds draft
s - 1 with the head's own output row from the previous pass, one position further on. The head's KV
past the committed rows is overwritten next step, when pass 1 starts again at the target's exact
computed position. The drafts stay on the device from pass to pass and reach the host once, after the
last pass: one wait per step, not one per draft.
"""

from typing import Protocol

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.spec_decode.network_proposer import NetworkProposer
from refengine.spec_decode.proposer import DraftBatch, DraftInput
from refengine.worker.attention_metadata_builder import build_attention_metadata


class HiddenDraftNetwork(Protocol):
    """A head as the drafter drives it (the teacher drafter in the tests stands in here)."""

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """Target layers whose outputs, concatenated, are the head's input; () for the final hidden."""
        ...

    def combine(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Target features of the committed rows -> the head's hidden input (EAGLE3's fc)."""
        ...

    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Write the rows' KV; return output rows, each both the next pass's hidden input and what
        greedy_tokens reads."""
        ...

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor: ...


class HiddenStateProposer(NetworkProposer):
    network: HiddenDraftNetwork

    def __init__(
        self,
        network: HiddenDraftNetwork,
        method: str,
        num_speculative_tokens: int,
        block_size: int,
        max_positions: int,
        *,
        random_init: bool,
    ) -> None:
        self.method = method  # eagle, eagle3 or mtp
        super().__init__(network, num_speculative_tokens, block_size, max_positions, random_init=random_init)

    def propose(self, batch: DraftBatch) -> dict[str, list[int]]:
        requests = batch.requests
        for d in requests:
            self.context.advance(d.req_id, d.first_position, d.num_valid_rows)
        layers = self.network.capture_layers
        source = (
            torch.cat([batch.aux_hidden_states[i] for i in layers], dim=-1) if layers else batch.hidden_states
        )
        features = torch.cat([source[d.rows] for d in requests])
        ids = [t for d in requests for t in d.token_ids[d.first_position + 1 : d.last_position + 2]]
        positions = [p for d in requests for p in range(d.first_position, d.last_position + 1)]
        meta = build_attention_metadata(
            [d.first_position for d in requests],
            [d.num_valid_rows for d in requests],
            [d.block_ids for d in requests],
            self.block_size,
        )
        out = self.network.forward(
            torch.tensor(ids, dtype=torch.long),
            self.network.combine(features),
            torch.tensor(positions, dtype=torch.long),
            meta,
        )
        wanted = {d.req_id: self._num_drafts(d) for d in requests if d.propose}
        last_row = dict(
            zip((d.req_id for d in requests), (meta.query_start_loc[1:] - 1).tolist(), strict=True)
        )
        proposing = [d for d in requests if wanted.get(d.req_id, 0) > 0]
        drafts: dict[str, list[int]] = {r: [] for r in wanted}
        if not proposing:
            return drafts
        rows = out[[last_row[d.req_id] for d in proposing]]
        passes: list[tuple[list[DraftInput], torch.Tensor]] = []  # each pass's requests and drafts, on the device
        for step in range(self.k):
            tokens = self.network.greedy_tokens(rows)
            passes.append((proposing, tokens))
            keep = [i for i, d in enumerate(proposing) if wanted[d.req_id] > step + 1]
            if not keep:
                break
            proposing = [proposing[i] for i in keep]
            # Pass step + 2: draft step + 1 at last_position + step + 1, with the head's own output row.
            starts = [d.last_position + step + 1 for d in proposing]
            rows = self.network.forward(
                tokens[keep],
                rows[keep],
                torch.tensor(starts, dtype=torch.long),
                build_attention_metadata(
                    starts, [1] * len(proposing), [d.block_ids for d in proposing], self.block_size
                ),
            )
        self.num_readbacks += 1
        host = iter(torch.cat([t for _, t in passes]).tolist())
        for drafted, _ in passes:
            for d in drafted:
                drafts[d.req_id].append(next(host))
        return drafts

    def _num_drafts(self, d: DraftInput) -> int:
        """Draft s (s >= 2) is sampled from a row at last_position + s - 1, which needs a slot and a
        position; draft 1 comes from the last committed row."""
        limit = min(len(d.block_ids) * self.block_size, self.max_positions)
        return max(0, min(self.k, limit - d.last_position))
