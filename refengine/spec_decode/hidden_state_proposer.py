"""The drafter loop shared by the heads that read the target's hidden states: EAGLE, EAGLE3 and MTP.

Pass 1 runs the head over a request's committed rows: the row at position p gets token_ids[p + 1]
and the target's hidden state at p, so the head's KV at p is built from (token p + 1, hidden p); the
last row's input is the just-sampled token, and its output gives draft 1. Pass s (2..k) feeds draft
s - 1 with the head's own output row from the previous pass, one position further on. The head's KV
past the committed rows is overwritten next step, when pass 1 starts again at the target's exact
computed position. The drafts stay on the device from pass to pass and reach the host once, after the
last pass: one wait per step, not one per draft.

Pass 1 has as many rows as the step committed and runs eagerly; passes 2..k (`draft`) have one row per
request, so once the engine has captured them they replay as one CUDA graph per padded batch size.
"""

from typing import Protocol

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.spec_decode.draft_cuda_graphs import ProposalInputs
from refengine.spec_decode.fixed_shape_proposer import FixedShapeProposer
from refengine.spec_decode.network_proposer import to_device
from refengine.spec_decode.proposer import DraftBatch, DraftInput
from refengine.worker.attention_metadata_builder import build_attention_metadata, uniform_query_metadata


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


class HiddenStateProposer(FixedShapeProposer):
    network: HiddenDraftNetwork
    reads_hidden = True

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
        device = features.device
        out = self.network.forward(
            to_device(torch.tensor(ids, dtype=torch.long), device),
            self.network.combine(features),
            to_device(torch.tensor(positions, dtype=torch.long), device),
            to_device(meta, device),
        )
        wanted = {d.req_id: self._num_drafts(d) for d in requests if d.propose}
        drafts: dict[str, list[int]] = {r: [] for r in wanted}
        index = [i for i, d in enumerate(requests) if wanted.get(d.req_id, 0) > 0]
        if not index:
            return drafts
        proposing = [requests[i] for i in index]
        last_rows = (meta.query_start_loc[1:] - 1)[index]
        inputs = ProposalInputs(
            tokens=torch.tensor([d.token_ids[d.last_position + 1] for d in proposing], dtype=torch.long),
            starts=torch.tensor([d.last_position + 1 for d in proposing], dtype=torch.long),
            num_drafts=torch.tensor([wanted[d.req_id] for d in proposing], dtype=torch.long),
            block_tables=meta.block_tables[index],
            hidden=out[to_device(last_rows, device)],
        )
        tokens = self._run_draft(inputs, device)
        self.num_readbacks += 1
        for d, row in zip(proposing, tokens.tolist(), strict=True):
            drafts[d.req_id] = row[: wanted[d.req_id]]
        return drafts

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """Drafts 1..k of each request from its last committed output row. Pass s (2..k) feeds draft
        s - 1 and pass s - 1's output row at position starts + s - 2; a request that wants fewer than s
        drafts sits that pass out as padding (no KV written), so every pass has the batch's shape."""
        rows = inputs.hidden
        tokens = [self.network.greedy_tokens(rows)]
        for step in range(self.k - 1):
            meta, positions = uniform_query_metadata(
                inputs.starts + step,
                (inputs.num_drafts > step + 1).long(),
                inputs.block_tables,
                self.block_size,
                num_query=1,
            )
            rows = self.network.forward(tokens[-1], rows, positions, meta)
            tokens.append(self.network.greedy_tokens(rows))
        return torch.stack(tokens, dim=1)

    def _num_drafts(self, d: DraftInput) -> int:
        """Draft s (s >= 2) is sampled from a row at last_position + s - 1, which needs a slot and a
        position; draft 1 comes from the last committed row."""
        limit = min(len(d.block_ids) * self.block_size, self.max_positions)
        return max(0, min(self.k, limit - d.last_position))
