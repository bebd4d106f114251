"""The frames in flight: recording a sampled step as one (the host's optimistic view of it) and landing
frames, oldest first, once their copies are on the host (step_frame.py says what a frame holds).

Invariant numbers refer to docs/invariants.md.
"""

import numpy as np
import torch

from refengine.model.device import arrays_to_device
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, padded_draft_ids
from refengine.spec_decode.proposer import DraftInput, Proposer
from refengine.worker.async_output import InFlightTokens
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.input_batch import InputBatch
from refengine.worker.request_state import CachedRequestState
from refengine.worker.spec_step_graphs import SampledStep
from refengine.worker.step_frame import FrameRow, StepFrame, frame_columns
from refengine.worker.step_rows import ExecutedBatch, ScheduledRow
from refengine.worker.verify_step import with_fed_drafts


class InFlightFrames:
    def __init__(
        self,
        requests: dict[str, CachedRequestState],
        input_batch: InputBatch,
        device: torch.device,
    ) -> None:
        self.requests = requests  # the runner's: a frame's request is still held if it is here
        self.input_batch = input_batch
        self.device = device
        # Oldest first; at most two with sampled rows (the engine's batch queue is two frames deep).
        self.frames: list[StepFrame] = []

    def record(
        self,
        executed: ExecutedBatch,
        verified: list[ScheduledRow],
        tokens: torch.Tensor | None,
        proposed: torch.Tensor | None,
        sampled: SampledStep | None = None,
    ) -> StepFrame:
        """The step as a frame in flight, and the host's optimistic view of it: each verified request
        gets 1 + k placeholders and its count advances as if every draft were accepted, as the
        scheduler's did; a prefill chunk advances by its tokens (exact). A uniform step's graph laid out
        its device columns already (`sampled`)."""
        rows: list[FrameRow] = []
        for row in executed.rows:
            state = row.state
            if row.first_logits_row is None:
                rows.append(FrameRow(state, row.num_computed_tokens, row.num_scheduled_tokens, 0, row.first_row, state.block_ids))
                state.num_computed_tokens += row.num_scheduled_tokens
                continue
            k = len(row.draft_ids)
            first_position = state.num_tokens - (row.num_scheduled_tokens - k)
            rows.append(
                FrameRow(
                    state, first_position, row.num_scheduled_tokens, k, row.first_row, state.block_ids,
                    sampled_row=sum(r.sampled_row is not None for r in rows), first_index=state.num_tokens,
                )  # fmt: skip
            )
            self._append_tokens(row, [PLACEHOLDER_TOKEN_ID] * (k + 1))
            state.num_computed_tokens = state.num_tokens - 1
            state.pending_drafts = []
        if tokens is None:
            return self._push(StepFrame(rows, None, num_proposed=0 if proposed is None else proposed.shape[1]))
        num_verified = len(verified)
        k = 0 if proposed is None else proposed.shape[1]
        if sampled is not None:
            columns, num_sampled = sampled.frame, sampled.tokens.shape[0]  # P: drafts start after every padded row
        else:
            counts = np.array([r.first_row for r in verified] + [len(r.draft_ids) for r in verified], dtype=np.int64)
            counts, padded = arrays_to_device([counts, padded_draft_ids([r.draft_ids for r in verified])], self.device)
            # Invariant 30: a padded drafter proposes one row per verified request, in the same order.
            if proposed is not None and proposed.shape[0] != num_verified:
                raise RunnerInvariantError(f"{proposed.shape[0]} rows of drafts for {num_verified} verified requests")
            fed = with_fed_drafts(padded, executed.fed)
            first_positions = executed.positions[counts[:num_verified]]
            columns, num_sampled = frame_columns(tokens, first_positions, fed, proposed, counts[num_verified:]), num_verified
        return self._push(StepFrame(
            rows, InFlightTokens.send(columns.results[:num_verified], tokens.shape[1]), source=columns.source,
            num_rejected=columns.num_rejected, num_sampled=num_sampled,
            num_fed_draft_columns=columns.results.shape[1] - tokens.shape[1] - 1 - k, num_proposed=k,
        ))  # fmt: skip

    def _push(self, frame: StepFrame) -> StepFrame:
        self.frames.append(frame)
        return frame

    def _append_tokens(self, row: ScheduledRow, token_ids: list[int]) -> None:
        """A request's new tokens (or -1 placeholders for those in flight), in its history and its batch row."""
        self.input_batch.write_tokens(row.batch_row, row.state.num_tokens, token_ids)
        row.state.num_tokens += len(token_ids)

    def land(self, keep_latest: bool, drafter: Proposer | None) -> StepFrame | None:
        """Apply every frame in flight, oldest first, waiting for their copies (older ones: done on the
        device before the latest began), but (optionally) the latest sampled one and those after it.
        Returns the latest one kept."""
        frames = self.frames
        keep = len(frames)
        if keep_latest:
            keep = next((i for i in range(len(frames) - 1, -1, -1) if frames[i].copy is not None), len(frames))
        for i in range(keep):
            self._land_frame(frames[i], frames[i + 1 :], drafter)
        self.frames = frames[keep:]
        return frames[keep] if keep < len(frames) else None

    def _land_frame(self, frame: StepFrame, later: list[StepFrame], drafter: Proposer | None) -> None:
        """The host's side of a frame: each verified request's placeholders become its real tokens, its
        count drops by its rejected drafts, and its rows in later frames move back with it (invariant
        18); then the drafter records the committed rows (invariant 26)."""
        host_rows = [] if frame.copy is None else frame.copy.host_rows()
        inputs: list[DraftInput] = []
        proposed: list[list[int]] = []
        for row in frame.rows:
            state = row.state
            held = self.requests.get(state.req_id) is state  # else finished or preempted meanwhile
            batch_row = self.input_batch.req_id_to_index[state.req_id] if held else None
            num_valid = row.num_scheduled
            if row.sampled_row is not None:
                host = host_rows[row.sampled_row]
                # Invariant 48: the device ran the step at the exact positions the host now knows.
                if host[frame.position_column] != row.first_position:
                    raise RunnerInvariantError(
                        f"request {state.req_id!r}: the device fed its step from position {host[frame.position_column]}, "
                        f"the host's exact count says {row.first_position}"
                    )
                tokens = [t for t in host[: frame.copy.width] if t != PLACEHOLDER_TOKEN_ID]
                num_rejected = row.num_drafts + 1 - len(tokens)
                state.num_tokens -= num_rejected
                state.num_computed_tokens -= num_rejected
                num_valid -= num_rejected
                for f in later:
                    f.move_back(state, num_rejected)
                if held:
                    # Past them the row holds -1s still: this frame's rejected placeholders and later
                    # frames' (moved back as many), all in flight.
                    self.input_batch.write_tokens(batch_row, row.first_index, tokens)
            if not held:
                continue  # nothing of a request the runner no longer holds is recorded
            inputs.append(
                DraftInput(
                    state.req_id, self.input_batch.history(batch_row, state.num_tokens), row.first_position,
                    num_valid, slice(row.first_row, row.first_row + num_valid), row.block_ids,
                    row.sampled_row is not None, state.num_cached_tokens,
                )  # fmt: skip
            )
            if row.sampled_row is not None:
                proposed.append(frame.proposed_drafts(host_rows[row.sampled_row]))
        if drafter is None or not inputs:
            return
        proposals = drafter.commit(inputs, proposed if frame.num_proposed else None)
        for req_id, drafts in proposals.items():
            state = self.requests[req_id]
            # A later frame already fed these drafts, on the device, and proposes its own.
            if not any(f.row_of(state) is not None for f in later):
                state.pending_drafts = list(drafts)
