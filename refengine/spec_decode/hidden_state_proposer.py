"""The drafter loop shared by the heads that read the target's hidden states: EAGLE, EAGLE3 and MTP.

Pass 1 runs the head over a request's fed rows: the row at position p gets token_ids[p + 1]
and the target's hidden state at p, so the head's KV at p is built from (token p + 1, hidden p); the
last row's input is the just-sampled token, and its output gives draft 1. Pass s (2..k) feeds draft
s - 1 with the head's own output row from the previous pass, one position further on. The head's KV
past the committed rows is overwritten next step, when pass 1 starts again at the target's exact
computed position. The drafts stay on the device from pass to pass and reach the host once, after the
last pass: one wait per step, not one per draft.

Pass 1 runs over every row the step fed, rejected drafts included (vLLM's padded drafter batch): each
request's last committed row is chosen on the device from its count of rejected rows, so drafting
needs no read-back of the verified ids, and the runner reads tokens, accepted counts and drafts back
together, once (propose_padded, then take_drafts on the host). Pass 1 runs eagerly; passes 2..k
(`draft`) have one row per request, so once the engine has captured them they replay as one CUDA
graph per padded batch size.
"""

from collections.abc import Sequence
from typing import Protocol

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.spec_decode.draft_cuda_graphs import ProposalInputs
from refengine.spec_decode.fixed_shape_proposer import FixedShapeProposer
from refengine.spec_decode.network_proposer import to_device
from refengine.spec_decode.proposer import DraftBatch, DraftContextError, DraftInput, PaddedDraftBatch
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
        """Drafts from a batch whose rows are all committed: the padded path with nothing rejected, and
        the drafts read back here (a host drafter's protocol; the runner takes the padded path)."""
        requests = batch.requests
        ids = [t for d in requests for t in d.token_ids[d.first_position + 1 : d.last_position + 2]]
        device = batch.hidden_states.device
        num_proposing = sum(d.propose for d in requests)
        padded = PaddedDraftBatch(
            requests,
            to_device(torch.tensor(ids, dtype=torch.long), device),
            torch.zeros(num_proposing, dtype=torch.long, device=device),
            batch.hidden_states,
            batch.aux_hidden_states,
        )
        drafts = self.propose_padded(padded)
        self.num_readbacks += 1
        return self.take_drafts(requests, drafts.tolist())

    def propose_padded(self, batch: PaddedDraftBatch) -> torch.Tensor:
        """[P, k] drafts on the device, one row per proposing request, without reading anything back.
        Pass 1 runs over every fed row; each request's last committed row (its last fed row less its
        rejected ones, vLLM's token_indices_to_sample) is chosen on the device and feeds `draft`. A row's
        drafts past what its request can hold are cut by take_drafts once the host knows the counts."""
        requests = batch.requests
        layers = self.network.capture_layers
        source = (
            torch.cat([batch.aux_hidden_states[i] for i in layers], dim=-1) if layers else batch.hidden_states
        )
        features = torch.cat([source[d.rows] for d in requests])
        positions = [p for d in requests for p in range(d.first_position, d.last_position + 1)]
        meta = build_attention_metadata(
            [d.first_position for d in requests],
            [d.num_valid_rows for d in requests],
            [d.block_ids for d in requests],
            self.block_size,
        )
        device = features.device
        out = self.network.forward(
            batch.input_ids,
            self.network.combine(features),
            to_device(torch.tensor(positions, dtype=torch.long), device),
            to_device(meta, device),
        )
        index = [i for i, d in enumerate(requests) if d.propose]
        if not index:
            return torch.zeros(0, self.k, dtype=torch.long, device=device)
        proposing = [requests[i] for i in index]
        # Per request: its last fed row and position, and how far its blocks and the head reach.
        host = torch.tensor(
            [
                [int(meta.query_start_loc[i + 1]) - 1 for i in index],
                [d.last_position for d in proposing],
                [min(len(d.block_ids) * self.block_size, self.max_positions) for d in proposing],
            ],
            dtype=torch.long,
        )
        last_fed_row, last_fed_position, limit = to_device(host, device)
        token_indices_to_sample = last_fed_row - batch.num_rejected_tokens
        last_position = last_fed_position - batch.num_rejected_tokens
        inputs = ProposalInputs(
            tokens=batch.input_ids[token_indices_to_sample],
            starts=last_position + 1,
            num_drafts=(limit - last_position).clamp(0, self.k),
            block_tables=meta.block_tables[index],
            hidden=out[token_indices_to_sample],
        )
        return self._run_draft(inputs, device)

    def take_drafts(self, requests: Sequence[DraftInput], drafts: list[list[int]]) -> dict[str, list[int]]:
        """The host's side of a padded proposal, once its drafts and the accepted counts have landed:
        `requests` now count only committed rows. Records them as ingested (invariant 26: a context
        that does not continue is refused before its drafts are used) and cuts each proposing request's
        row of `drafts` to what it can hold."""
        for d in requests:
            self.context.advance(d.req_id, d.first_position, d.num_valid_rows)
        proposing = [d for d in requests if d.propose]
        # Invariant: one row of drafts per proposing request, as propose_padded returned them.
        if len(drafts) != len(proposing):
            raise DraftContextError(
                f"{self.method} drafter: {len(drafts)} rows of drafts for {len(proposing)} proposing requests"
            )
        return {d.req_id: row[: self._num_drafts(d)] for d, row in zip(proposing, drafts, strict=True)}

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
