"""Judges an oracle arm: its tokens in full against the baseline, its drafts and acceptance against
its method's sync twin, the evidence that its variants happened, and what its drafter accepted."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from refengine.engine.outputs import StepRecord
from refengine.oracle.run import ArmResult, corrupt_index
from refengine.oracle.teacher import scripted_accepted
from refengine.sample.bad_words import banned_next_tokens


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


def teacher_off_script(result: ArmResult) -> str | None:
    """A teacher's drafts are the baseline's tokens: every verification accepts exactly the scripted
    number (all of them, or those before the corrupted index), or something fed it a wrong context."""
    for i, records in enumerate(result.steps):
        for r in records:
            expected = scripted_accepted(r.draft_token_ids, corrupt_index(result.arm))
            if r.num_accepted != expected:
                return f"request {i} position {r.position}: drafts {r.draft_token_ids} accepted {r.num_accepted}, scripted {expected}"
    return None


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


# Structured arms must mostly end by their grammar, not by max_tokens, to have tested the grammar's end.
MIN_ENDED_BY_GRAMMAR = 0.9


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
    result: ArmResult,
    reference: ArmResult,
    sync_twin: ArmResult | None,
    bad_words_changed: int | None = None,
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
            ("prefix cache", result.arm.prefix_cache, counts.prefix_cache_hits),
            ("eviction", result.arm.evict, counts.num_evictions),
            ("adaptive K", result.arm.adaptive, counts.num_short_verifies),
            # A structured arm bites with a draft its grammar cut or a verified row its grammar masked.
            ("structured", result.arm.structured, result.num_grammar_cut_drafts + result.num_grammar_masked_rows),
            (
                "grammar end",
                result.arm.structured,
                result.num_ended_by_grammar >= MIN_ENDED_BY_GRAMMAR * len(result.tokens),
            ),
        )
        if on and not evidence
    )
    verdict.low_concurrency = counts.peak_concurrency < result.concurrency
    return verdict
