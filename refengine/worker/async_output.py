"""Sampled ids on their way to the host, as in vLLM's AsyncModelRunnerOutput.

A step's results stay on the device, where the next step gathers its inputs from them; a copy goes to
pinned host memory without blocking, and an event marks when it has landed. The engine thread waits for
that event only when it applies the frame (`get_output`), after the runner has already launched the
next step, so no host read stands between launching step n and launching step n+1.
"""

from dataclasses import dataclass

import torch

from refengine.core.outputs import ModelRunnerOutput
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID


@dataclass(frozen=True, slots=True)
class InFlightTokens:
    """One step's results, one row per sampled request: its tokens in the first `width` columns (-1 after
    the valid ones), then the columns the runner checks one frame late (step_frame.py)."""

    host: torch.Tensor  # the copy in pinned memory (the results themselves on the CPU)
    ready: torch.cuda.Event | None  # recorded after the copy; None on the CPU
    width: int

    @classmethod
    def send(cls, results: torch.Tensor, width: int) -> "InFlightTokens":
        if not results.is_cuda:
            return cls(results, None, width)
        # The rest runs only on a GPU: CPU mutation testing cannot reach it (pytest -m gpu checks it).
        # pragma: no mutate block
        host = torch.empty(results.shape, dtype=results.dtype, pin_memory=True)
        host.copy_(results, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host, ready, width)

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.query()

    def host_rows(self) -> list[list[int]]:
        """Every column of every row; waits for the copy to land."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()

    def rows(self) -> list[list[int]]:
        """Each row's tokens without the padding; waits for the copy to land."""
        return [[t for t in row[: self.width] if t != PLACEHOLDER_TOKEN_ID] for row in self.host_rows()]


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
