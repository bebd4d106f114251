"""Runs oracle arms and compares them: tokens against the baseline, per-step drafts and acceptance
between a method's sync and async arms."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.llm import LLM
from refengine.engine.outputs import StepRecord
from refengine.model.loader import LoadedModel
from refengine.oracle.arms import Arm
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
    num_prompt_tokens: tuple[int, ...]

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
    tokens_compared_in_full: bool = True
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
        "max_num_batched_tokens": (
            max(2 + workload.num_speculative_tokens, longest // 3) if arm.chunked else EngineArgs.max_num_batched_tokens
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


def run_arm(
    model: LoadedModel, arm: Arm, workload: Workload, block_size: int, *, attention_backend: str = "auto"
) -> ArmResult:
    llm = LLM(model, **engine_kwargs(arm, workload, block_size), attention_backend=attention_backend)
    core = llm.engine.core
    outs = llm.generate([list(p) for p in workload.prompts], sampling_params(workload, arm), batch_queue=arm.batch_queue)
    stats = core.scheduler.spec_decoding_stats
    drafter = core.runner.drafter
    core.shutdown()
    return ArmResult(
        arm=arm,
        tokens=[o.token_ids for o in outs],
        steps=[o.steps for o in outs],
        num_engine_steps=core.runner.num_steps,
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        num_preemptions=core.scheduler.num_preemptions,
        random_init=drafter is not None and drafter.random_init,
        num_prompt_tokens=tuple(map(len, workload.prompts)),
    )


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


HEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash"})


def judge(result: ArmResult, reference: ArmResult, sync_twin: ArmResult | None, greedy: bool) -> Verdict:
    """Greedy: tokens against the baseline. Seeded: tokens against the sync twin. Either way, drafts and
    acceptance against the sync twin at every position both verified drafts at.

    Where drafts are verified is the scheduler's choice, and async scheduling legitimately chooses
    differently: it reserves blocks for optimistic counts, so it preempts at other steps (and a resumed
    request re-prefills without drafts); at depth 2 a request finishing in flight keeps its seat and its
    share of the budget one frame longer, so the others are admitted, chunked and given drafts a step
    later. Greedy tokens cannot depend on that and are always compared. Seeded tokens can (a position
    that verified a rejected draft samples from the residual distribution, a plain one from the target),
    so where the placement differs from the sync twin's they are compared only before the first
    position it differs at; the report says so."""
    verdict = Verdict(result, reference.arm.name)
    moved: list[PlacementDifference] = []
    if sync_twin is not None and sync_twin is not result:
        moved = placement_differences(sync_twin.steps, result.steps)
        steps = compare_steps(sync_twin, result)
        verdict.step_mismatch = steps.mismatch
        if moved:
            d = moved[0]
            verdict.notes.append(
                f"draft placement differs from sync (request {d.request} verification {d.verification}: sync "
                f"(position, drafts) {d.expected} vs {d.actual}); drafts compared at the {steps.num_positions} "
                "positions both verified"
            )
    if greedy or not moved:
        verdict.divergence = first_divergence(reference.tokens, result.tokens)
    else:
        # Seeded: up to the first moved draft both arms sampled the same way, so the tokens must agree there.
        cut = {d.request: d.position - result.num_prompt_tokens[d.request] for d in moved}
        verdict.divergence = first_divergence(
            [t[: cut.get(i)] for i, t in enumerate(reference.tokens)],
            [t[: cut.get(i)] for i, t in enumerate(result.tokens)],
        )
        verdict.tokens_compared_in_full = False
        verdict.notes.append(
            f"seeded tokens compared up to the first moved draft only ({sum(cut.values())} of "
            f"{sum(len(result.tokens[i]) for i in cut)} tokens of the {len(cut)} request(s) whose drafts moved)"
        )
    if result.arm.method in HEAD_METHODS and not result.random_init and greedy:
        # A trained head that never lands a draft means the async-with-drafts path went unexercised.
        verdict.vacuous = result.num_accepted_tokens == 0
    return verdict
