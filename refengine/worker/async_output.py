"""Sampled ids on their way to the host, as in vLLM's AsyncModelRunnerOutput.

A step's sampled ids stay on the device, where the next step gathers its input ids from them; a copy
goes to pinned host memory without blocking, and an event marks when it has landed. The engine thread
waits for that event only when it applies the frame (`get_output`), after the runner has already
launched the next step, so no host read stands between launching step n and launching step n+1.
"""

from dataclasses import dataclass

import torch

from refengine.core.outputs import ModelRunnerOutput
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from refengine.worker.request_state import CachedRequestState


@dataclass(frozen=True, slots=True)
class InFlightTokens:
    """One step's sampled ids: [rows, width + 1], -1 after each row's last token."""

    device: torch.Tensor  # the sampler's output, where the next step gathers from
    host: torch.Tensor  # its copy in pinned memory (the same tensor on the CPU)
    ready: torch.cuda.Event | None  # recorded after the copy; None on the CPU
    states: tuple[CachedRequestState, ...]  # row r's request
    first_index: tuple[int, ...]  # where row r's tokens start in its request's token_ids

    @classmethod
    def send(
        cls, tokens: torch.Tensor, states: tuple[CachedRequestState, ...], first_index: tuple[int, ...]
    ) -> "InFlightTokens":
        if not tokens.is_cuda:
            return cls(tokens, tokens, None, states, first_index)
        # The rest runs only on a GPU: CPU mutation testing cannot reach it (pytest -m gpu checks it).
        # pragma: no mutate block
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(tokens, host, ready, states, first_index)

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.query()

    def rows(self) -> list[list[int]]:
        """The host copy, row by row without the padding; waits for the copy to land."""
        if self.ready is not None:
            self.ready.synchronize()
        return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in self.host.tolist()]

    def patches(self) -> list[tuple[CachedRequestState, int, list[int]]]:
        """(request, index of its first placeholder, the real ids) for each row: what replaces the
        placeholders the runner put in its requests' token_ids. Waits for the copy to land."""
        return list(zip(self.states, self.first_index, self.rows(), strict=True))


@dataclass(frozen=True, slots=True)
class AsyncModelRunnerOutput:
    """A ModelRunnerOutput whose sampled ids are still in flight: `sampled_rows[i]` is the in-flight
    row of req_ids[i], or None for a prefill chunk that samples nothing."""

    req_ids: list[str]
    sampled_rows: list[int | None]
    tokens: InFlightTokens

    def get_output(self) -> ModelRunnerOutput:
        rows = self.tokens.rows()
        sampled = [[] if r is None else rows[r] for r in self.sampled_rows]
        return ModelRunnerOutput(req_ids=self.req_ids, sampled_token_ids=sampled)


def resolve(output: "ModelRunnerOutput | AsyncModelRunnerOutput") -> ModelRunnerOutput:
    """The engine's one wait for a frame's sampled ids."""
    return output.get_output() if isinstance(output, AsyncModelRunnerOutput) else output
