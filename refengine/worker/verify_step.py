"""The step's one verify path: every verified request of a step in one pass of the batched rejection
sampler, fed plain tensors (the drafts, the processed rows' parameters and masks, the positions they
decide), with the drafts still on the device where the step fed them from there.

Invariant numbers refer to docs/invariants.md.
"""

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np
import torch

from refengine.core.outputs import GrammarOutput, TokenLogprobs
from refengine.sample.rejection_sampler import (
    SpecDecodeMetadata,
    StepAcceptRule,
    accept_matching_prefix,
    draft_row_masks,
    rejection_sample,
)
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.input_batch import InputBatch
from refengine.worker.sampler_graphs import RejectionSamplerGraphs, SamplerGraphKey
from refengine.worker.step_rows import FedDrafts, ScheduledRow


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprobs]:
    """Logprobs under the raw model distribution (before temperature and constraints, as vLLM reports
    by default), one row per emitted token."""
    out = []
    for row, token in zip(torch.log_softmax(logits.float(), dim=-1), token_ids, strict=True):
        top = torch.topk(row, num_top) if num_top else None
        pairs = [] if top is None else [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)]
        out.append(TokenLogprobs(token, float(row[token]), pairs))
    return out


def with_fed_drafts(matrix: torch.Tensor, fed: FedDrafts | None) -> torch.Tensor:
    """The padded draft matrix on the device with the drafts the step fed while still on the device."""
    if fed is None:
        return matrix
    return matrix.view(-1).index_copy(0, fed.slots, fed.ids).view(matrix.shape)


def verify_rows(
    input_batch: InputBatch,
    accept_rule: StepAcceptRule | None,
    logits: torch.Tensor,
    rows: list[ScheduledRow],
    drafts_by_req: Mapping[str, tuple[int, ...]],
    grammar_output: GrammarOutput | None = None,
    *,
    fed: FedDrafts | None = None,
    positions: torch.Tensor | None = None,
    sampler_graphs: RejectionSamplerGraphs | None = None,
    sampler_key: SamplerGraphKey | None = None,
) -> torch.Tensor:
    """Verify every sampled request of the step in one pass of the batched rejection sampler on the
    logits' device: the one verify path for greedy and seeded rows, with or without drafts. `fed`
    holds the drafts still on the device, `positions` the exact position each logits row decides
    when the host's count is optimistic; a step the dispatcher gave `sampler_key` replays there.

    Logits row j of a request decides position num_tokens + j as if drafts[:j] had been accepted
    (constraints see that history)."""
    batch_rows: list[int] = []
    host_positions: list[int] = []
    masked: list[tuple[int, int]] = []  # (logits row, token) pairs the constraints forbid
    for row in rows:
        state = row.state
        drafts = drafts_by_req[state.req_id]
        first = len(host_positions)
        batch_rows += [row.batch_row] * (len(drafts) + 1)
        host_positions += range(state.num_tokens, state.num_tokens + len(drafts) + 1)
        history = input_batch.history(row.batch_row, state.num_tokens)
        pairs = draft_row_masks(state.params, history, drafts, state.num_output_tokens)
        masked += ((first + j, token) for j, token in pairs)
    device = logits.device
    bitmask_rows, bitmask = grammar_rows(rows, drafts_by_req, grammar_output)
    metadata = input_batch.sampling_metadata(batch_rows, host_positions, masked, device, bitmask_rows, bitmask)
    spec = SpecDecodeMetadata.build(
        [drafts_by_req[r.state.req_id] for r in rows], [r.first_logits_row for r in rows], device
    )
    if fed is not None:
        # The metadata's draft matrix is the host's drafts, -1 padded (padded_draft_ids), as the frame's is.
        spec = dataclasses.replace(spec, draft_token_ids=with_fed_drafts(spec.draft_token_ids, fed))
    if sampler_key is not None:  # the graphs hold the runner's accept rule and hash the seeds of `positions`
        # CUDA graphs exist only on a GPU: CPU mutation testing cannot reach this branch.
        return sampler_graphs.run(sampler_key, logits, metadata, spec, positions)  # pragma: no mutate
    if positions is not None:
        metadata = metadata.at_positions(positions)
    accept = accept_matching_prefix
    if accept_rule is not None:
        first_rows = spec.target_logits_indices[:, 0]
        accept = functools.partial(
            accept_rule, key_words=metadata.key_words[first_rows], first_positions=metadata.positions[first_rows]
        )
    return rejection_sample(logits, metadata, spec, accept)


def grammar_rows(
    rows: list[ScheduledRow], drafts_by_req: Mapping[str, tuple[int, ...]], grammar_output: GrammarOutput | None
) -> tuple[list[int], np.ndarray | None]:
    """The logits rows a grammar constrains, and their bitmasks in the same order: a request's bitmask
    row j (the grammar advanced through drafts[:j]) masks its logits row j, which decides draft j or,
    past the drafts, the bonus token."""
    if grammar_output is None:
        return [], None
    unknown = grammar_output.rows.keys() - {row.state.req_id for row in rows}
    if unknown:
        raise RunnerInvariantError(f"grammar rows for requests this step does not verify: {sorted(unknown)}")
    logits_rows: list[int] = []
    bitmask_rows: list[int] = []
    for row in rows:
        span = grammar_output.rows.get(row.state.req_id)
        if span is None:
            continue
        first, count = span
        # Invariant 25: one bitmask per verified row of the request, drafts then bonus.
        if count != len(drafts_by_req[row.state.req_id]) + 1:
            raise RunnerInvariantError(
                f"request {row.state.req_id!r}: {count} grammar rows for {len(drafts_by_req[row.state.req_id])} drafts"
            )
        logits_rows += range(row.first_logits_row, row.first_logits_row + count)
        bitmask_rows += range(first, first + count)
    return logits_rows, np.ascontiguousarray(grammar_output.grammar_bitmask[bitmask_rows])
