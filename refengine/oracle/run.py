"""Runs oracle arms and judges them: tokens against the baseline, per-step drafts and acceptance
between a method's sync and async arms, proof that each variant happened, and absolute checks."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from refengine.engine.llm import LLM
from refengine.engine.outputs import RequestOutput, StepRecord
from refengine.model.loader import LoadedModel
from refengine.oracle.absolute import (
    banned_occurrences,
    detokenize,
    greedy_argmax_mismatches,
    stop_string_violations,
    stop_violations,
)
from refengine.oracle.arms import Arm
from refengine.oracle.probe import ArmCounts, SchedulerProbe
from refengine.oracle.teacher import (
    CORRUPT_INDEX,
    CORRUPTED_TEACHER,
    HOST_METHOD,
    TeacherProposer,
    scripted_accepted,
)
from refengine.sample.sampler import RowParams, banned_next_tokens
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig


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
    # Teacher arms: the outputs of the arm's baseline, which the teacher proposes.
    teacher_outputs: tuple[tuple[int, ...], ...] = ()
    # Request 0 of every arm stops on this token, but not before min_tokens outputs; the token is one
    # its unconstrained output emits early, so the min_tokens mask bites.
    stop_token_id: int | None = None
    min_tokens: int = 0
    # Request 1 of every arm stops on this string, which its unconstrained output contains.
    stop_string: str | None = None


@dataclass
class ArmResult:
    arm: Arm
    concurrency: int
    tokens: list[list[int]]
    steps: list[list[StepRecord]]
    num_engine_steps: int
    num_draft_tokens: int
    num_accepted_tokens: int
    counts: ArmCounts
    random_init: bool
    num_prompt_tokens: tuple[int, ...]
    # Absolute checks on the arm's own output (see absolute.py).
    num_argmax_checked: int = 0
    violations: tuple[str, ...] = ()

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
    ineffective: tuple[str, ...] = ()  # variants of the arm that left no trace
    low_concurrency: bool = False  # fewer requests than c ever ran at once
    bad_words_changes: int | None = None  # None: not a bad_words arm
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.result.violations:
            return "WRONG"  # an absolute check failed
        if self.divergence is not None or self.step_mismatch is not None:
            return "MISMATCH"
        if self.vacuous:
            return "VACUOUS"
        if self.ineffective:
            return "INEFFECTIVE"
        if self.low_concurrency:
            return "LOW-CONCURRENCY"
        return "IDENTICAL"

    @property
    def ok(self) -> bool:
        return self.label == "IDENTICAL"


def engine_kwargs(arm: Arm, workload: Workload, block_size: int) -> dict:
    longest = max(len(p) for p in workload.prompts)
    spec = None
    if arm.method is not None:
        method = HOST_METHOD if arm.teacher else arm.method
        spec = SpeculativeConfig(method, workload.num_speculative_tokens, **_method_defaults(method))
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
        # Room for every request at once: preempt arms evict on purpose (probe.py), so that the arm
        # preempts at c = 1 too and still reaches its full concurrency.
        "num_blocks": blocks_one_seq * workload.concurrency + 8,
        # Chunked prefill: a budget shorter than the prompts together, so prefills span several steps, but
        # with room past c - 1 decoding requests (each 1 + k tokens), so that all c still run at once.
        "max_num_batched_tokens": (
            workload.concurrency * (1 + workload.num_speculative_tokens) + longest // 3 if arm.chunked else 2048
        ),
        "speculative_config": spec,
        "async_scheduling": arm.async_scheduling,
        "seed": workload.seed,
        "record_steps": True,
        # Graphs are captured per engine, and the oracle builds one per arm; eager steps run the same kernels.
        "cuda_graphs": False,
    }


def _method_defaults(method: str) -> dict:
    # The self-draft gives the embedded model a draft_model with no extra weights.
    return {"num_draft_layers": 1} if method == "draft_model" else {}


def sampling_params(workload: Workload, arm: Arm) -> list[SamplingParams]:
    banned = [list(w) for w in workload.bad_words_token_ids] if arm.bad_words else []
    stops = [] if workload.stop_token_id is None else [workload.stop_token_id]
    return [
        SamplingParams(
            temperature=workload.temperature,
            seed=None if workload.temperature == 0 else workload.seed + i,
            max_tokens=workload.max_tokens,
            ignore_eos=True,
            bad_words_token_ids=banned,
            stop_token_ids=stops if i == 0 else [],
            min_tokens=workload.min_tokens if i == 0 else 0,
            stop=[workload.stop_string] if i == 1 and workload.stop_string is not None else [],
        )
        for i in range(len(workload.prompts))
    ]


def run_arm(model: LoadedModel, arm: Arm, workload: Workload, block_size: int) -> ArmResult:
    llm = LLM(model, **engine_kwargs(arm, workload, block_size))
    core = llm.engine.core
    counted = _count_steps(core)
    if arm.teacher:
        core.runner.drafter = TeacherProposer(
            [(*p, *o) for p, o in zip(workload.prompts, workload.teacher_outputs, strict=True)],
            workload.num_speculative_tokens,
            model.config.vocab_size,
            corrupt_index(arm),
        )
    drafter = core.runner.drafter
    # A drafter for a random target (the tiny models) has nothing to learn from: random weights too. The
    # teacher learns from the baseline, whatever the target.
    random_init = drafter is not None and (
        drafter.random_init or (model.source.format == "random" and not arm.teacher)
    )
    # A random drafter may never land a verification worth resuming from; its variants count tokens.
    probe = SchedulerProbe(core.scheduler, spec=drafter is not None and not random_init, force_preemption=arm.preempt)
    params = sampling_params(workload, arm)
    outs = llm.generate([list(p) for p in workload.prompts], params, batch_queue=arm.batch_queue)
    stats = core.scheduler.spec_decoding_stats
    core.shutdown()
    tokens = [o.token_ids for o in outs]
    num_checked, violations = absolute_checks(model, workload, outs, params)
    return ArmResult(
        arm=arm,
        concurrency=workload.concurrency,
        tokens=tokens,
        steps=[o.steps for o in outs],
        num_engine_steps=counted[0],
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        counts=probe.counts(),
        random_init=random_init,
        num_prompt_tokens=tuple(map(len, workload.prompts)),
        num_argmax_checked=num_checked,
        violations=tuple(violations),
    )


def corrupt_index(arm: Arm) -> int | None:
    return CORRUPT_INDEX if arm.method == CORRUPTED_TEACHER else None


def teacher_off_script(result: ArmResult) -> str | None:
    """A teacher's drafts are the baseline's tokens: every verification accepts exactly the scripted
    number (all of them, or those before the corrupted index), or something fed it a wrong context."""
    for i, records in enumerate(result.steps):
        for r in records:
            expected = scripted_accepted(r.draft_token_ids, corrupt_index(result.arm))
            if r.num_accepted != expected:
                return f"request {i} position {r.position}: drafts {r.draft_token_ids} accepted {r.num_accepted}, scripted {expected}"
    return None


def absolute_checks(
    model: LoadedModel, workload: Workload, outs: list[RequestOutput], params: list[SamplingParams]
) -> tuple[int, list[str]]:
    """Stops and lengths exact (ignore_eos: only max_tokens, stop_token_ids and stop strings end a
    request, stop tokens never before min_tokens; a stop string cuts the text exactly), no banned
    sequence, and under greedy every token the target's argmax. Returns (argmax positions checked,
    violations)."""
    violations = []
    num_checked = 0
    for i, (prompt, out, p) in enumerate(zip(workload.prompts, outs, params, strict=True)):
        tokens = out.token_ids
        banned = tuple(map(tuple, p.bad_words_token_ids))
        found = []
        for stop in p.stop:
            found += stop_string_violations(model.tokenizer, tokens, out.text, stop)
        by_string = any(stop in detokenize(model.tokenizer, tokens) for stop in p.stop)
        found += stop_violations(tokens, p, by_string)
        found += banned_occurrences(prompt, tokens, banned)
        if p.temperature == 0.0 and tokens:
            row = RowParams(0.0, 0, 1.0, p.min_tokens, tuple(p.stop_token_ids), banned, rng_key=0)
            checked, wrong = greedy_argmax_mismatches(model, prompt, tokens, row)
            num_checked += checked
            found += wrong[:1]
        violations += [f"request {i}: {v}" for v in found]
    return num_checked, violations


def bad_words_changes(
    result: ArmResult, unconstrained: ArmResult, prompts: Sequence[Sequence[int]], banned: Sequence[Sequence[int]]
) -> int:
    """Requests whose output departs from the unconstrained baseline's at a token that would complete a
    banned sequence there: the constraint changed a sampled token. (Position-keyed sampling picks the
    same token wherever the constraint masks nothing, so the first departure is where it bit.)"""
    changed = 0
    for prompt, out, free in zip(prompts, result.tokens, unconstrained.tokens, strict=True):
        d = first_divergence([free], [out])
        if d is not None and d.expected is not None:
            changed += d.expected in banned_next_tokens([*prompt, *free[: d.position]], banned)
    return changed


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


@dataclass(frozen=True)
class PlacementDifference:
    request: int
    verification: int  # index of the first verification that differs
    expected: tuple[int, int] | None  # (position of the first draft, number of drafts); None: no such step
    actual: tuple[int, int] | None

    @property
    def position(self) -> int:
        """Every token before this position was produced the same way in both arms."""
        return min(p[0] for p in (self.expected, self.actual) if p is not None)


def placement_differences(expected: list[list[StepRecord]], actual: list[list[StepRecord]]) -> list[PlacementDifference]:
    """Per request whose drafts were verified at other positions or in other numbers, the first difference."""
    found = []
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        for n in range(max(len(exp), len(act))):
            e = (exp[n].position, len(exp[n].draft_token_ids)) if n < len(exp) else None
            a = (act[n].position, len(act[n].draft_token_ids)) if n < len(act) else None
            if e != a:
                found.append(PlacementDifference(i, n, e, a))
                break
    return found


@dataclass(frozen=True)
class StepComparison:
    mismatch: str | None
    num_positions: int  # positions both arms verified drafts at


def compare_steps(expected: ArmResult, actual: ArmResult) -> StepComparison:
    """Position by position. A drafter proposes from the committed context, so at a position where both
    arms verified drafts after the same tokens it must have proposed the same ones, whatever the steps
    before looked like; the scheduler may have fed fewer of them (a smaller share of the budget), so the
    common prefix is compared, and the acceptance within it. Past the first differing token (seeded arms
    whose drafts moved) the contexts differ and nothing more is compared."""
    num_positions = 0
    for i, (exp, act) in enumerate(zip(expected.steps, actual.steps, strict=True)):
        divergence = first_divergence([expected.tokens[i]], [actual.tokens[i]])
        num_agreed = len(expected.tokens[i]) if divergence is None else divergence.position
        at = {r.position: r for r in act}
        for e in exp:
            a = at.get(e.position)
            if a is None or e.position - expected.num_prompt_tokens[i] > num_agreed:
                continue
            num_positions += 1
            n = min(len(e.draft_token_ids), len(a.draft_token_ids))
            if e.draft_token_ids[:n] != a.draft_token_ids[:n] or min(e.num_accepted, n) != min(a.num_accepted, n):
                return StepComparison(f"request {i} position {e.position}: sync {e} vs {a}", num_positions)
    return StepComparison(None, num_positions)


MIN_ACCEPTED_TOKENS = 5
MIN_ACCEPTED_SHARE = 0.01


def min_accepted(num_draft_tokens: int) -> int:
    """What a drafter must accept over an arm to count as exercised: max(5 tokens, 1% of its drafts)."""
    return max(MIN_ACCEPTED_TOKENS, math.ceil(MIN_ACCEPTED_SHARE * num_draft_tokens))


def judge(
    result: ArmResult, reference: ArmResult, sync_twin: ArmResult | None, bad_words_changed: int | None = None
) -> Verdict:
    """Tokens in full against the reference (the sync no-spec arm with the same bad_words and
    temperature: seeded sampling is keyed by position, so spec on equals spec off token for token).
    Drafts and acceptance against the sync twin at every position both verified drafts at. Then the
    arm's own evidence: a drafter that accepted too little is VACUOUS (random heads exempt), a variant
    that left no trace INEFFECTIVE, an arm that never ran c requests at once LOW-CONCURRENCY.

    Where drafts are verified is the scheduler's choice, and async scheduling legitimately chooses
    differently (it reserves blocks for optimistic counts; at depth 2 a request finishing in flight keeps
    its seat one frame longer, so others are admitted and chunked a step later): the report notes it."""
    verdict = Verdict(result, reference.arm.name, bad_words_changes=bad_words_changed)
    if sync_twin is not None and sync_twin is not result:
        steps = compare_steps(sync_twin, result)
        verdict.step_mismatch = steps.mismatch
        moved = placement_differences(sync_twin.steps, result.steps)
        if moved:
            d = moved[0]
            verdict.notes.append(
                f"draft placement differs from sync (request {d.request} verification {d.verification}: sync "
                f"(position, drafts) {d.expected} vs {d.actual}); drafts compared at the {steps.num_positions} "
                "positions both verified"
            )
    verdict.divergence = first_divergence(reference.tokens, result.tokens)
    if result.arm.teacher and verdict.step_mismatch is None:
        verdict.step_mismatch = teacher_off_script(result)
    if result.arm.method is not None and not result.random_init:
        # A drafter that (almost) never lands a draft leaves the accepted-drafts path unexercised.
        verdict.vacuous = result.num_accepted_tokens < min_accepted(result.num_draft_tokens)
    counts = result.counts
    verdict.ineffective = tuple(
        variant
        for variant, on, evidence in (
            ("preemption", result.arm.preempt, counts.num_preemptions_after_drafts),
            ("chunked prefill", result.arm.chunked, counts.num_chunked_prefills),
            ("bad_words", result.arm.bad_words, bad_words_changed or 0),
        )
        if on and evidence == 0
    )
    verdict.low_concurrency = counts.peak_concurrency < result.concurrency
    return verdict
