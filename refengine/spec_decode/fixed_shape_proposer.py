"""What EAGLE/EAGLE3/MTP and DFlash share: a padded drafter batch (vLLM's), then a proposal of one row
per request whose shapes depend on the batch size alone (`draft`). It declares the device-drafter
capability (proposer.py's DeviceDrafter), so the dispatcher may replay its step or its proposal from
the CUDA graphs of draft_graphs.py; else it runs eagerly.

The drafter takes in every row the step fed (`ingest`), rejected drafts included, before the host knows
what was accepted; each request's last committed row is its last fed row less its rejected ones (vLLM's
token_indices_to_sample), chosen on the device, so drafting reads nothing back. The drafts stay on the
device; their host copy lands one frame late, and `commit` gets the committed counts then.

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Callable, Sequence

import numpy as np
import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.device import to_device
from refengine.spec_decode.network_proposer import NetworkProposer
from refengine.spec_decode.proposer import (
    DraftContextError,
    DraftGraphRunner,
    DraftInput,
    PaddedDraftBatch,
    ProposalInputs,
)


class FixedShapeProposer(NetworkProposer):
    reads_hidden: bool  # whether `draft` reads ProposalInputs.hidden
    # Slots a proposal of n drafts needs past position last_position + n (DFlash's block is two longer).
    extra_slots: int
    # Set once the engine captures the drafter's graphs; until then every proposal runs eagerly.
    graphs: DraftGraphRunner | None = None
    # Proposals replayed from a graph and run eagerly: a test proves which path ran.
    num_graph_steps = 0
    num_eager_steps = 0

    @property
    def device_drafter(self) -> "FixedShapeProposer":
        return self  # the DeviceDrafter capability (proposer.py)

    @property
    def draft_hidden(self) -> tuple[int, torch.dtype] | None:
        return (self.network.config.hidden_size, next(self.network.parameters()).dtype) if self.reads_hidden else None

    def use_graphs(self, graphs: DraftGraphRunner) -> None:
        self.graphs = graphs

    def ingest(self, batch: PaddedDraftBatch, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Take in every fed row of the step (device positions and metadata); return the output rows
        `draft` continues from (one per fed row), or None when it reads none."""
        raise NotImplementedError

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """[B, k] draft ids from device inputs, with tensor ops only (no host read), so that a CUDA
        graph can capture it; a request's drafts past its num_drafts are not used."""
        raise NotImplementedError

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor:
        """[P, k] drafts on the device, one row per proposing request, -1 past what its blocks can hold,
        without reading anything back: the rows' positions come from the device (exact also while the
        host's count is still optimistic), so the drafts are what commit cuts them to. The graph the
        dispatcher chose (`batch.graph`) replays the whole step or the proposal."""
        requests = batch.requests
        device = batch.hidden_states.device
        index = [i for i, d in enumerate(requests) if d.propose]
        ends = np.cumsum([d.num_valid_rows for d in requests])
        proposing = [requests[i] for i in index]
        # Per request: its sequence in the batch, its last fed row, and how far its blocks and the head
        # reach; in one non-blocking copy (a list index would be a blocking one, a wait for the device).
        host = torch.tensor(
            [
                index,
                [int(ends[i]) - 1 for i in index],
                [self.position_limit(d.block_ids) for d in proposing],
            ],
            dtype=torch.long,
        )
        sequence, last_fed_row, limit = to_device(host, device)
        graph = batch.graph
        if graph is not None and graph.whole_step:
            self.num_graph_steps += 1
            return self.graphs.run_step(batch, limit, graph.padded)
        if not index:
            self.ingest(batch, batch.positions, batch.attn_metadata)
            return torch.zeros(0, self.k, dtype=torch.long, device=device)
        return self.draft_step(batch, sequence, last_fed_row, limit, lambda inputs: self._run_draft(inputs, graph))

    def draft_step(
        self, batch: PaddedDraftBatch, sequence: torch.Tensor, last_fed_row: torch.Tensor, limit: torch.Tensor,
        draft: Callable[[ProposalInputs], torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        """Pass 1 over every fed row, then the proposal: the eager way and the step's graph alike."""
        return self.drafts_from(batch, self.ingest(batch, batch.positions, batch.attn_metadata), sequence, last_fed_row, limit, draft)

    def drafts_from(
        self,
        batch: PaddedDraftBatch,
        out: torch.Tensor | None,
        sequence: torch.Tensor,
        last_fed_row: torch.Tensor,
        limit: torch.Tensor,
        draft: Callable[[ProposalInputs], torch.Tensor],
    ) -> torch.Tensor:
        """The proposal after pass 1 (`out`, one output row per fed row): from each proposing request's
        last committed row (its last fed row less its rejected ones), with tensor ops only, so that a
        CUDA graph can capture it with pass 1."""
        token_indices_to_sample = last_fed_row - batch.num_rejected_tokens
        last_position = batch.positions[token_indices_to_sample]
        num_drafts = (limit - last_position - self.extra_slots).clamp(0, self.k)
        inputs = ProposalInputs(
            tokens=batch.input_ids[token_indices_to_sample],  # the last sampled token
            starts=last_position + 1,
            num_drafts=num_drafts,
            block_tables=batch.attn_metadata.block_tables[sequence],
            hidden=None if out is None else out[token_indices_to_sample],
        )
        drafts = draft(inputs)
        slots = torch.arange(self.k, device=drafts.device)[None, :]
        # -1: the sampler's placeholder, which verification always rejects.
        return torch.where(slots < num_drafts[:, None], drafts, -1)

    def commit(self, requests: Sequence[DraftInput], drafts: list[list[int]]) -> dict[str, list[int]]:
        """The host's side of a padded proposal, once its drafts and the accepted counts have landed:
        `requests` now count committed rows only. Records them as ingested (invariant 26: a context that
        does not continue is refused before its drafts are used) and cuts each proposing request's row
        of `drafts` to what it can hold."""
        for d in requests:
            self.context.advance(d.req_id, d.first_position, d.num_valid_rows, d.context_start)
        proposing = [d for d in requests if d.propose]
        # Invariant 30: one row of drafts per proposing request, as propose returned them.
        if len(drafts) != len(proposing):
            raise DraftContextError(
                f"{self.method} drafter: {len(drafts)} rows of drafts for {len(proposing)} proposing requests"
            )
        return {d.req_id: row[: self._num_drafts(d)] for d, row in zip(proposing, drafts, strict=True)}

    def _num_drafts(self, d: DraftInput) -> int:
        return max(0, min(self.k, self.position_limit(d.block_ids) - d.last_position - self.extra_slots))

    def position_limit(self, block_ids: Sequence[int]) -> int:
        """How far a request's drafts may reach: the slots its blocks hold, within the head's positions."""
        return min(len(block_ids) * self.block_size, self.max_positions)

    def _run_draft(self, inputs: ProposalInputs, graph) -> torch.Tensor:
        if graph is not None:
            self.num_graph_steps += 1
            return self.graphs.run_proposal(inputs, graph.padded)
        self.num_eager_steps += 1
        return self.draft(inputs)
