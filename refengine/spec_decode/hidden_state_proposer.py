"""The drafter loop shared by the heads that read the target's hidden states: EAGLE, EAGLE3 and MTP.

Pass 1 runs the head over every row the step fed (vLLM's padded drafter batch), each request's last
committed row chosen on the device; passes 2..k feed each draft with the head's own previous output and
replay as one CUDA graph per padded batch size. The drafts reach the host once, after the last pass.
Design: docs/design/spec-decode.md (the drafters).
"""

from typing import Protocol

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import uniform_query_metadata
from refengine.spec_decode.fixed_shape_proposer import FixedShapeProposer
from refengine.spec_decode.proposer import PaddedDraftBatch, ProposalInputs


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
    # Draft s (s >= 2) is sampled from a row at last_position + s - 1, which needs a slot and a
    # position; draft 1 comes from the last committed row.
    extra_slots = 0

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

    def ingest(self, batch: PaddedDraftBatch, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Pass 1 over every fed row: the row at position p gets the token after p and the target's row
        at p."""
        layers = self.network.capture_layers
        source = (
            torch.cat([batch.aux_hidden_states[i] for i in layers], dim=-1) if layers else batch.hidden_states
        )
        features = torch.cat([source[d.rows] for d in batch.requests])
        return self.network.forward(batch.input_ids, self.network.combine(features), positions, meta)

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """Drafts 1..k of each request from its last committed output row. Pass s (2..k) feeds draft
        s - 1 and pass s - 1's output row at position starts + s - 2; a request that wants fewer than s
        drafts sits that pass out as padding (no KV written), so every pass has the batch's shape."""
        rows = inputs.hidden
        tokens = [self.network.greedy_tokens(rows)]
        num_seqs, num_passes = inputs.num_seqs, self.k - 1
        # Every later pass's metadata in one call, pass s's requests at entries s * B .. (s + 1) * B: a
        # call per pass launched about a dozen small kernels each, a share of a small target's step.
        # On the CPU every tensor is there anyway: only a GPU test can tell a device left out.
        passes = torch.arange(num_passes, device=inputs.starts.device)[:, None]  # pragma: no mutate
        meta, positions = uniform_query_metadata(
            (inputs.starts[None, :] + passes).flatten(),
            (inputs.num_drafts[None, :] > passes + 1).long().flatten(),
            inputs.block_tables.expand(num_passes, -1, -1).flatten(0, 1),
            self.block_size,
            num_query=1,
        )
        for step in range(num_passes):
            part = slice(step * num_seqs, (step + 1) * num_seqs)
            # One query row per sequence: causal, the default, as uniform_query_metadata builds it.
            pass_meta = AttentionMetadata(
                meta.query_start_loc[: num_seqs + 1], meta.seq_lens[part], inputs.block_tables, meta.slot_mapping[part]
            )
            rows = self.network.forward(tokens[-1], rows, positions[part], pass_meta)
            tokens.append(self.network.greedy_tokens(rows))
        return torch.stack(tokens, dim=1)
