"""The engine's configurations and requests searched together (issue 56), on tiny-qwen3 on the CPU, through
the real engine: LLM.generate for sync and async at depth 1, AsyncLLM (what the server drives, its usage
and the stats /metrics reads) for async at depth 2. Drawn: block size, max_model_len (exact multiples of the block size included), pools small
enough to preempt, the drafter and k, chunked prefill, prefix caching; per request temperature, top-k,
top-p, seed (0 included), logprobs, bad words, stop strings, min_tokens and max_tokens up to the limit,
over prompts that share prefixes or repeat; adaptive verification on or off (on the oracle's fixed cost
table, so that the K it chooses is a function of the draw, not of the machine's load).

Properties: a valid configuration never raises; spec on emits spec off's tokens (greedy and seeded);
usage, the prefix cache's counters and the stats that /metrics reads equal what was emitted and cached,
across preemptions; an invalid combination is refused up front, naming why. Across the examples the
variants must happen: preemptions, chunked prefills, drafts, a step verifying fewer than k drafts, cache hits,
a request at max_model_len."""

import asyncio
import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.async_llm import AsyncLLM
from refengine.engine.llm import LLM
from refengine.engine.outputs import GenerationRequest
from refengine.model.loader import load_model
from refengine.oracle.run import oracle_cost_table
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from tests.property_budget import property_tests

EOS = 258  # tiny-qwen3's; prompts hold bytes 3..255
FRONTS = ("sync", "async depth 1", "async depth 2")
HOST_DRAFTERS = ("ngram", "draft_model")  # they read committed tokens on the host: sync only


@pytest.fixture(scope="module")
def tiny_qwen3():
    return load_model("tiny-qwen3")


@dataclass(frozen=True)
class Config:
    method: str | None
    k: int
    front: str
    block_size: int
    max_model_len: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_prefix_caching: bool
    adaptive: bool = False  # enable_adaptive_verification

    @property
    def lookahead(self) -> int:
        return 0 if self.method is None else self.k + (self.method == "dflash")

    def engine_args(self, model, **changes) -> EngineArgs:
        spec = None if self.method is None else SpeculativeConfig(self.method, self.k, **(
            {"num_draft_layers": 2} if self.method == "draft_model" else {}), enable_adaptive_verification=self.adaptive)  # fmt: skip
        args = EngineArgs(
            model=model, block_size=self.block_size, max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching, speculative_config=spec,
            async_scheduling=self.front != "sync", verify_cost_table=oracle_cost_table(self.k) if self.adaptive else None,
        )  # fmt: skip
        return dataclasses.replace(args, **changes)


@st.composite
def configs(draw) -> Config:
    front = draw(st.sampled_from(FRONTS))
    device_drafters = [None, "eagle", "eagle3", "dflash"]
    method = draw(st.sampled_from(device_drafters + ([*HOST_DRAFTERS] if front == "sync" else [])))
    k = draw(st.integers(1, 3))
    block_size = draw(st.sampled_from([2, 4, 8]))
    multiple = draw(st.integers(2, 6)) * block_size
    max_model_len = max(8, multiple - draw(st.sampled_from([0, 0, 1, block_size // 2])))
    lookahead = 0 if method is None else k + (method == "dflash")
    min_blocks = -(-(max_model_len + lookahead) // block_size)
    num_blocks = min_blocks + draw(st.sampled_from([0, 0, 0, 1, 3 * min_blocks]))  # mostly tight: preemption
    budget = draw(st.sampled_from([k + 1 + draw(st.integers(0, 5)), 256]))
    return Config(
        method, k, front, block_size, max_model_len, num_blocks, budget,
        draw(st.sampled_from([2, 4, 4])), draw(st.sampled_from([True, True, False])),
        method is not None and draw(st.booleans()),
    )  # fmt: skip


@st.composite
def requests(draw, max_model_len: int) -> list[tuple[list[int], SamplingParams]]:
    """2 to 4 requests over one shared prefix; some repeat an earlier prompt exactly."""
    token = st.integers(3, 255)
    prefix = draw(st.lists(token, min_size=max_model_len - 1, max_size=max_model_len - 1))
    out = []
    for _ in range(draw(st.integers(2, 4))):
        if out and draw(st.booleans()):
            prompt = list(draw(st.sampled_from(out))[0])
        else:
            shared = draw(st.integers(0, max_model_len - 2))
            tail = draw(st.lists(token, min_size=1, max_size=max_model_len - 1 - shared))
            prompt = prefix[:shared] + tail
        limit = max_model_len - len(prompt)
        max_tokens = limit if draw(st.integers(0, 2)) else draw(st.integers(1, limit))
        greedy = draw(st.booleans())
        params = SamplingParams(
            temperature=0.0 if greedy else draw(st.sampled_from([0.6, 1.0])),
            top_k=draw(st.sampled_from([0, 0, 5])),
            top_p=draw(st.sampled_from([1.0, 1.0, 0.7])),
            seed=draw(st.sampled_from([None, 0, 7])) if greedy else draw(st.sampled_from([0, 7, 1234])),
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(0, max_tokens)),
            ignore_eos=draw(st.booleans()),
            stop=draw(st.sampled_from([[], [], ["a"], ["bc", "d"]])),
            bad_words=draw(st.sampled_from([[], [], ["e"]])),
            logprobs=draw(st.sampled_from([None, None, 0, 2])),
        )
        out.append((prompt, params))
    return out


@dataclass
class Emitted:
    token_ids: list[int]
    num_prompt_tokens: int = -1
    num_output_tokens: int = -1
    num_cached_tokens: int = -1


def _llm(args: EngineArgs) -> LLM:
    return LLM(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)})


def _async_llm(args: EngineArgs, work) -> tuple[list[Emitted], object, list[int], object]:
    """Every request through AsyncLLM at once; each one's tokens and final usage, the stats, the number
    of tokens each preempted request held when it was preempted, and the scheduler."""
    llm = AsyncLLM(args)
    preempted = _watch_preemptions(llm.engine.core.scheduler)

    async def one(i: int, prompt: list[int], params: SamplingParams) -> Emitted:
        emitted = Emitted([])
        request = GenerationRequest(str(i), prompt, dataclasses.replace(params, logprobs=None), params.logprobs)
        async for delta in llm.generate(request):
            emitted.token_ids += delta.token_ids
            emitted.num_prompt_tokens, emitted.num_output_tokens = delta.num_prompt_tokens, delta.num_output_tokens
            emitted.num_cached_tokens = delta.num_cached_tokens
        return emitted

    async def every() -> list[Emitted]:
        return await asyncio.gather(*(one(i, p, sp) for i, (p, sp) in enumerate(work)))

    try:
        emitted = asyncio.run(every())
        return emitted, llm.stats(), preempted, llm.engine.core.scheduler
    finally:
        llm.shutdown()


def _watch_preemptions(scheduler) -> list[int]:
    """What each preempted request held (prompt and output) when it was preempted; on the scheduler, what
    each admission held when it was admitted (a frame in flight at the preemption may still add to it)."""
    held: list[int] = []
    preempt, admit = scheduler._preempt_request, scheduler.kv_cache_manager.record_admission
    scheduler.admitted = []

    def noting(request) -> None:
        held.append(request.num_tokens)
        scheduler.num_preempted_with_output = getattr(scheduler, "num_preempted_with_output", 0) + (
            request.num_tokens > request.num_prompt_tokens)
        preempt(request)

    def admitting(request, num_cached_tokens) -> None:
        scheduler.admitted.append(request.num_tokens)
        admit(request, num_cached_tokens)

    scheduler._preempt_request = noting
    scheduler.kv_cache_manager.record_admission = admitting
    return held


@st.composite
def cases(draw) -> tuple[Config, list]:
    config = draw(configs())
    return config, draw(requests(config.max_model_len))


# Four requests that grow together in a pool for one: preempted after they emitted, whatever their tokens
# (no eos, no stop string), with the prefix cache on. Which drawn cases preempt depends on the tokens.
PINNED_PREEMPTION = (
    Config(None, 1, "sync", 4, 24, 6, 256, 4, True),
    [([7 + i] * 6, SamplingParams(temperature=0.0, max_tokens=18, ignore_eos=True)) for i in range(4)],
)


def check_valid_configurations_serve_and_account(counts, tiny_qwen3, case):
    config, work = case
    prompts, params = [p for p, _ in work], [sp for _, sp in work]
    off = LLM(tiny_qwen3, max_model_len=config.max_model_len, async_scheduling=False, num_blocks=256)
    expected = [o.token_ids for o in off.generate(prompts, params)]
    args = config.engine_args(tiny_qwen3)
    # LLM.generate adds every request before its first step, so what happens is a function of the draw;
    # AsyncLLM admits them as its thread finds them, so its preemptions follow the machine's timing.
    deterministic = config.front != "async depth 2"
    if deterministic:
        llm = _llm(args)
        preempted = _watch_preemptions(llm.engine.core.scheduler)
        tokens = [o.token_ids for o in llm.generate(prompts, params, batch_queue=False)]  # depth 1
        scheduler = llm.engine.core.scheduler
        stats = None
    else:
        emitted, stats, preempted, scheduler = _async_llm(args, work)
        tokens = [e.token_ids for e in emitted]
        # Usage: what each request was sent, and counted.
        for e, prompt in zip(emitted, prompts):
            assert (e.num_prompt_tokens, e.num_output_tokens) == (len(prompt), len(e.token_ids))
        assert stats.num_prompt_tokens == sum(map(len, prompts))
        assert stats.num_generation_tokens == sum(map(len, tokens))
        assert stats.num_preemptions == len(preempted)
        assert stats.num_requests_running == stats.num_requests_waiting == 0
        assert stats.num_free_blocks == config.num_blocks  # every block back
        assert stats.spec_num_accepted_tokens == sum(stats.spec_num_accepted_tokens_per_pos)
        assert stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
        cached = sum(e.num_cached_tokens for e in emitted)
        assert cached <= stats.prefix_cache_hits
        if not preempted:  # usage reports the first admission's hit, the counter every admission's
            assert cached == stats.prefix_cache_hits
    # Spec on emits spec off's tokens, whatever the configuration (batch-invariant numerics).
    assert tokens == expected
    for prompt, sp, out in zip(prompts, params, tokens):
        assert len(out) <= sp.max_tokens and len(prompt) + len(out) <= config.max_model_len
    # The prefix cache's counters: every admission, a resumed one included, queries what it holds.
    pc_stats = scheduler.kv_cache_manager.prefix_cache_stats
    pc = (pc_stats.queries, pc_stats.hits)
    if stats is not None:  # what /metrics reads is the scheduler's own count
        assert pc == (stats.prefix_cache_queries, stats.prefix_cache_hits)
    if config.enable_prefix_caching:
        # Every admission, a resumed one included, queries every token it holds then: at least what it
        # held when preempted.
        assert len(scheduler.admitted) == len(prompts) + len(preempted)
        assert pc[0] == sum(scheduler.admitted) >= sum(map(len, prompts)) + sum(preempted)
        assert pc[1] % config.block_size == 0 and pc[1] <= pc[0] - len(prompts) - len(preempted)
    else:
        assert pc == (0, 0)
    # The variants that must happen are counted where the draw alone decides them.
    counts["preemptions"] += deterministic and len(preempted)
    counts["resumed with output, prefix caching on"] += deterministic and config.enable_prefix_caching and getattr(
        scheduler, "num_preempted_with_output", 0)
    counts["chunked prefills"] += sum(len(p) > config.max_num_batched_tokens for p in prompts)
    counts["drafts"] += scheduler.spec_decoding_stats.num_draft_tokens > 0
    policy = scheduler.verify_policy
    counts["adaptive K below k"] += policy is not None and sum(policy.num_chosen[: config.k]) > 0
    counts["cache hits"] += pc[1] > 0
    counts["at max_model_len, a multiple of the block size, with lookahead"] += (
        config.max_model_len % config.block_size == 0 and config.lookahead > 0
        and any(len(p) + len(t) == config.max_model_len for p, t in zip(prompts, tokens))
    )  # fmt: skip
    counts[config.front] += 1


test_valid_configurations_serve_and_account, test_valid_configurations_serve_and_account_slow = property_tests(
    check_valid_configurations_serve_and_account, 12, 120,
    variants=("preemptions", "resumed with output, prefix caching on", "chunked prefills", "drafts", "adaptive K below k", "cache hits",
              "at max_model_len, a multiple of the block size, with lookahead", *FRONTS),
    pinned=[{"case": PINNED_PREEMPTION}], case=cases(),
)  # fmt: skip


INVALID = {
    # name: (what the draw changes, a phrase the refusal must hold)
    "a pool one block short of one sequence and its lookahead": ("short pool", "num_blocks"),
    "async with a host drafter": ("async host drafter", "async scheduling was requested"),
    "max_model_len past the model's context": ("long context", "exceeds the model's context"),
    "a prompt with no room left to generate": ("long prompt", "leaves no room to generate"),
}


def check_invalid_combinations_are_refused_up_front(counts, tiny_qwen3, config, case):
    change, phrase = INVALID[case]
    args, prompt = config.engine_args(tiny_qwen3), [5] * (config.max_model_len // 2)
    if change == "short pool":
        args = dataclasses.replace(args, num_blocks=-(-(config.max_model_len + config.lookahead) // config.block_size) - 1)
    elif change == "async host drafter":
        args = dataclasses.replace(args, speculative_config=SpeculativeConfig("ngram", config.k), async_scheduling=True)
    elif change == "long context":
        args = dataclasses.replace(args, max_model_len=tiny_qwen3.model.config.max_position_embeddings + 1)
    else:
        prompt = [5] * config.max_model_len
    with pytest.raises(ValueError, match=phrase) as refused:
        _llm(args).generate([prompt], SamplingParams(temperature=0.0, max_tokens=2))
    assert "\n" not in str(refused.value)  # one line
    counts[case] += 1


test_invalid_combinations_are_refused_up_front, test_invalid_combinations_are_refused_up_front_slow = property_tests(
    check_invalid_combinations_are_refused_up_front, 8, 60, variants=tuple(INVALID),
    config=configs().filter(lambda c: c.num_blocks > 1), case=st.sampled_from(sorted(INVALID)),
)  # fmt: skip
