"""Fault injection, for tests: a runner wrapper whose execute_model raises after a number of steps, so
tests can watch the engine die honestly (`--fault-after-steps`, `REFENGINE_FAULT_AFTER_STEPS`). The
production runner carries none of it: build_engine wraps the runner only when a fault is asked for."""

from refengine.core.outputs import SchedulerOutput
from refengine.worker.runner import Runner, RunnerWrapper


class InjectedFault(RuntimeError):
    """Raised on purpose, so tests can watch the engine die honestly."""


class FaultInjectingRunner(RunnerWrapper):
    def __init__(self, runner: Runner, after_steps: int) -> None:
        super().__init__(runner)
        self.after_steps = after_steps
        self.num_steps = 0

    def execute_model(self, so: SchedulerOutput) -> None:
        self.num_steps += 1
        if self.num_steps > self.after_steps:
            raise InjectedFault(f"injected fault at runner step {self.num_steps}")
        self.runner.execute_model(so)


class SkewedLogitsModel:
    """The model as a drifting rank sees it (`skew_logits_on_rank`, tensor parallelism's tests): every
    logits row strongly favours `token_id`, so this rank alone would sample it everywhere."""

    def __init__(self, model, token_id: int) -> None:
        self.model = model
        self.token_id = token_id

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def compute_logits(self, hidden):
        logits = self.model.compute_logits(hidden)
        logits[:, self.token_id] += 1e4
        return logits

    def __getattr__(self, name: str):
        return getattr(self.model, name)
