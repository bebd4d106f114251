"""StepRecorder, for the oracle: a runner wrapper that keeps, per request, the drafts each step verified
and how many it accepted (StepRecord), so that sync and async arms can be compared position by position.
The production runner carries none of it: build_engine wraps the runner only with record_steps."""

from collections.abc import Mapping

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, StepRecord
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from refengine.worker.async_output import AsyncModelRunnerOutput
from refengine.worker.model_runner import ModelRunner
from refengine.worker.runner import RunnerWrapper
from refengine.worker.step_frame import StepFrame


class StepRecorder(RunnerWrapper):
    runner: ModelRunner

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner)
        self.records: dict[str, list[StepRecord]] = {}
        # Frames sampled but not yet turned into records: their device results are read only when
        # records are taken, so recording adds no wait to the step loop.
        self._pending: list[StepFrame] = []

    def sample_tokens(
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        out = self.runner.sample_tokens(draft_overrides, grammar_output)
        frame = self.runner.last_sampled_frame()
        if frame is not None and any(r.sampled_row is not None and r.num_drafts for r in frame.rows):
            self._pending.append(frame)
        return out

    def take_step_records(self, req_id: str) -> list[StepRecord]:
        """A finished request's per-step drafts and acceptance. What was fed, not the validity-padded
        override (sync and async arms feed the same drafts), at the exact position the device fed it."""
        for frame in self._pending:
            host_rows = frame.copy.host_rows()
            for row in frame.rows:
                if row.sampled_row is None or not row.num_drafts:
                    continue
                host = host_rows[row.sampled_row]
                num_accepted = sum(t != PLACEHOLDER_TOKEN_ID for t in host[: frame.copy.width]) - 1
                position = host[frame.position_column] + row.num_scheduled - row.num_drafts
                record = StepRecord(position, frame.fed_drafts(host, row), num_accepted)
                self.records.setdefault(row.state.req_id, []).append(record)
        self._pending.clear()
        return self.records.pop(req_id, [])
