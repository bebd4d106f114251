"""StepRecorder, for the oracle: a runner wrapper that keeps, per request, the drafts each step verified
and how many it accepted (StepRecord), so that sync and async arms can be compared position by position.
The production runner carries none of it: build_engine wraps the runner only with record_steps."""

from collections.abc import Mapping

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, SchedulerOutput, StepRecord
from refengine.worker.async_output import AsyncModelRunnerOutput, resolve
from refengine.worker.model_runner import ModelRunner

# (request id, position of its first draft, the drafts fed) for each request that verified drafts
_Verified = tuple[tuple[str, int, tuple[int, ...]], ...]


class StepRecorder:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.records: dict[str, list[StepRecord]] = {}
        # Steps sampled but not yet turned into records: an in-flight output is read only when records
        # are taken, so recording adds no wait to the step loop.
        self._pending: list[tuple[_Verified, ModelRunnerOutput | AsyncModelRunnerOutput]] = []

    def execute_model(self, so: SchedulerOutput) -> None:
        self.runner.execute_model(so)

    def sample_tokens(
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        # What was fed, not the validity-padded override: sync and async arms feed the same drafts.
        verified = tuple(
            (row.state.req_id, row.state.num_tokens, row.draft_ids)
            for row in self.runner.executed_rows()
            if row.first_logits_row is not None and row.draft_ids
        )
        out = self.runner.sample_tokens(draft_overrides, grammar_output)
        if verified:
            self._pending.append((verified, out))
        return out

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        return self.runner.take_draft_token_ids()

    def take_step_records(self, req_id: str) -> list[StepRecord]:
        """A finished request's per-step drafts and acceptance."""
        for verified, out in self._pending:
            resolved = resolve(out)
            sampled = dict(zip(resolved.req_ids, resolved.sampled_token_ids, strict=True))
            for rid, position, drafts in verified:
                self.records.setdefault(rid, []).append(StepRecord(position, drafts, len(sampled[rid]) - 1))
        self._pending.clear()
        return self.records.pop(req_id, [])
