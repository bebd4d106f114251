"""The drafter interface: the two calls the runner makes of every method after each verification.

`propose` comes first, right after the step's verification is launched and before the host knows what
was accepted: it gets every row the step fed (vLLM's padded drafter batch) and returns its drafts on the
device, or None for a drafter that drafts on the host. `commit` follows once the verified ids (and
`propose`'s drafts) are on the host: it gets the rows that hold committed tokens (the fed prompt or
decode tokens plus the accepted drafts) and returns each proposing request's drafts. Every drafter
keeps its per-request state keyed by request id (invariant 17) and records committed rows only, so its
context cannot run ahead of what the target committed (invariant 26).

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.device import to_device


class DraftContextError(RuntimeError):
    """A drafter's per-request context no longer matches what the target committed. Drafting from it
    would be drafting from corrupted state, so the engine refuses instead."""


@dataclass(frozen=True, slots=True)
class DraftInput:
    """One request's slice of the step just verified.

    Positions `first_position .. first_position + num_valid_rows - 1` were fed this step and hold
    committed tokens; `token_ids[p + 1]` is the token that follows position p, so it exists for every
    valid row (for the last row it is the token just sampled, or the next prompt token of a chunk).
    """

    req_id: str
    token_ids: Sequence[int]
    first_position: int
    num_valid_rows: int
    rows: slice  # the valid rows in DraftBatch.hidden_states and aux_hidden_states
    block_ids: tuple[int, ...]
    propose: bool  # False for a prefill chunk short of the prompt's end: ingest its rows, draft nothing
    # Where the request's context began when the runner admitted it: its prefix-cache hit, whose drafter
    # KV the shared blocks already hold (0 without a hit).
    context_start: int = 0

    @property
    def last_position(self) -> int:
        return self.first_position + self.num_valid_rows - 1


@dataclass(frozen=True, slots=True)
class DraftBatch:
    requests: tuple[DraftInput, ...]
    hidden_states: torch.Tensor  # [T, H] target output after its final norm, every fed row of the step
    aux_hidden_states: dict[int, torch.Tensor]  # layer i's output, for i in Proposer.capture_layers


@dataclass(frozen=True, slots=True)
class PaddedDraftBatch:
    """vLLM's padded drafter batch: a step's every fed row, handed to the drafter before the host knows
    how many drafts were accepted, so that drafting needs no read-back of the verified ids.

    Each request's `num_valid_rows` counts every row it fed, rejected drafts included; the last
    `num_rejected_tokens` of a proposing request's rows are rejected, and the device picks its last
    committed row from that count. A rejected row's input id is any valid id: causal attention keeps
    the committed rows from seeing it, and the next passes (or the next step's pass 1) overwrite its
    drafter KV before anything reads it.
    """

    requests: tuple[DraftInput, ...]
    input_ids: torch.Tensor  # [T] on the device: the token after each fed row (its committed successor)
    num_rejected_tokens: torch.Tensor  # [P] int64 on the device, one per proposing request, in order
    hidden_states: torch.Tensor  # [T, H], as in DraftBatch
    aux_hidden_states: dict[int, torch.Tensor]
    # The fed rows' exact positions and attention metadata, on the device: under async scheduling the
    # host's first_position is an upper bound, and only the device knows how far the previous step's
    # rejections moved the rows back (invariant 48).
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    # The dispatcher's choice for the drafter's CUDA graphs (worker/step_plan.py); None: eager.
    graph: "DraftGraph | None" = None


@dataclass(frozen=True, slots=True)
class DraftGraph:
    """Which of a device drafter's graphs a step replays, at which padded batch size: its whole step
    (pass 1 and the proposal, after a uniform verify step) or the proposal alone after an eager pass 1."""

    whole_step: bool
    padded: int


@dataclass(frozen=True, slots=True)
class ProposalInputs:
    """A proposal's inputs, one row per proposing request, on the device."""

    tokens: torch.Tensor  # [B] int64: the last sampled token (DFlash feeds it; EAGLE's pass 1 already did)
    starts: torch.Tensor  # [B] int64: the position of the first row the proposal feeds
    num_drafts: torch.Tensor  # [B] int64: drafts the request wants (<= k; 0: a padded row)
    block_tables: torch.Tensor  # [B, W] int64: the request's blocks, any value past them
    hidden: torch.Tensor | None  # [B, H]: EAGLE's pass-1 output rows; None for DFlash

    @property
    def num_seqs(self) -> int:
        return self.starts.shape[0]


class DeviceDrafter(Protocol):
    """The capability of a drafter whose whole step is device functions of fixed shapes, which a CUDA
    graph can capture (spec_decode/draft_graphs.py): no host read between them."""

    k: int
    capture_layers: tuple[int, ...]
    draft_hidden: tuple[int, torch.dtype] | None  # (size, dtype) of the hidden rows `draft` reads; None: none

    def ingest(self, batch: PaddedDraftBatch, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Pass 1 over every fed row; the output rows `draft` continues from, or None."""
        ...

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """[B, k] draft ids from device inputs, tensor ops only."""
        ...

    def draft_step(
        self, batch: PaddedDraftBatch, sequence: torch.Tensor, last_fed_row: torch.Tensor, limit: torch.Tensor,
        draft: Callable[[ProposalInputs], torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        """The step: `ingest`, then the proposal (through `draft`) from each request's last committed row."""
        ...

    def position_limit(self, block_ids: Sequence[int]) -> int:
        """How far a request's drafts may reach."""
        ...

    def use_graphs(self, graphs: "DraftGraphRunner") -> None:
        """From now on the steps and proposals the dispatcher gives a graph replay it."""
        ...


class DraftGraphRunner(Protocol):
    def run_step(self, batch: PaddedDraftBatch, limit: torch.Tensor, padded: int) -> torch.Tensor: ...

    def run_proposal(self, inputs: ProposalInputs, padded: int) -> torch.Tensor: ...


class Proposer(Protocol):
    """num_speculative_tokens drafts per proposing request, fewer only when it cannot fit (lossless)."""

    @property
    def capture_layers(self) -> tuple[int, ...]: ...

    @property
    def random_init(self) -> bool:
        """True when a head has no trained weights; the engine logs it and /metrics exposes it."""
        ...

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor | None:
        """[P, k] drafts on the device, one row per proposing request of `batch` in order, with nothing
        read back; None for a drafter that drafts on the host, in `commit`."""
        ...

    def commit(self, requests: Sequence[DraftInput], drafts: list[list[int]] | None) -> dict[str, list[int]]:
        """Each proposing request's drafts, once the host knows what was accepted: `requests` count
        committed rows only, `drafts` are `propose`'s rows on the host (None where it returned None)."""
        ...

    def remove(self, req_ids: Iterable[str]) -> None:
        """Drop state of finished or preempted requests (a resumed request starts again from its
        context_start)."""
        ...

    @property
    def device_drafter(self) -> DeviceDrafter | None:
        """Its step as device functions CUDA graphs capture; None: it drafts another way."""
        ...

    @property
    def modules(self) -> tuple[nn.Module, ...]:
        """The networks it runs, whose kernels the engine chooses."""
        ...


def propose_committed(drafter: Proposer, batch: DraftBatch, block_size: int) -> dict[str, list[int]]:
    """Both calls for a batch whose rows are all committed (nothing rejected), laid out in KV blocks of
    `block_size`, the drafts read back here: how a caller outside the runner's step drafts (a test, a
    study)."""
    requests = batch.requests
    ids = [t for d in requests for t in d.token_ids[d.first_position + 1 : d.last_position + 2]]
    device = batch.hidden_states.device
    meta = build_attention_metadata(
        [d.first_position for d in requests], [d.num_valid_rows for d in requests], [d.block_ids for d in requests],
        block_size,
    )
    positions = torch.tensor([p for d in requests for p in range(d.first_position, d.last_position + 1)])
    padded = PaddedDraftBatch(
        requests,
        to_device(torch.tensor(ids, dtype=torch.long), device),
        torch.zeros(sum(d.propose for d in requests), dtype=torch.long, device=device),
        batch.hidden_states,
        batch.aux_hidden_states,
        to_device(positions, device),
        to_device(meta, device),
    )
    with torch.inference_mode():
        drafts = drafter.propose(padded)
        return drafter.commit(requests, None if drafts is None else drafts.tolist())
