"""EngineCore: the step loop. schedule -> execute -> update, at depth 1 (`step`) or with a depth-2
batch queue (`step_with_batch_queue`) under async scheduling.

Invariant numbers refer to docs/invariants.md.
"""

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from refengine.core.outputs import (
    EngineCoreOutputs,
    GrammarOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from refengine.core.scheduler import Scheduler
from refengine.engine.tp_executor import MultiprocExecutor
from refengine.request import Request, RequestStatus
from refengine.worker.async_output import AsyncModelRunnerOutput, resolve
from refengine.worker.runner import Runner

EMPTY_OUTPUTS = EngineCoreOutputs(outputs=(), finished_req_ids=frozenset(), spec_decoding_stats=None)
# How long an idle engine waits for a grammar to compile before it looks at its commands again.
GRAMMAR_WAIT_S = 0.05


def _runs_anything(so: SchedulerOutput) -> bool:
    """Whether the runner has anything to do for this step: tokens, or state to drop."""
    return so.total_num_scheduled_tokens > 0 or bool(so.finished_req_ids) or bool(so.preempted_req_ids)


@dataclass(frozen=True, slots=True)
class _Frame:
    scheduler_output: SchedulerOutput
    future: "Future[ModelRunnerOutput | AsyncModelRunnerOutput]"


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: Runner, executor: MultiprocExecutor | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        # Tensor parallelism's worker ranks, which end with this core.
        self.executor = executor
        # Invariant 14: a batch queue exists only under async scheduling, two frames deep.
        self.max_concurrent_batches = 2 if scheduler.async_scheduling() else 1
        self.batch_queue: deque[_Frame] = deque()
        # Steps that took the deferred branch (invariant 16), so a test can show it ran.
        self.num_deferred_steps = 0
        # One worker thread keeps frames in order on the runner while the engine thread schedules the
        # next one: that is the host work depth 2 hides. Depth 1 runs the runner on the same thread, so
        # the two modes differ only in the overlap: on the CPU each thread that runs torch ops keeps its
        # own OpenMP team, and with depth 1 on the engine thread and depth 2 on this one, the A/B measured
        # the teams rather than the overlap (async / sync TPOT 1.07 at c = 4, 0.98 with both here).
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refengine-runner")

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids: list[str]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self.batch_queue)

    def step(self) -> EngineCoreOutputs:
        """Depth 1: the output of a step is applied before the next one is scheduled."""
        if not self.scheduler.has_requests():
            return EMPTY_OUTPUTS
        so = self.scheduler.schedule()
        if not _runs_anything(so) and self.scheduler.wait_for_grammar(GRAMMAR_WAIT_S):
            return EMPTY_OUTPUTS  # only requests waiting for their grammar: no empty step for the runner
        if so.pending_constrained_output:
            # Nothing is in flight at depth 1, but the drafts are still -1 placeholders (async): the
            # grammar masks need the drafts the runner fills in, as in the deferred branch.
            self._on_runner(self.runner.execute_model, so)
            runner_output = self._on_runner(self.runner.sample_tokens, *self._constrain_deferred(so))
        else:
            runner_output = self._on_runner(self._execute, so, self.scheduler.get_grammar_bitmask(so))
        outputs = self.scheduler.update_from_output(so, resolve(runner_output))
        self._post_step()
        return outputs

    def step_with_batch_queue(self) -> EngineCoreOutputs | None:
        """Depth 2: schedule and launch frame n+1 before applying the output of frame n, oldest first.
        Returns None when it only launched a frame.

        Deferred branch (invariant 16): when a scheduled request has a constraint (bad_words, a grammar)
        and output still in flight, its drafts can only be judged against the history that output
        brings. So the forward of n+1 is launched, the output of n applied, the drafts validated and
        padded with -1 (update_draft_token_ids_in_output), the grammar masks computed through those
        drafts, and only then is n+1 sampled."""
        deferred: SchedulerOutput | None = None
        if self.scheduler.has_requests() and len(self.batch_queue) < self.max_concurrent_batches:
            so = self.scheduler.schedule()
            if not _runs_anything(so) and not self.batch_queue and self.scheduler.wait_for_grammar(GRAMMAR_WAIT_S):
                return None  # only requests waiting for their grammar: wait rather than spin
            if _runs_anything(so):
                if so.pending_constrained_output:
                    self.num_deferred_steps += 1
                    deferred = so
                    launched = self._worker.submit(self.runner.execute_model, so)
                else:
                    # Invariant 14: FIFO, push left and pop right (test_sync_async_depth1_depth2_identical).
                    # No request of this frame has output in flight: its grammars' state is already complete.
                    grammar_output = self.scheduler.get_grammar_bitmask(so)
                    self.batch_queue.appendleft(_Frame(so, self._worker.submit(self._execute, so, grammar_output)))
                    if len(self.batch_queue) < self.max_concurrent_batches:
                        return None
        outputs = None
        if self.batch_queue:
            frame = self.batch_queue.pop()
            # The one wait of the frame: its sampled ids landing on the host, while the runner thread
            # already launched the next frame (AsyncModelRunnerOutput).
            outputs = self.scheduler.update_from_output(frame.scheduler_output, resolve(frame.future.result()))
        if deferred is not None:
            launched.result()
            sampled = self._worker.submit(self.runner.sample_tokens, *self._constrain_deferred(deferred))
            self.batch_queue.appendleft(_Frame(deferred, sampled))
        if outputs is not None:
            self._post_step()
        return outputs

    def _on_runner(self, fn, *args):
        """Depth 1: `fn` on the runner thread, waited for."""
        return self._worker.submit(fn, *args).result()

    def _constrain_deferred(self, so: SchedulerOutput) -> tuple[dict[str, list[int]], GrammarOutput | None]:
        """A deferred step's constraints, once every earlier output is applied: its drafts validated and
        padded with -1 (invariant 12), then the grammar masks computed through those drafts."""
        self.scheduler.update_draft_token_ids_in_output(self.runner.take_draft_token_ids(), so)
        grammar_output = self.scheduler.get_grammar_bitmask(so)
        overrides = {r: so.scheduled_spec_decode_tokens[r] for r in so.num_invalid_spec_tokens}
        return overrides, grammar_output

    def _execute(
        self, so: SchedulerOutput, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        self.runner.execute_model(so)
        return self.runner.sample_tokens(None, grammar_output)

    def _post_step(self) -> None:
        # Invariant 15: under async scheduling the scheduler only ever holds -1 placeholders; real draft
        # ids reach it out of band only in sync mode (test_async_scheduler_ships_only_placeholders).
        if not self.scheduler.async_scheduling():
            self.scheduler.update_draft_token_ids(self.runner.take_draft_token_ids())

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
        if self.executor is not None:
            self.executor.shutdown()
        if self.scheduler.structured_output_manager is not None:
            self.scheduler.structured_output_manager.shutdown()
