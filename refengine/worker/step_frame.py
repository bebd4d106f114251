"""StepFrame: a sampled step whose results the host has not applied yet, as the runner remembers it.

Sampling a step appends each verified request's 1 + k placeholders to its history and advances its count
as if every draft were accepted (the optimistic count, as the scheduler plans). The results stay on the
device, where the next step reads its inputs (`source`) and corrects its positions (`num_rejected`);
the host applies them one frame late, when the frame lands: the placeholders become the real tokens,
the rejected ones are dropped, and the rows of later frames of the same request move back with them.

Columns of `copy`, one row per verified request: its tokens (width k + 1, -1 after the valid ones), the
position its first fed token had on the device, the drafts it was fed (W, -1 where none), and the
drafts proposed after it (k).
"""

from dataclasses import dataclass

import torch

from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from refengine.worker.async_output import InFlightTokens
from refengine.worker.request_state import CachedRequestState


@dataclass(slots=True)
class FrameRow:
    """One request's slice of the step: its fed rows, and where its placeholders sit in its history.
    `first_position` and `first_index` are exact once every older frame has landed."""

    state: CachedRequestState
    first_position: int
    num_scheduled: int
    num_drafts: int  # drafts fed (0 for a prefill chunk)
    first_row: int  # where its rows start in the step's flat batch
    block_ids: tuple[int, ...]  # its blocks when the step ran: what its drafts were sized by
    sampled_row: int | None = None  # its row of the copy; None: a prefill chunk, nothing sampled
    first_index: int = 0  # where its 1 + num_drafts placeholders start in its history


@dataclass(slots=True)
class StepFrame:
    rows: list[FrameRow]
    copy: InFlightTokens | None  # None: the step sampled nothing
    # On the device, one row per verified request: its last valid token, then its proposed drafts
    # flattened [k each] after all the last tokens; and its rejected drafts.
    source: torch.Tensor | None = None
    num_rejected: torch.Tensor | None = None
    num_sampled: int = 0  # verified requests: where the drafts start in `source`
    num_fed_draft_columns: int = 0  # W
    num_proposed: int = 0  # k, 0 without a device drafter

    def row_of(self, state: CachedRequestState) -> FrameRow | None:
        return next((r for r in self.rows if r.state is state and r.sampled_row is not None), None)

    def move_back(self, state: CachedRequestState, num_rejected: int) -> None:
        """An older frame of `state` landed with `num_rejected` drafts rejected: this frame's rows of it
        sit that much earlier than planned."""
        for row in self.rows:
            if row.state is state:
                row.first_position -= num_rejected
                row.first_index -= num_rejected

    # ---- the copy's columns --------------------------------------------------------------------
    @property
    def position_column(self) -> int:
        return self.copy.width

    def fed_drafts(self, host_row: list[int], row: FrameRow) -> tuple[int, ...]:
        start = self.copy.width + 1
        return tuple(host_row[start : start + row.num_drafts])

    def proposed_drafts(self, host_row: list[int]) -> list[int]:
        start = self.copy.width + 1 + self.num_fed_draft_columns
        return host_row[start : start + self.num_proposed]


@dataclass(frozen=True, slots=True)
class FrameColumns:
    """A sampled step's device columns, one row per verified request (the general way and the uniform
    step's graph build them here alike)."""

    results: torch.Tensor  # the copy's columns: tokens, first fed position, fed drafts, proposed drafts
    source: torch.Tensor  # each row's last valid token, then the proposed drafts flattened
    num_rejected: torch.Tensor


def rejected_drafts(tokens: torch.Tensor, num_drafts: torch.Tensor | int) -> torch.Tensor:
    """vLLM's num_rejected_tokens, per verified request from its [k + 1] tokens (-1 after the valid ones).
    Invariant 48 (docs/invariants.md): a request's rejected drafts are its fed drafts less its valid tokens
    less one."""
    return num_drafts - ((tokens != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1)


def frame_columns(
    tokens: torch.Tensor, first_positions: torch.Tensor, fed: torch.Tensor, proposed: torch.Tensor | None,
    num_drafts: torch.Tensor | int,
) -> FrameColumns:  # fmt: skip
    num_rejected = rejected_drafts(tokens, num_drafts)
    last = tokens.gather(1, (num_drafts - num_rejected)[:, None])[:, 0]
    columns = [tokens, first_positions[:, None], fed] + ([] if proposed is None else [proposed])
    source = last if proposed is None else torch.cat([last, proposed.reshape(-1)])
    return FrameColumns(torch.cat(columns, dim=1), source, num_rejected)
