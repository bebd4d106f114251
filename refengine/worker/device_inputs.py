"""What the device fills in of a step's host-built inputs (vLLM's _maybe_adjust_inputs_on_gpu).

The host builds ids, positions and attention metadata from the counts it has: the scheduler's, which
under async scheduling assume that every draft in flight was accepted. The latest step's results never
visit the host on the way: its last valid token and its drafts are gathered into the input ids, and
each sequence's positions, sequence length and slots move back by what the host over-counted (its
rejected drafts, read on the device), so the step runs at the exact positions.

Invariant numbers refer to docs/invariants.md.
"""

from dataclasses import dataclass

import numpy as np
import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.device import to_device
from refengine.worker.step_frame import StepFrame


@dataclass(frozen=True, slots=True)
class DeviceInputs:
    at: torch.Tensor  # [G] flat input rows whose ids come from the device
    ids: torch.Tensor  # [G] their ids; a -1 (a draft the drafter did not propose) is fed as 0
    # Per sequence, the host's position less the exact one (invariant 48), and each token's sequence;
    # None when the host's positions are exact.
    shift: torch.Tensor | None
    seq_of_token: torch.Tensor | None

    def apply(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, block_size: int) -> None:
        """Complete the step's device inputs in place (on a CUDA graph's static buffers too: their first
        rows are the step's)."""
        if self.at.numel():
            ids.index_copy_(0, self.at, self.ids.clamp(min=0))
        if self.shift is None:
            return
        num_tokens = self.seq_of_token.shape[0]
        exact = positions[:num_tokens] - self.shift[self.seq_of_token]
        positions[:num_tokens] = exact
        meta.seq_lens[: self.shift.shape[0]] -= self.shift
        blocks = meta.block_tables[self.seq_of_token, exact // block_size]
        meta.slot_mapping[:num_tokens] = blocks * block_size + exact % block_size


def gather_device_inputs(
    latest: StepFrame | None,
    at: list[int],
    take: list[int],
    sources: list[int],
    host_shift: list[int],
    seq_of_token: np.ndarray,
    device: torch.device,
) -> DeviceInputs | None:
    """What the device completes of a step's inputs: the ids at flat rows `at`, entries `take` of the
    latest frame's source, never read by the host; and, where the host's count is not the exact one,
    each sequence moved back by its host over-count `host_shift` plus the rejected drafts of its row
    `sources` of the latest frame (-1: none). One small host-to-device copy of indices; the ids and
    counts themselves do not move."""
    shifted = any(host_shift) or any(s >= 0 for s in sources)
    if not at and not shifted:
        return None
    n, b = len(at), len(sources)
    host = np.concatenate([np.asarray(at + take + sources + host_shift, dtype=np.int64), seq_of_token])
    index = to_device(torch.from_numpy(host), device)
    ids = latest.source[index[n : 2 * n]] if n else index[:0]
    shift = None
    if shifted:
        shift = index[2 * n + b : 2 * n + 2 * b]
        if latest is not None:
            # Invariant 48: the exact count is the optimistic one less the rejected drafts.
            rejected = torch.cat([latest.num_rejected, latest.num_rejected.new_zeros(1)])
            shift = shift + rejected[index[2 * n : 2 * n + b]]
    return DeviceInputs(index[:n], ids, shift, index[2 * n + 2 * b :] if shifted else None)
