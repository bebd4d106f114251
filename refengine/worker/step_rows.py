"""What the runner's two halves of a step hand each other: the rows `execute_model` fed and what it
computed, for `sample_tokens` to verify, sample and draft from."""

from dataclasses import dataclass

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.transformer import ModelOutput
from refengine.spec_decode.proposer import DraftGraph
from refengine.worker.request_state import CachedRequestState
from refengine.worker.sampler_graphs import SamplerGraphKey


@dataclass(frozen=True, slots=True)
class StepWay:
    """The dispatcher's one decision for a step (step_plan.py)."""

    target_tokens: int | None = None  # the target graph's T; None: eager
    uniform: SamplerGraphKey | None = None  # the rest of a uniform verify step as one graph (eager on the CPU)
    sampler: SamplerGraphKey | None = None  # the general way's rejection sampler graph; None: eager
    drafter: DraftGraph | None = None  # the drafter's graph; None: eager


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One request's slice of the step."""

    state: CachedRequestState
    batch_row: int  # its row in the InputBatch (rows move only between steps)
    num_computed_tokens: int  # the runner's count when it ran: where its fed tokens start in its history
    num_scheduled_tokens: int
    first_row: int  # where its rows start in the flat token batch
    draft_ids: tuple[int, ...]  # the drafts fed, after filling -1 placeholders (-1: filled on the device)
    first_logits_row: int | None  # None: a prefill chunk that does not reach the last known token


@dataclass(frozen=True, slots=True)
class FedDrafts:
    """Draft slots the device filled: flat indices into the step's [verified rows, W] draft matrix, and
    their ids (-1 where the drafter proposed none)."""

    slots: torch.Tensor
    ids: torch.Tensor


@dataclass(frozen=True, slots=True)
class ExecutedBatch:
    rows: tuple[ScheduledRow, ...]
    logits: torch.Tensor  # [sum over sampled rows of (k + 1), vocab]
    model_output: ModelOutput | None
    positions: torch.Tensor | None = None  # the fed rows' exact positions, on the device
    attn_metadata: AttentionMetadata | None = None  # on the device, at those positions
    fed: FedDrafts | None = None
    # The position each logits row decides, on the device; None: the host's counts were exact.
    sample_positions: torch.Tensor | None = None
    # Each fed row's id as read from the latest frame (-1: a draft not proposed); None: none was.
    gathered: torch.Tensor | None = None
    way: StepWay = StepWay()

    @property
    def verified(self) -> list[ScheduledRow]:
        return [r for r in self.rows if r.first_logits_row is not None]
