"""Test doubles for the core: a fake runner that keeps its own per-request state (as the real one
does), and a probe that drives the real EngineCore over it, sync (depth 1) or async (depth-2 batch
queue), checking the scheduler after every schedule and every update."""

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from refengine.config import EngineConfig
from refengine.core.async_scheduler import AsyncScheduler
from refengine.core.outputs import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from refengine.core.scheduler import Scheduler
from refengine.engine.engine_core import EngineCore
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams

EOS = 0


@dataclass(frozen=True)
class Spec:
    num_speculative_tokens: int
    num_lookahead_slots: int


MAX_LOOP_STEPS = 10_000

def make_scheduler(
    *, async_scheduling: bool = False, k: int = 0, lookahead: int | None = None, **overrides
) -> Scheduler:
    cls = AsyncScheduler if async_scheduling else Scheduler
    scheduler_kwargs = {
        key: overrides.pop(key) for key in ("stop_checker", "draft_validator", "verify_policy") if key in overrides
    }
    config = EngineConfig(
        **{
            "max_num_seqs": 8,
            "max_num_batched_tokens": 64,
            "max_model_len": 256,
            "block_size": 4,
            "num_blocks": 128,
            # The scheduling arithmetic these tests spell out assumes every prompt is computed; the
            # prefix cache has its own tests (test_prefix_cache*.py).
            "enable_prefix_caching": False,
            **overrides,
        },
        speculative_config=Spec(k, k if lookahead is None else lookahead) if k or lookahead else None,
        async_scheduling=async_scheduling,
    )
    return cls(config, **scheduler_kwargs)


def make_request(req_id: str, prompt_len: int = 8, *, eos: int | None = EOS, **params) -> Request:
    params.setdefault("temperature", 0.0)
    return Request(req_id, [100 + i for i in range(prompt_len)], SamplingParams(**params), eos_token_id=eos)


def hand_built_output(
    new=(), cached=(), num_scheduled=None, spec=None, finished=(), preempted=()
) -> SchedulerOutput:
    """A SchedulerOutput written by hand, to drive the runner with a batch the test chooses."""
    num_scheduled = dict(num_scheduled or {})
    return SchedulerOutput(
        scheduled_new_reqs=tuple(new),
        scheduled_cached_reqs=tuple(cached),
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        scheduled_spec_decode_tokens=dict(spec or {}),
        num_spec_tokens_to_schedule=0,
        num_invalid_spec_tokens={},
        finished_req_ids=frozenset(finished),
        preempted_req_ids=frozenset(preempted),
        pending_constrained_output=False,
    )


def runner_output(scheduler_output: SchedulerOutput, rows: dict[str, list[int]]) -> ModelRunnerOutput:
    """Rows for every scheduled request; a request left out of `rows` gets an empty row."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, [list(rows.get(r, [])) for r in req_ids])


@dataclass
class _RunnerRequest:
    num_known_tokens: int  # prompt + outputs as of (re)admission
    num_outputs: int  # outputs known to the runner, including its own samples not yet applied
    sampled: bool = False  # has produced a token since (re)admission
    drafts: list[int] = field(default_factory=list)


class FakeRunner:
    """The ModelRunner surface EngineCore drives (execute_model, sample_tokens, take_draft_token_ids).
    Produces rows the way a real runner would, from its own state: output position i of a request is
    always token_at(req_id, i), so the final outputs must not depend on scheduling at all.
    `check_frame(runner, so)` runs on the runner's thread after a frame is received, before sampling."""

    def __init__(
        self,
        config: EngineConfig,
        token_at: Callable[[str, int], int],
        num_accepted: Callable[[str, int, int], int],
        propose: Callable[[str, int], list[int]],
        check_frame: Callable[["FakeRunner", SchedulerOutput], None] | None = None,
    ) -> None:
        self.config = config
        self.token_at = token_at
        self.num_accepted = num_accepted
        self.propose = propose
        self.check_frame = check_frame
        self.states: dict[str, _RunnerRequest] = {}
        self.frame_start: dict[str, tuple[bool, list[int]]] = {}
        self._executed: tuple[SchedulerOutput, dict[str, tuple[int, tuple[int, ...]]]] | None = None

    def execute_model(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.states.pop(req_id, None)
        starts = {}
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.states, f"{new.req_id} sent as new while the runner holds it"
            num_known = len(new.prompt_token_ids) + len(new.output_token_ids)
            self.states[new.req_id] = _RunnerRequest(num_known, len(new.output_token_ids))
            starts[new.req_id] = (new.num_computed_tokens, new.block_ids)
        for cached in so.scheduled_cached_reqs:
            assert cached.req_id in self.states, f"{cached.req_id} sent as cached but unknown to the runner"
            starts[cached.req_id] = (cached.num_computed_tokens, cached.block_ids)
        # What each held request looked like before this step: (has sampled, its pending drafts).
        self.frame_start = {
            c.req_id: (self.states[c.req_id].sampled, self.states[c.req_id].drafts)
            for c in so.scheduled_cached_reqs
        }
        for req_id, num_scheduled in so.num_scheduled_tokens.items():
            start, block_ids = starts[req_id]
            needed = start + num_scheduled + self.config.num_lookahead_tokens
            assert len(block_ids) * self.config.block_size >= needed, f"{req_id}: blocks do not cover {needed}"
        if self.check_frame is not None:
            self.check_frame(self, so)
        self._executed = (so, {r: start for r, (start, _) in starts.items()})

    def sample_tokens(
        self, draft_overrides: dict[str, list[int]] | None = None, grammar_output: object = None
    ) -> ModelRunnerOutput:
        assert grammar_output is None, "the core tests run no structured-output request"
        # The deferred branch pads invalid drafts in the frame itself (and passes the same lists as
        # overrides); the number of valid drafts is what this runner needs from them.
        assert self._executed is not None, "sample_tokens without execute_model"
        (so, starts), self._executed = self._executed, None
        rows = []
        for req_id, num_scheduled in so.num_scheduled_tokens.items():
            state = self.states[req_id]
            if not state.sampled and starts[req_id] + num_scheduled < state.num_known_tokens:
                rows.append([])  # a prefill chunk that does not reach the last known token
                continue
            state.sampled = True
            drafts = so.scheduled_spec_decode_tokens.get(req_id, [])
            num_valid = len(drafts) - so.num_invalid_spec_tokens.get(req_id, 0)
            accepted = self.num_accepted(req_id, state.num_outputs, num_valid)
            assert 0 <= accepted <= num_valid
            rows.append([self.token_at(req_id, state.num_outputs + j) for j in range(accepted + 1)])
            state.num_outputs += accepted + 1
            state.drafts = self.propose(req_id, state.num_outputs)
        return ModelRunnerOutput(list(so.num_scheduled_tokens), rows)

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        return {req_id: list(s.drafts) for req_id, s in self.states.items() if s.sampled}


def hashed_rng(*parts: object) -> random.Random:
    return random.Random("/".join(map(str, parts)))


class EngineProbe:
    """Drives the real EngineCore (step at depth 1, step_with_batch_queue under async) over a FakeRunner,
    and watches the scheduler through its two entry points: `check(probe, phase)` runs on the engine
    thread right after every schedule() ("schedule") and every update_from_output() ("update"). It also
    records what each request was scheduled and delivered, and which frames are in flight."""

    def __init__(
        self, scheduler: Scheduler, runner: FakeRunner, check: Callable[["EngineProbe", str], None]
    ) -> None:
        self.core = EngineCore(scheduler, runner)
        self.scheduler = scheduler
        self.runner = runner
        self.check = check
        self.in_flight: list[SchedulerOutput] = []  # scheduled, not yet applied
        self.last_output: SchedulerOutput | None = None
        self.delivered: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, str] = {}
        self.scheduled_tokens: dict[str, int] = {}
        self.preempted_ids: set[str] = set()
        self.admitted: dict[str, Request] = {}  # filled by drivers that want the requests afterwards
        self.num_steps = 0
        schedule, update_from_output = scheduler.schedule, scheduler.update_from_output

        def watched_schedule() -> SchedulerOutput:
            so = self.last_output = schedule()
            for req_id, n in so.num_scheduled_tokens.items():
                self.scheduled_tokens[req_id] = self.scheduled_tokens.get(req_id, 0) + n
            self.preempted_ids |= so.preempted_req_ids
            if so.num_scheduled_tokens:
                self.in_flight.append(so)
            self.check(self, "schedule")
            return so

        def watched_update(so: SchedulerOutput, ro: ModelRunnerOutput) -> EngineCoreOutputs:
            outputs = update_from_output(so, ro)
            self.in_flight = [f for f in self.in_flight if f is not so]
            for out in outputs.outputs:
                self.delivered.setdefault(out.req_id, []).extend(out.new_token_ids)
                if out.finish_reason is not None:
                    self.finish_reasons[out.req_id] = out.finish_reason
            self.check(self, "update")
            return outputs

        scheduler.schedule = watched_schedule
        scheduler.update_from_output = watched_update

    def step(self) -> None:
        self.num_steps += 1
        # A scheduler that stops making progress must fail the test, not hang it (mutants do this).
        assert self.num_steps <= MAX_LOOP_STEPS, f"the engine did not drain in {MAX_LOOP_STEPS} steps"
        if self.scheduler.async_scheduling():
            self.core.step_with_batch_queue()
        else:
            self.core.step()

    def busy(self) -> bool:
        return self.core.has_work()

    def run(self) -> None:
        try:
            while self.busy():
                self.step()
        finally:
            self.core.shutdown()


def check_blocks(scheduler: Scheduler) -> None:
    """No block leaked, none both free and owned, ref counts equal the number of owners (a cached block
    is shared by the requests that hit it), and the free queue plus the used blocks are the pool."""
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    owners: dict[int, int] = {}
    for req_id, request in scheduler.requests.items():
        block_ids = kv.get_block_ids(req_id)
        if request.status != RequestStatus.RUNNING:
            assert not block_ids, f"{request} holds blocks while not running"
        assert len(block_ids) == len(set(block_ids)), f"{request} owns a block twice"
        for b in block_ids:
            owners[b] = owners.get(b, 0) + 1
    free = pool.free_block_ids()
    assert len(free) == pool.num_free_blocks, "the free queue holds a block twice"
    assert not free & owners.keys(), "a block is free and owned"
    assert len(owners) + pool.num_free_blocks == pool.num_blocks, "blocks leaked"
    assert all(pool.ref_cnt(b) == n for b, n in owners.items()), "a ref count differs from its owners"
    assert all(pool.ref_cnt(b) == 0 for b in free)
