"""Runner: what the engine core needs of a model runner. ModelRunner is one; the testing and study
wrappers (fault_injection.py, step_recorder.py) are others, around it (RunnerWrapper)."""

from collections.abc import Mapping
from typing import Protocol

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, SchedulerOutput
from refengine.worker.async_output import AsyncModelRunnerOutput


class Runner(Protocol):
    def execute_model(self, so: SchedulerOutput) -> None:
        """Update the held requests from `so` and launch its forward."""
        ...

    def sample_tokens(
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Verify and sample the step executed last, its grammar rows masked by `grammar_output`."""
        ...

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        """Sync scheduling (and the deferred branch): the drafts proposed after the last step."""
        ...


class RunnerWrapper:
    """A runner around another that passes every call through: a wrapper overrides what it changes."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def execute_model(self, so: SchedulerOutput) -> None:
        self.runner.execute_model(so)

    def sample_tokens(self, draft_overrides: Mapping[str, list[int]] | None = None, grammar_output: GrammarOutput | None = None):
        return self.runner.sample_tokens(draft_overrides, grammar_output)

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        return self.runner.take_draft_token_ids()
