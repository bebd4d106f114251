"""vLLM's padded drafter batch, built from a step the runner just verified: every fed row, before the
host knows what was accepted (spec_decode/proposer.py), with the step's exact device positions.

Invariant numbers refer to docs/invariants.md.
"""

import torch

from refengine.model.device import to_device
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch
from refengine.worker.input_batch import InputBatch
from refengine.worker.step_frame import rejected_drafts
from refengine.worker.step_rows import ExecutedBatch, ScheduledRow


def padded_draft_batch(
    executed: ExecutedBatch, verified: list[ScheduledRow], tokens: torch.Tensor | None, input_batch: InputBatch
) -> PaddedDraftBatch:
    """Every fed row of the step for the drafter, before the host knows what was accepted. A row's
    input is the token after it: known on the host up to the last known token, then the verified
    ids gathered on the device (a rejected row gets its masked -1 as 0: any valid id will do).
    `tokens` is None for a step of prefill chunks only, which verifies nothing."""
    device = executed.model_output.hidden_states.device
    if tokens is None:
        tokens = torch.zeros(0, 1, dtype=torch.long, device=device)
    ids: list[int] = []
    at: list[int] = []  # flat rows whose next token is a verified id ...
    source: list[int] = []  # ... at this flat index of `tokens`
    num_drafts: list[int] = []
    width = tokens.shape[1]
    verified_index = {r.state.req_id: i for i, r in enumerate(verified)}
    for row in executed.rows:
        start, token_ids = row.num_computed_tokens, input_batch.token_ids[row.batch_row]
        if row.first_logits_row is None:
            ids += token_ids[start + 1 : start + row.num_scheduled_tokens + 1].tolist()
            continue
        k = len(row.draft_ids)
        num_known = row.num_scheduled_tokens - k
        ids += token_ids[start + 1 : start + num_known].tolist()
        at += range(len(ids), len(ids) + k + 1)
        v = verified_index[row.state.req_id]
        source += range(v * width, v * width + k + 1)
        ids += [0] * (k + 1)
        num_drafts.append(k)
    host = to_device(torch.tensor(ids + at + source + num_drafts, dtype=torch.int64), device)
    n, m = len(ids), len(at)
    verified_ids = tokens.reshape(-1)[host[n + m : n + 2 * m]].clamp(min=0)
    input_ids = host[:n].index_copy(0, host[n : n + m], verified_ids)
    num_rejected = rejected_drafts(tokens, host[n + 2 * m :])
    model_output = executed.model_output
    return PaddedDraftBatch(
        tuple(
            DraftInput(
                r.state.req_id, input_batch.history(r.batch_row, r.state.num_tokens), r.num_computed_tokens, r.num_scheduled_tokens,
                slice(r.first_row, r.first_row + r.num_scheduled_tokens), r.state.block_ids,
                r.first_logits_row is not None, r.state.num_cached_tokens,
            )  # fmt: skip
            for r in executed.rows
        ),
        input_ids,
        num_rejected,
        model_output.hidden_states,
        model_output.aux_hidden_states,
        executed.positions,
        executed.attn_metadata,
        executed.way.drafter,
    )
