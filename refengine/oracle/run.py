"""Runs one oracle arm: an engine per arm, its counts (probe.py), its teacher if it has one, and the
absolute checks on its output (absolute.py). judge.py compares arms."""

import dataclasses
from dataclasses import dataclass

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.llm import LLM
from refengine.engine.outputs import RequestOutput, StepRecord
from refengine.model.loader import LoadedModel
from refengine.oracle import structured
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
)
from refengine.sample.sampler import RowParams
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.adaptive_verification import VerifyCostTable
from refengine.spec_decode.config import SpeculativeConfig
from refengine.structured_output.manager import StructuredOutputManager


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
    # Request 1 of every arm stops on this string, which its unconstrained output contains late.
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
    # Structured arms: drafts their grammars cut, verified rows their grammars masked, and requests that
    # their grammar (not max_tokens) ended.
    num_grammar_cut_drafts: int = 0
    num_grammar_masked_rows: int = 0
    num_ended_by_grammar: int = 0
    num_graph_steps: int = 0  # engine steps replayed from a CUDA graph (GPU only)

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """An arm's engine on `size` ranks; each rank loads `model_name`."""

    model_name: str
    size: int


def max_tokens(arm: Arm, workload: Workload) -> int:
    """Structured arms run without ignore_eos and with room for every grammar to end."""
    return max(workload.max_tokens, structured.MAX_TOKENS) if arm.structured else workload.max_tokens


def engine_kwargs(arm: Arm, workload: Workload, block_size: int) -> dict:
    longest = max(len(p) for p in workload.prompts)
    chunk = max(1, min(len(p) for p in workload.prompts) // 2)
    spec = None
    if arm.method is not None:
        method = HOST_METHOD if arm.teacher else arm.method
        spec = SpeculativeConfig(method, workload.num_speculative_tokens, **_method_defaults(method),
                                 enable_adaptive_verification=arm.adaptive)
    lookahead = 0 if spec is None else spec.num_lookahead_slots
    # Headroom past the longest request: under async scheduling the scheduler's optimistic count (every
    # draft in flight accepted) would otherwise cap the drafts near max_model_len earlier than sync does,
    # and the arms would verify different drafts for a reason that is not a bug.
    max_model_len = longest + max_tokens(arm, workload) + 2 * (workload.num_speculative_tokens + 1) + 1
    blocks_one_seq = -(-(max_model_len + lookahead) // block_size)
    return {
        "max_num_seqs": workload.concurrency,
        "max_model_len": max_model_len,
        "block_size": block_size,
        # Room for every request at once: preempt arms evict on purpose (probe.py), so that the arm
        # preempts at c = 1 too and still reaches its full concurrency.
        "num_blocks": _evict_pool(workload, lookahead, block_size, blocks_one_seq)
        if arm.evict
        else blocks_one_seq * workload.concurrency + 8,
        "enable_prefix_caching": arm.prefix_cache,
        # Chunked prefill: every prompt is prefilled over >= 2 steps (a chunk under the shortest prompt), and
        # the budget holds a chunk or a verify step (1 + k tokens) for each of the c requests, so all c are
        # admitted in the first step. A budget alone (smaller than the prompts together) admits in arrival
        # order: at c = 32 the first request finished before the last was admitted (LOW-CONCURRENCY).
        "max_num_batched_tokens": (
            workload.concurrency * (chunk + 1 + workload.num_speculative_tokens)
            if arm.chunked
            else EngineArgs.max_num_batched_tokens
        ),
        "long_prefill_token_threshold": chunk if arm.chunked else EngineArgs.long_prefill_token_threshold,
        "speculative_config": spec,
        "verify_cost_table": oracle_cost_table(workload.num_speculative_tokens) if arm.adaptive else None,
        "async_scheduling": arm.async_scheduling,
        "seed": workload.seed,
        "record_steps": True,
        # On a GPU the steps replay CUDA graphs, as a server's do. Graphs are captured per engine and the
        # oracle builds one per arm, so only the batch size c (a smaller batch pads up to it) and the token
        # counts of mixed steps.
        "cuda_graph_sizes": (workload.concurrency,),
    }


def _evict_pool(workload: Workload, lookahead: int, block_size: int, blocks_one_seq: int) -> int:
    """Just large enough: the c longest requests' own blocks (prompt, outputs and lookahead), and no less
    than one sequence of max_model_len. Requests admitted after the first c find few blocks without cached
    content, and evict cached ones."""
    need = sorted(-(-(len(p) + workload.max_tokens + lookahead) // block_size) for p in workload.prompts)
    return max(blocks_one_seq, sum(need[-workload.concurrency :]))


def _method_defaults(method: str) -> dict:
    # The self-draft gives the embedded model a draft_model with no extra weights.
    return {"num_draft_layers": 1} if method == "draft_model" else {}


def sampling_params(workload: Workload, arm: Arm) -> list[SamplingParams]:
    if arm.structured:
        # Alone: a grammar excludes min_tokens and bad_words, and its end is the stop.
        return [
            SamplingParams(
                temperature=workload.temperature,
                seed=None if workload.temperature == 0 else workload.seed + i,
                max_tokens=max_tokens(arm, workload),
                structured_outputs=structured.CONSTRAINTS[i % len(structured.CONSTRAINTS)],
            )
            for i in range(len(workload.prompts))
        ]
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


def run_arm(
    model: LoadedModel,
    arm: Arm,
    workload: Workload,
    block_size: int,
    *,
    attention_backend: str = "auto",
    tensor_parallel: TensorParallel | None = None,
) -> ArmResult:
    """`tensor_parallel`: the arm's engine runs on that many ranks, each loading the model by name (`model`,
    the same weights, serves the absolute checks)."""
    kwargs = engine_kwargs(arm, workload, block_size)
    if tensor_parallel is not None and arm.teacher:
        raise ValueError("teacher arms replace rank 0's drafter only: they do not run tensor-parallel")
    if tensor_parallel is None:
        llm = LLM(model, **kwargs, attention_backend=attention_backend)
    else:
        llm = LLM(tensor_parallel.model_name, **kwargs, attention_backend=attention_backend,
                  tensor_parallel_size=tensor_parallel.size, device=str(model.model.embed_tokens.weight.device))
    core = llm.engine.core
    if arm.teacher:
        llm.engine.runner.drafter = TeacherProposer(
            [(*p, *o) for p, o in zip(workload.prompts, workload.teacher_outputs, strict=True)],
            workload.num_speculative_tokens,
            model.config.vocab_size,
            corrupt_index(arm),
        )
    drafter = llm.engine.runner.drafter
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
    kv = core.scheduler.kv_cache_manager
    policy = core.scheduler.verify_policy
    counts = dataclasses.replace(
        probe.counts(), prefix_cache_hits=kv.prefix_cache_stats.hits, num_evictions=kv.block_pool.num_evictions,
        num_short_verifies=0 if policy is None else sum(policy.num_chosen[: policy.k]),
    )
    core.shutdown()
    tokens = [o.token_ids for o in outs]
    manager = llm.engine.structured_output_manager
    num_checked, violations, num_ended = absolute_checks(model, workload, outs, params, manager)
    return ArmResult(
        arm=arm,
        concurrency=workload.concurrency,
        tokens=tokens,
        steps=[o.steps for o in outs],
        num_engine_steps=llm.engine.runner.num_steps,
        num_graph_steps=llm.engine.runner.num_graph_steps,
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens,
        counts=counts,
        random_init=random_init,
        num_prompt_tokens=tuple(map(len, workload.prompts)),
        num_argmax_checked=num_checked,
        violations=tuple(violations),
        num_grammar_cut_drafts=core.scheduler.num_grammar_cut_drafts,
        num_grammar_masked_rows=manager.num_masked_rows,
        num_ended_by_grammar=num_ended,
    )


def oracle_cost_table(k: int) -> VerifyCostTable:
    """What an adaptive arm (and the engine property test's adaptive draw) chooses K by, given as
    EngineArgs.verify_cost_table instead of the table measured at start-up: measured costs follow the
    host's load, and an arm must see K vary on every run. Convex in K: where drafts survive the first
    two pay and the rest do not, so K < k even for a teacher; where none survives, K falls to 0."""
    return VerifyCostTable.monotone([1], [[1 + 0.1 * j + 0.3 * max(0, j - 1) ** 2 for j in range(k + 1)]])


def corrupt_index(arm: Arm) -> int | None:
    return CORRUPT_INDEX if arm.method == CORRUPTED_TEACHER else None


def absolute_checks(
    model: LoadedModel,
    workload: Workload,
    outs: list[RequestOutput],
    params: list[SamplingParams],
    manager: StructuredOutputManager,
) -> tuple[int, list[str], int]:
    """Stops and lengths exact (ignore_eos: only max_tokens, stop_token_ids and stop strings end a
    request, stop tokens never before min_tokens; a stop string cuts the text exactly), no banned
    sequence, and under greedy every token the target's argmax. A structured request instead: no token
    its grammar masked, its text parses or matches, and the argmax taken under the grammar's mask.
    Returns (argmax positions checked, violations, structured requests their grammar ended)."""
    violations = []
    num_checked = 0
    num_ended = 0
    for i, (prompt, out, p) in enumerate(zip(workload.prompts, outs, params, strict=True)):
        tokens = out.token_ids
        if p.structured_outputs is not None:
            bitmask, found, ended = structured.grammar_replay(manager, p.structured_outputs, tokens)
            num_ended += ended
            if ended:
                found += structured.text_violations(p.structured_outputs, out.text)
            elif out.finish_reason != "length":
                found.append(f"finished ({out.finish_reason}) before its grammar ended")
            if p.temperature == 0.0 and tokens and not found:
                row = RowParams(0.0, 0, 1.0, 0, (), (), rng_key=0)
                checked, wrong = greedy_argmax_mismatches(model, prompt, tokens, row, bitmask)
                num_checked += checked
                found += wrong[:1]
            violations += [f"request {i}: {v}" for v in found]
            continue
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
    return num_checked, violations, num_ended

