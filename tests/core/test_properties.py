"""Property tests: random arrivals, lengths, limits, pool sizes and acceptance patterns, with the
invariants checked after every schedule and every update, and every request's final output compared
with what it must be regardless of scheduling (token i of a request is a fixed function of i).

Invariant numbers refer to docs/invariants.md.
"""

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refengine.config import EngineConfig
from refengine.core.async_scheduler import AsyncScheduler
from refengine.core.scheduler import Scheduler
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams

from .harness import EOS, EngineProbe, FakeRunner, Spec, check_blocks, hashed_rng

VOCAB = 24
BANNED = 13  # the token the draft validator refuses in constrained (bad_words) requests
VARIED = 99  # the token a varied prompt has where the shared prefix has another
MAX_STEPS = 5000


@dataclass(frozen=True)
class ReqSpec:
    req_id: str
    arrival_step: int
    prompt_len: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    constrained: bool
    # Prompts share the prefix 100, 101, ...; a varied prompt differs from it at one position, so a
    # cached block may hold every token of a prompt's block but one.
    vary_at: int | None = None
    abort_step: int | None = None

    @property
    def prompt(self) -> list[int]:
        return [VARIED if i == self.vary_at else 100 + i for i in range(self.prompt_len)]


@dataclass(frozen=True)
class Workload:
    k: int
    lookahead: int
    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    requests: tuple[ReqSpec, ...]
    seed: int
    enable_prefix_caching: bool = False


@st.composite
def workloads(draw) -> Workload:
    k = draw(st.sampled_from([0, 1, 3]))
    lookahead = k + draw(st.integers(0, 1)) if k else 0  # dflash reserves k + 1
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_model_len = draw(st.integers(4, 40))
    min_blocks = -(-(max_model_len + lookahead) // block_size)
    requests = []
    for i in range(draw(st.integers(1, 8))):
        max_tokens = draw(st.integers(1, 24))
        prompt_len = draw(st.integers(1, max_model_len - 1))
        requests.append(
            ReqSpec(
                req_id=f"r{i}",
                arrival_step=draw(st.integers(0, 12)),
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                min_tokens=draw(st.integers(0, max_tokens)),
                ignore_eos=draw(st.booleans()),
                stop_token_ids=tuple(draw(st.lists(st.integers(1, VOCAB - 1), max_size=2))),
                constrained=draw(st.booleans()),
                vary_at=draw(st.none() | st.integers(0, prompt_len - 1)),
                abort_step=draw(st.none() | st.integers(0, 40)),
            )
        )
    return Workload(
        k=k,
        lookahead=lookahead,
        block_size=block_size,
        num_blocks=min_blocks + draw(st.integers(0, 10)),  # small pools force preemption
        max_model_len=max_model_len,
        max_num_batched_tokens=draw(st.integers(1, 24)),
        max_num_seqs=draw(st.integers(1, 5)),
        requests=tuple(requests),
        seed=draw(st.integers(0, 2**32)),
        enable_prefix_caching=draw(st.booleans()),
    )


def token_at(seed: int, req_id: str, i: int) -> int:
    return hashed_rng(seed, "tok", req_id, i).randrange(VOCAB)


def expected_output(w: Workload, r: ReqSpec) -> tuple[list[int], str]:
    """What the request must produce, whatever the scheduling: tokens up to the first stop."""
    out: list[int] = []
    while True:
        t = token_at(w.seed, r.req_id, len(out))
        out.append(t)
        if len(out) >= r.min_tokens and ((t == EOS and not r.ignore_eos) or t in r.stop_token_ids):
            return out, "stop"
        if len(out) >= r.max_tokens or r.prompt_len + len(out) >= w.max_model_len:
            return out, "length"


def num_accepted(seed: int, req_id: str, i: int, num_valid: int) -> int:
    rng = hashed_rng(seed, "acc", req_id, i)
    roll = rng.random()
    if roll < 0.3:
        return num_valid
    if roll < 0.6:
        return 0
    return rng.randint(0, num_valid)


def run_workload(w: Workload, async_scheduling: bool) -> EngineProbe:
    config = EngineConfig(
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        max_model_len=w.max_model_len,
        block_size=w.block_size,
        num_blocks=w.num_blocks,
        speculative_config=Spec(w.k, w.lookahead) if w.k else None,
        async_scheduling=async_scheduling,
        enable_prefix_caching=w.enable_prefix_caching,
    )
    if async_scheduling:

        def validator(request, drafts):
            return drafts.index(BANNED) if BANNED in drafts else len(drafts)

        scheduler: Scheduler = AsyncScheduler(config, draft_validator=validator)
    else:
        scheduler = Scheduler(config)

    def propose(req_id: str, n: int) -> list[int]:
        rng = hashed_rng(w.seed, "draft", req_id, n)
        # Sync drafters may propose fewer than k (ngram); async drafters always propose k.
        size = w.k if async_scheduling else rng.randint(0, w.k)
        return [rng.randrange(VOCAB) for _ in range(size)]

    runner = FakeRunner(
        config,
        token_at=lambda req_id, i: token_at(w.seed, req_id, i),
        num_accepted=lambda req_id, i, n: num_accepted(w.seed, req_id, i, n),
        propose=propose,
        check_frame=check_num_scheduled,
    )
    loop = EngineProbe(scheduler, runner, check_state)
    pending = sorted(w.requests, key=lambda r: r.arrival_step)
    try:
        drive(loop, pending)
    finally:
        loop.core.shutdown()
    return loop


def drive(loop: EngineProbe, pending: list[ReqSpec]) -> None:
    aborts = sorted((r.abort_step, r.req_id) for r in pending if r.abort_step is not None)
    while pending or loop.busy():
        while pending and pending[0].arrival_step <= loop.num_steps:
            r = pending.pop(0)
            params = dict(
                max_tokens=r.max_tokens,
                min_tokens=r.min_tokens,
                ignore_eos=r.ignore_eos,
                stop_token_ids=list(r.stop_token_ids),
                bad_words=["banned"] if r.constrained else [],
                temperature=0.0,
            )
            request = Request(r.req_id, r.prompt, SamplingParams(**params), eos_token_id=EOS)
            loop.admitted[r.req_id] = request
            loop.core.add_request(request)
        while aborts and aborts[0][0] <= loop.num_steps:
            loop.core.abort_requests([aborts.pop(0)[1]])
        if loop.busy():
            loop.step()
        else:
            loop.num_steps += 1
        assert loop.num_steps < MAX_STEPS, "the workload did not finish"


def check_state(loop: EngineProbe, phase: str) -> None:
    """On the engine thread, after every schedule and update; the runner may be executing a frame on
    its own thread meanwhile, so this reads the scheduler only."""
    scheduler = loop.scheduler
    config = scheduler.config
    check_blocks(scheduler)
    assert len(scheduler.running) <= config.max_num_seqs
    if phase == "schedule":
        so = loop.last_output
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        assert so.total_num_scheduled_tokens <= config.max_num_batched_tokens
        assert all(n >= 1 for n in so.num_scheduled_tokens.values())
        for req_id, drafts in so.scheduled_spec_decode_tokens.items():
            assert 1 <= len(drafts) <= min(config.num_speculative_tokens, so.num_scheduled_tokens[req_id] - 1)
            if scheduler.async_scheduling():
                assert drafts == [-1] * len(drafts), "async ships only placeholders"
    frames = loop.in_flight
    for req_id, r in scheduler.requests.items():
        nc, ph, nt = r.num_computed_tokens, r.num_output_placeholders, r.num_tokens
        assert ph >= 0 and r.num_stale_output_tokens >= 0
        # Invariant 11: the in-flight count is exactly what the queued frames scheduled.
        assert r.num_in_flight_tokens == sum(so.num_scheduled_tokens.get(req_id, 0) for so in frames), r
        assert r.num_stale_output_tokens <= r.num_in_flight_tokens
        assert nc <= config.max_model_len - 1
        if r.status == RequestStatus.RUNNING:
            # Past its last prefill chunk, a request has sampled (sync) or has a token in flight (async).
            decoding = not r.is_prefill_chunk
            if decoding and (scheduler.async_scheduling() or phase == "update"):
                assert nc - ph == nt - 1, r  # Invariant 4
            elif not decoding:
                assert nc <= nt, r
        else:
            assert nc == 0 and ph == 0 and not r.spec_token_ids and not r.is_finished, r


def check_num_scheduled(runner: FakeRunner, so) -> None:
    """Invariant 2, exactly: each request gets what it lacks (1 + drafts for a decode), in order, capped
    by the budget left and by max_model_len. On the runner's thread, from the frame and the runner's
    own state as the frame reached it."""
    config = runner.config
    remaining = config.max_num_batched_tokens
    known = {r.req_id: len(r.prompt_token_ids) + len(r.output_token_ids) for r in so.scheduled_new_reqs}
    for data in (*so.scheduled_cached_reqs, *so.scheduled_new_reqs):
        cap = config.max_model_len - 1 - data.num_computed_tokens
        sampled, drafts = runner.frame_start.get(data.req_id, (False, []))
        if sampled and config.async_scheduling:
            wanted = 1 + config.num_speculative_tokens
        elif sampled:
            wanted = 1 + len(drafts)
            got = so.scheduled_spec_decode_tokens.get(data.req_id, [])
            assert got == drafts[: len(got)], "sync schedules the drafts it was given"
        else:
            num_known = known.get(data.req_id, runner.states[data.req_id].num_known_tokens)
            wanted = num_known - data.num_computed_tokens
        n = so.num_scheduled_tokens[data.req_id]
        assert n == min(wanted, remaining, cap), (data, n, wanted, remaining, cap)
        remaining -= n


def check_final(loop: EngineProbe, w: Workload) -> None:
    scheduler = loop.scheduler
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    assert scheduler.kv_cache_manager.num_free_blocks == w.num_blocks, "the pool is not full again"
    for r in w.requests:
        tokens, reason = expected_output(w, r)
        delivered = loop.delivered.get(r.req_id, [])
        if loop.admitted[r.req_id].status == RequestStatus.FINISHED_ABORTED:
            assert delivered == tokens[: len(delivered)], r
            continue
        assert delivered == tokens, r
        assert loop.finish_reasons[r.req_id] == reason, r
        num_cached = loop.admitted[r.req_id].num_cached_tokens
        assert num_cached == 0 or w.enable_prefix_caching, r
        # Invariant 44: a hit never covers the last prompt token.
        assert 0 <= num_cached < r.prompt_len and num_cached % w.block_size == 0, r
        if w.k == 0 and reason == "length" and r.req_id not in loop.preempted_ids:
            # Invariants 1 and 7: every position computed once (the cached prefix never), and no step
            # whose output is thrown away.
            assert loop.scheduled_tokens[r.req_id] == r.prompt_len + len(tokens) - 1 - num_cached, r


PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@PROPERTY_SETTINGS
@given(workloads())
def test_property_sync_random_workloads(w: Workload) -> None:
    loop = run_workload(w, async_scheduling=False)
    check_final(loop, w)


@PROPERTY_SETTINGS
@given(workloads())
def test_property_async_random_workloads(w: Workload) -> None:
    loop = run_workload(w, async_scheduling=True)
    check_final(loop, w)
