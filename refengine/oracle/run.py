"""Runs oracle arms and compares them: tokens against the baseline, per-step drafts and acceptance
between a method's sync and async arms."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from refengine.engine.llm import LLM
from refengine.engine.outputs import StepRecord
from refengine.model.loader import LoadedModel
from refengine.oracle.arms import Arm
from refengine.sampling_params import SamplingParams
from refengine.spec.config import SpeculativeConfig


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    concurrency: int
    temperature: float
    seed: int
    num_speculative_tokens: int
    # Token sequences banned in bad_words arms, derived from the baseline's output so they bite.
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()


@dataclass
class ArmResult:
    arm: Arm
    tokens: list[list[int]]
    steps: list[list[StepRecord]]
    num_engine_steps: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_preemptions: int
    random_init: bool
    # Tokens scheduled for requests a frame in flight finished, in frames whose token budget was full:
    # under sync that budget went to other requests (Scheduler.num_displacing_tokens).
    num_displacing_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(frozen=True)
class Divergence:
    request: int
    position: int
    expected: int | None  # None: the stream ended earlier
    actual: int | None


@dataclass
class Verdict:
    result: ArmResult
    reference: str  # the arm the tokens were compared with
    divergence: Divergence | None = None
    step_mismatch: str | None = None  # first per-step draft/acceptance difference with the sync twin
    vacuous: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.step_mismatch is None and not self.vacuous


def engine_kwargs(arm: Arm, workload: Workload, block_size: int) -> dict:
    longest = max(len(p) for p in workload.prompts)
    spec = None
    if arm.method is not None:
        spec = SpeculativeConfig(arm.method, workload.num_speculative_tokens, **_method_defaults(arm.method))
    lookahead = 0 if spec is None else spec.num_lookahead_slots
    # Headroom past the longest request: under async scheduling the scheduler's optimistic count (every
    # draft in flight accepted) would otherwise cap the drafts near max_model_len earlier than sync does,
    # and the arms would verify different drafts for a reason that is not a bug.
    max_model_len = longest + workload.max_tokens + 2 * (workload.num_speculative_tokens + 1) + 1
    blocks_one_seq = -(-(max_model_len + lookahead) // block_size)
    return {
        "max_num_seqs": workload.concurrency,
        "max_model_len": max_model_len,
        "block_size": block_size,
        # Forced preemption: a pool that holds one full sequence and a little more.
        "num_blocks": blocks_one_seq + 2 if arm.preempt else blocks_one_seq * workload.concurrency + 8,
        # Chunked prefill: a budget shorter than the prompts, so prefills span several steps.
        "max_num_batched_tokens": max(2 + workload.num_speculative_tokens, longest // 3) if arm.chunked else 2048,
        "speculative_config": spec,
        "async_scheduling": arm.async_scheduling,
        "seed": workload.seed,
        "record_steps": True,
    }


def _method_defaults(method: str) -> dict:
    # The self-draft gives the embedded model a draft_model with no extra weights.
    return {"num_draft_layers": 1} if method == "draft_model" else {}


def sampling_params(workload: Workload, arm: Arm) -> list[SamplingParams]:
    banned = [list(w) for w in workload.bad_words_token_ids] if arm.bad_words else []
    return [
        SamplingParams(
            temperature=workload.temperature,
            seed=None if workload.temperature == 0 else workload.seed + i,
            max_tokens=workload.max_tokens,
            ignore_eos=True,
            bad_words_token_ids=banned,
        )
        for i in range(len(workload.prompts))
    ]


def run_arm(model: LoadedModel, arm: Arm, workload: Workload, block_size: int) -> ArmResult:
    llm = LLM(model, **engine_kwargs(arm, workload, block_size))
    core = llm.engine.core
    counted = _count_steps(core)
    outs = llm.generate([list(p) for p in workload.prompts], sampling_params(workload, arm), batch_queue=arm.batch_queue)
    stats = core.scheduler.spec_decoding_stats
    drafter = core.runner.drafter
    core.shutdown()
    return ArmResult(
        arm=arm,
        tokens=[o.token_ids for o in outs],
        steps=[o.steps for o in outs],
        num_engine_steps=counted[0],
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        num_preemptions=core.scheduler.num_preemptions,
        random_init=drafter is not None and drafter.random_init,
        num_displacing_tokens=core.scheduler.num_displacing_tokens,
    )


def _count_steps(core) -> list[int]:
    """Counts runner forwards without touching the engine's code path."""
    counter = [0]
    execute = core.runner.execute_model

    def counting(so):
        counter[0] += 1
        return execute(so)

    core.runner.execute_model = counting
    return counter


def first_divergence(expected: Sequence[Sequence[int]], actual: Sequence[Sequence[int]]) -> Divergence | None:
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        for pos in range(max(len(exp), len(act))):
            e = exp[pos] if pos < len(exp) else None
            a = act[pos] if pos < len(act) else None
            if e != a:
                return Divergence(i, pos, e, a)
    return None


def first_step_mismatch(expected: list[list[StepRecord]], actual: list[list[StepRecord]]) -> str | None:
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        for n in range(max(len(exp), len(act))):
            e = exp[n] if n < len(exp) else None
            a = act[n] if n < len(act) else None
            if e != a:
                return f"request {i} step {n}: sync {e} vs {a}"
    return None


HEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash"})


def judge(result: ArmResult, reference: ArmResult, sync_twin: ArmResult | None, greedy: bool) -> Verdict:
    """Greedy: tokens against the baseline. Seeded: tokens against the sync twin. Either way, per-step
    drafts and acceptance against the sync twin.

    Two things legitimately move the positions that carry drafts, and with them the per-step records and
    (since acceptance draws are made at draft positions) the seeded tokens; greedy tokens cannot depend
    on either, so they are always compared:
    - preemption: async reserves blocks for optimistic counts, so it preempts at other steps, and a
      resumed request re-prefills without drafts;
    - a full token budget at depth 2: the batch queue schedules frame n+1 before frame n returns, so it
      gives budget to requests frame n finishes (their tokens are discarded), and another request gets
      fewer tokens or drafts in that step than under sync.
    The report says which comparison was skipped and why."""
    moved = [
        reason
        for reason, happened in (
            ("preemption", result.num_preemptions > 0 or (sync_twin is not None and sync_twin.num_preemptions > 0)),
            ("async spent a full budget on requests finishing in flight", result.num_displacing_tokens > 0),
        )
        if happened
    ]
    verdict = Verdict(result, reference.arm.name)
    why = " and ".join(moved)
    if greedy or result.arm.method is None or not moved:
        verdict.divergence = first_divergence(reference.tokens, result.tokens)
    else:
        verdict.notes.append(f"tokens not compared: {why} moved the draft positions")
    if sync_twin is not None and sync_twin is not result:
        if moved:
            verdict.notes.append(f"steps not compared: {why}")
        else:
            verdict.step_mismatch = first_step_mismatch(sync_twin.steps, result.steps)
    if result.arm.method in HEAD_METHODS and not result.random_init and greedy:
        # A trained head that never lands a draft means the async-with-drafts path went unexercised.
        verdict.vacuous = result.num_accepted_tokens == 0
    return verdict
