"""A device drafter's graphs per padded batch size (docs/design/cuda-graphs.md): its whole step after a
uniform verify step (k + 1 fed rows a request), and its proposal alone after an eager pass 1. Both run
the drafter's own `draft_step` and `draft`; padded rows write no KV (slot -1), attend over nothing
(seq_len 0) and want no drafts (limit 0)."""

from __future__ import annotations

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.graphs import GraphPool, GraphSet
from refengine.model.static_buffers import BufferSet, Field
from refengine.spec_decode.proposer import DeviceDrafter, DraftInput, PaddedDraftBatch, ProposalInputs

_PER_SEQ = ("seq_lens", "num_rejected", "limit")


class DraftGraphs:
    def __init__(
        self, drafter: DeviceDrafter, target_hidden: tuple[int, torch.dtype], max_blocks_per_seq: int,
        batch_sizes: list[int], device: torch.device,
    ) -> None:  # fmt: skip
        self.drafter = drafter
        self.q = drafter.k + 1  # rows a request feeds in a verify step: its last token and k drafts
        self.batch_sizes = sorted(set(batch_sizes))
        b, w = self.batch_sizes[-1], max_blocks_per_seq
        t, (size, dtype) = b * self.q, target_hidden  # of the target's hidden rows the step reads
        fields = {name: Field((t,), pad, staged=False) for name, pad in (("ids", 0), ("positions", 0), ("slots", -1))}
        fields |= {name: Field((b,), staged=False) for name in _PER_SEQ}
        fields["block_tables"] = Field((b, w), staged=False)
        for name in ("hidden", *(f"aux{i}" for i in drafter.capture_layers)):
            fields[name] = Field((t, size), dtype=dtype, staged=False)
        self.step_buffers = BufferSet(device, fields)
        proposal = dict(tokens=Field((b,)), starts=Field((b,)), num_drafts=Field((b,)), block_tables=Field((b, w)))
        if drafter.draft_hidden is not None:
            proposal["hidden"] = Field((b, drafter.draft_hidden[0]), dtype=drafter.draft_hidden[1], staged=False)
        self.proposal_buffers = BufferSet(device, proposal)
        self._query_start_loc = torch.arange(b + 1, device=device) * self.q
        self._last_fed_row = torch.arange(b, device=device) * self.q + self.q - 1
        self._sequence = torch.arange(b, device=device)
        self.steps: GraphSet[int, torch.Tensor] = GraphSet("drafter step", self.step)
        self.proposals: GraphSet[int, torch.Tensor] = GraphSet("drafter proposal", self._proposal)

    def requests(self, padded: int) -> tuple[DraftInput, ...]:
        """`padded` requests of k + 1 fed rows each, all proposing: a batch the step reads only the count
        of (its tensors hold the rest)."""
        return tuple(DraftInput("", (), 0, self.q, slice(i * self.q, (i + 1) * self.q), (), True) for i in range(padded))

    def fill_step(self, batch: PaddedDraftBatch, limit: torch.Tensor, padded: int) -> None:
        """The step's device tensors into the buffers, device to device; every row past them up to
        `padded` is padding (whatever an earlier, larger step left there)."""
        b, n = self.step_buffers, len(batch.requests)
        t, meta = n * self.q, batch.attn_metadata
        per_token = dict(ids=batch.input_ids, positions=batch.positions[:t], slots=meta.slot_mapping[:t],
                         hidden=batch.hidden_states[:t], **{f"aux{i}": a[:t] for i, a in batch.aux_hidden_states.items()})  # fmt: skip
        for name, value in per_token.items():
            b.put(name, value, padded * self.q)
        for name, value in zip(_PER_SEQ, (meta.seq_lens[:n], batch.num_rejected_tokens, limit), strict=True):
            b.put(name, value, padded)  # padding attends over nothing and wants no drafts
        b.put("block_tables", meta.block_tables[:n], padded)

    def step(self, padded: int) -> torch.Tensor:
        """[padded, k] drafts from the buffers: the drafter's step, tensor ops only."""
        b, t = self.step_buffers, padded * self.q
        meta = AttentionMetadata(self._query_start_loc[: padded + 1], b["seq_lens"][:padded], b["block_tables"][:padded], b["slots"][:t], causal=True)
        aux = {i: b[f"aux{i}"][:t] for i in self.drafter.capture_layers}
        batch = PaddedDraftBatch(self.requests(padded), b["ids"][:t], b["num_rejected"][:padded], b["hidden"][:t], aux, b["positions"][:t], meta)
        return self.drafter.draft_step(batch, self._sequence[:padded], self._last_fed_row[:padded], b["limit"][:padded], self.drafter.draft)

    def run_step(self, batch: PaddedDraftBatch, limit: torch.Tensor, padded: int) -> torch.Tensor:
        self.fill_step(batch, limit, padded)
        return self.steps.run(padded)[: len(batch.requests)]

    def _proposal(self, padded: int) -> torch.Tensor:
        b = self.proposal_buffers
        hidden = b["hidden"][:padded] if "hidden" in b.static else None
        return self.drafter.draft(ProposalInputs(b["tokens"][:padded], b["starts"][:padded], b["num_drafts"][:padded], b["block_tables"][:padded], hidden))

    def run_proposal(self, inputs: ProposalInputs, padded: int) -> torch.Tensor:
        """[B, k] drafts: a view of the graph's static output, valid until the next replay. Padded rows
        want no drafts (token 0 at position 0, block 0, a zero hidden row)."""
        b, n = self.proposal_buffers, inputs.num_seqs
        b.begin()
        for name in ("tokens", "starts", "num_drafts", "block_tables", "hidden"):
            if name in b.static:
                b.put(name, getattr(inputs, name), padded)
        b.send()
        return self.proposals.run(padded)[:n]

    def capture(self, pool: GraphPool) -> None:
        sizes = list(reversed(self.batch_sizes))
        self.proposals.capture(pool, sizes)
        self.steps.capture(pool, sizes, self._pad_step)

    def _pad_step(self, padded: int) -> None:
        """All padding while capturing: no KV is written."""
        b = self.step_buffers
        b["slots"][: padded * self.q].fill_(-1)
        for name in _PER_SEQ:
            b[name].zero_()
