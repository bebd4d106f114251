"""ModelRunner: a step's inputs from a SchedulerOutput, the model, verification, sampling and drafting.

State lives in `requests`, keyed by request id (invariant 17), and in the persistent InputBatch, whose
rows change only as the SchedulerOutputs say (input_batch.py). As in vLLM, `execute_model` plans the
step on the host (`_plan`: a StepPlan), asks the dispatcher once for its way (step_plan.py) and launches
the target's forward (`_launch`); `sample_tokens` verifies, samples and drafts, the general way or as
the uniform step's one graph. Zero-bubble speculative decoding (Model Runner V2, SGLang's spec v2): a
step's results stay on the device as a StepFrame, the next step's inputs are completed from them there
(device_inputs.py), and the host applies a frame one step late (in_flight_frames.py), unless the next
step needs it at once (logprobs, bad words, a grammar, a host drafter).

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from refengine.distributed.parallel_state import TPGroup
from refengine.model.device import on_device, to_device
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import Transformer
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, StepAcceptRule
from refengine.spec_decode.proposer import Proposer
from refengine.worker.async_output import AsyncModelRunnerOutput
from refengine.worker.device_inputs import CompletedInputs, DeviceInputIndices
from refengine.worker.draft_batch import padded_draft_batch
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.in_flight_frames import InFlightFrames
from refengine.worker.input_batch import InputBatch
from refengine.worker.request_state import CachedRequestState
from refengine.worker.step_frame import StepFrame
from refengine.worker.step_plan import Dispatcher, StepPlan
from refengine.worker.step_rows import ExecutedBatch, FedDrafts, ScheduledRow
from refengine.worker.target_step import TargetStep, forward
from refengine.worker.verify_step import token_logprobs, verify_rows


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        kv_cache: KVCache,
        input_batch: InputBatch,
        *,
        drafter: Proposer | None = None,
        dispatcher: Dispatcher | None = None,
        accept: StepAcceptRule | None = None,
        tp_group: TPGroup | None = None,
        num_lookahead_slots: int = 0,
    ) -> None:
        self.model = model
        # Tensor parallelism: this rank's group (None: one rank, nothing to agree on).
        self.tp_group = tp_group
        # Inputs are built on the host; on a GPU they travel from pinned memory, non-blocking.
        self.device = kv_cache.layers[0].key.device if kv_cache.layers else torch.device("cpu")
        # The one chooser of a step's way, holding the graphs the engine captured (none: every step eager).
        self.dispatcher = dispatcher or Dispatcher(0, input_batch, None, None, None, None, ())
        # How drafts are accepted: verification (None), unless a speed study swaps in synthetic_acceptance.py's.
        self.accept = accept
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        self.drafter = drafter
        # KV slots past a step's fed tokens that the scheduler reserves for the drafter (invariant 49).
        self.num_lookahead_slots = num_lookahead_slots
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = input_batch
        self.num_steps = 0
        self._executed: ExecutedBatch | None = None
        # Sampled steps the host has not applied yet.
        self.in_flight = InFlightFrames(self.requests, input_batch, self.device)
        self._last_frame: StepFrame | None = None
        # Launches that found the previous step's results not yet landed: the GPU overlap witness.
        self.num_overlapped_launches = 0
        # Steps whose results went in flight, and input ids gathered on the device: the path ran.
        self.num_in_flight_steps = 0
        self.num_gathered_inputs = 0
        # Launches whose positions the device moved back by a frame in flight that fed drafts.
        self.num_corrected_launches = 0
        # Steps whose results the runner waited for on the host's behalf: those with logprobs, bad words,
        # a grammar or a host drafter (at once), and, under sync scheduling, the drafts the scheduler
        # asks for. A host drafter's own reads are its num_readbacks.
        self.num_readback_steps = 0

    # ---- state -------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput, latest: StepFrame | None) -> dict[str, int]:
        """Apply the step's membership to the requests and their batch rows: the only place rows are
        added, removed or moved. Returns each scheduled request's count as the scheduler planned it."""
        gone = so.finished_req_ids | so.preempted_req_ids
        for req_id in gone:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
        if self.drafter is not None and gone:
            self.drafter.remove(gone)
        planned: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            state = CachedRequestState.from_new(new)
            self.input_batch.add_request(state, [*new.prompt_token_ids, *new.output_token_ids])
            self.requests[new.req_id] = state
            planned[new.req_id] = new.num_computed_tokens
        for cached in so.scheduled_cached_reqs:
            state = self.requests.get(cached.req_id)
            # Invariant 17: a cached request is one this runner holds, found by id.
            if state is None:
                raise RunnerInvariantError(f"scheduled request {cached.req_id!r} has no runner state")
            # Invariant 18: the scheduler's count is exact (sync) or optimistic (async), never behind the
            # runner's exact one, which lies at most its in-flight drafts below its own optimistic count.
            in_flight = None if latest is None else latest.row_of(state)
            exact_at_least = state.num_computed_tokens - (0 if in_flight is None else in_flight.num_drafts)
            if cached.num_computed_tokens < exact_at_least:
                raise RunnerInvariantError(
                    f"request {cached.req_id!r}: scheduler sent num_computed_tokens={cached.num_computed_tokens}, "
                    f"behind the runner's exact {exact_at_least}"
                )
            state.block_ids = cached.block_ids
            self.input_batch.block_table.extend(self.input_batch.req_id_to_index[cached.req_id], cached.block_ids)
            planned[cached.req_id] = cached.num_computed_tokens
        return planned

    # ---- execute -----------------------------------------------------------------------------
    def execute_model(self, so: SchedulerOutput) -> None:
        # Streams, events and graph replays go to the thread's current device: make it the model's.
        # Inference mode for the whole step, host glue included: no tensor of a step is ever
        # differentiated, and autograd's dispatch keys cost every one of its small ops host time.
        with on_device(self.device), torch.inference_mode():
            self._execute_model(so)

    def _execute_model(self, so: SchedulerOutput) -> None:
        if self._executed is not None:
            raise RunnerInvariantError("execute_model called twice without sample_tokens in between")
        self.num_steps += 1
        # Land older frames first: their ids go into the rows of requests still held, and a request
        # that left meanwhile gets a fresh row from the scheduler's tokens below.
        latest = self.in_flight.land(True, self.drafter)
        planned = self._update_states(so, latest)
        plan = self._plan(so, latest, planned)
        self._executed = self._launch(plan, latest) if plan.rows else ExecutedBatch((), torch.empty(0), None)

    def _plan(self, so: SchedulerOutput, latest: StepFrame | None, planned: dict[str, int]) -> StepPlan:
        """The step's rows as the host lays them out, and what the device fills in from `latest`."""
        width = max((len(d) for d in so.scheduled_spec_decode_tokens.values()), default=0)
        lists: dict[str, list[int]] = {name: [] for name in StepPlan.__slots__ if name != "rows"}
        rows: list[ScheduledRow] = []
        num_fed = num_verified = 0
        for req_id, num_scheduled in so.num_scheduled_tokens.items():
            row = self._plan_row(req_id, num_scheduled, so, latest, (num_fed, num_verified, width), lists)
            num_verified += row.first_logits_row is not None
            lists["host_starts"].append(planned[req_id])
            lists["host_shift"].append(planned[req_id] - row.num_computed_tokens)
            if row.first_logits_row is not None:
                self._check_lookahead(req_id, row.state, planned[req_id] + num_scheduled)
            rows.append(row)
            num_fed += num_scheduled
        return StepPlan(tuple(rows), **{name: tuple(v) for name, v in lists.items()})

    def _plan_row(
        self, req_id: str, num_scheduled: int, so: SchedulerOutput, latest: StepFrame | None,
        at: tuple[int, int, int], lists: dict[str, list[int]],
    ) -> ScheduledRow:  # fmt: skip
        """One request's row of the plan, its fed rows from flat row `at[0]`, after `at[1]` verified
        requests, drafts `at[2]` wide; what the device fills in goes into `lists`."""
        num_fed, num_verified, width = at
        state = self.requests[req_id]
        batch_row = self.input_batch.req_id_to_index[req_id]
        scheduled = tuple(so.scheduled_spec_decode_tokens.get(req_id, ()))
        in_flight = None if latest is None else latest.row_of(state)
        # Its drafts are still on the device: the latest frame proposed them and the host has none.
        drafts_on_device = (
            in_flight is not None
            and latest.num_proposed > 0
            and not state.pending_drafts
            and all(d == PLACEHOLDER_TOKEN_ID for d in scheduled)
        )
        drafts = scheduled if drafts_on_device else self._fill_drafts(state, scheduled)
        start = state.num_computed_tokens
        num_known = num_scheduled - len(drafts)
        # Invariant 19: the fed tokens are committed ones, ending at most at the last sampled token.
        if start + num_known > state.num_tokens or num_known < 1:
            raise RunnerInvariantError(
                f"request {req_id!r}: {num_scheduled} scheduled tokens with {len(drafts)} drafts from position "
                f"{start}, but the runner knows only {state.num_tokens} tokens"
            )
        first_logits_row = None
        if start + num_known == state.num_tokens:
            first_logits_row = len(lists["sample_rows"])
            offset = num_fed + num_known - 1
            lists["sample_rows"].extend(range(offset, offset + len(drafts) + 1))
            num_verified += 1
        elif drafts:
            raise RunnerInvariantError(f"request {req_id!r}: drafts scheduled behind a prefill chunk")
        last = start + num_known - 1
        history = self.input_batch.history(batch_row, last + 1)
        gather_at, gather_from = lists["gather_at"], lists["gather_from"]
        if history[last] == PLACEHOLDER_TOKEN_ID:
            # Invariant 19: only the last sampled token may still be in flight, from the latest step.
            if in_flight is None or (history[start:last] == PLACEHOLDER_TOKEN_ID).any():
                raise RunnerInvariantError(f"request {req_id!r}: an input token in flight outside the latest step")
            gather_at.append(num_fed + num_known - 1)
            gather_from.append(in_flight.sampled_row)
        if drafts_on_device:
            # Its drafts' slots in the step's [verified rows, W] matrix: a row with drafts is verified.
            for j in range(len(drafts)):
                lists["fill_slots"].append((num_verified - 1) * width + j)
                lists["fill_rows"].append(num_fed + num_known + j)
                gather_at.append(num_fed + num_known + j)
                gather_from.append(latest.num_sampled + in_flight.sampled_row * latest.num_proposed + j)
        elif drafts:
            # A placeholder the runner has no draft for is fed as token 0 and verified as -1: rejected.
            self.input_batch.write_tokens(batch_row, start + num_known, [max(d, 0) for d in drafts])
        lists["sources"].append(-1 if in_flight is None or in_flight.num_drafts == 0 else in_flight.sampled_row)
        return ScheduledRow(state, batch_row, start, num_scheduled, num_fed, drafts, first_logits_row)

    def _launch(self, plan: StepPlan, latest: StepFrame | None) -> ExecutedBatch:
        """The step's target forward, the way the dispatcher chose, completed on the device from `latest`."""
        rows = plan.rows
        ids_t, positions_t, meta, seq_of_token = self.input_batch.prepare_inputs(
            [r.batch_row for r in rows], list(plan.host_starts), [r.num_scheduled_tokens for r in rows],
            [r.num_computed_tokens for r in rows],
        )  # fmt: skip
        sample_t = torch.from_numpy(np.asarray(plan.sample_rows, dtype=np.int64))
        indices = DeviceInputIndices.build(
            list(plan.gather_at), list(plan.gather_from), list(plan.sources), list(plan.host_shift), seq_of_token
        )
        self.num_gathered_inputs += len(plan.gather_at)
        self.num_corrected_launches += any(s >= 0 for s in plan.sources)
        if latest is not None and not latest.copy.is_ready():
            self.num_overlapped_launches += 1
        way = self.dispatcher.decide(plan, meta)
        if way.target_tokens is not None:
            # CUDA graphs exist only on a GPU: CPU mutation testing cannot reach this branch.
            # pragma: no mutate block
            target = self.dispatcher.target.run(way.target_tokens, ids_t, positions_t, meta, sample_t, indices, latest)
            self.num_graph_steps += 1
        else:
            target = self._eager_target(ids_t, positions_t, meta, sample_t, indices, latest)
            self.num_eager_steps += 1
        done = target.inputs
        fed = sample_positions = None
        # A uniform step reads its drafts and positions from the target's outputs itself; the general way
        # needs them gathered here.
        if plan.fill_slots and way.uniform is None:
            entries = to_device(torch.tensor(plan.fill_slots + plan.fill_rows, dtype=torch.int64), self.device)
            fed = FedDrafts(entries[: len(plan.fill_slots)], done.gathered[entries[len(plan.fill_slots) :]])
        if indices.shifts and way.uniform is None:
            sample_positions = done.positions[target.logits_indices] + 1
        return ExecutedBatch(
            rows, target.logits, target.model_output, done.positions, done.attn_metadata, fed, sample_positions, done.gathered, way
        )

    def _eager_target(self, ids_t, positions_t, meta, sample_t, indices: DeviceInputIndices, latest) -> TargetStep:
        """The target's step without a graph: the same `forward` on the step's own tensors."""
        ids_t, positions_t, sample_t = (to_device(t, self.device) for t in (ids_t, positions_t, sample_t))
        inputs = indices.to_device(latest, self.device) if indices.gathers or indices.shifts else None
        capture_layers = () if self.drafter is None else self.drafter.capture_layers
        return forward(
            self.model, self.kv_cache, ids_t, positions_t, to_device(meta, self.device), sample_t, inputs, capture_layers,
            gathers=indices.gathers, shifts=indices.shifts,
        )  # fmt: skip

    def _check_lookahead(self, req_id: str, state: CachedRequestState, num_planned: int) -> None:
        """Invariant 49: a sampled row's blocks hold every slot the device may write before the host
        learns the step's acceptance: the optimistic count (every draft accepted) and, past it, the
        drafter's lookahead (trtllm#16280: a device a round ahead of the blocks writes past them)."""
        num_slots = len(state.block_ids) * self.block_size
        if self.drafter is not None and num_planned + self.num_lookahead_slots > num_slots:
            raise RunnerInvariantError(
                f"request {req_id!r}: {num_planned} positions planned and {self.num_lookahead_slots} lookahead "
                f"slots, but its {len(state.block_ids)} blocks hold {num_slots}"
            )

    @staticmethod
    def _fill_drafts(state: CachedRequestState, scheduled: Sequence[int]) -> tuple[int, ...]:
        """The scheduler decides how many drafts a request verifies; under async it only ships -1
        placeholders and the runner fills them from its own pending drafts, by request id."""
        return tuple(
            state.pending_drafts[j] if d == PLACEHOLDER_TOKEN_ID and j < len(state.pending_drafts) else d
            for j, d in enumerate(scheduled)
        )

    # ---- sample ------------------------------------------------------------------------------
    def sample_tokens(
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Verify, sample and draft the executed step. `draft_overrides` replaces the drafts a request is
        verified against (the deferred constraint branch pads invalid drafts with -1, which always
        reject); the model was fed the original drafts, so only a prefix of them can be accepted.
        `grammar_output` holds the token bitmasks of the structured-output requests' rows.

        The results stay on the device and the output comes back in flight, nothing here waiting for the
        device, unless the next step needs them on the host (`_needs_host`): then they are read back here."""
        with on_device(self.device), torch.inference_mode():
            return self._sample_tokens(draft_overrides, grammar_output)

    def _sample_tokens(
        self, draft_overrides: Mapping[str, list[int]] | None, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        executed, self._executed = self._executed, None
        if executed is None:
            raise RunnerInvariantError("sample_tokens called without execute_model")
        verified = executed.verified
        drafts_by_req = {
            r.state.req_id: tuple(draft_overrides[r.state.req_id])
            if draft_overrides is not None and r.state.req_id in draft_overrides
            else r.draft_ids
            for r in verified
        }
        sampled = None
        if executed.way.uniform is not None:
            # A uniform step's requests have no constraint, so the engine sends it no overrides or masks.
            if draft_overrides or grammar_output is not None:
                raise RunnerInvariantError("draft overrides or grammar masks for a uniform step, whose requests have no constraint")
            inputs = CompletedInputs(None, executed.positions, executed.attn_metadata, executed.gathered)
            rows = TargetStep(executed.model_output, executed.logits, inputs, None)
            sampled = self.dispatcher.uniform.run(executed.way.uniform, verified, self.input_batch, rows)
            tokens, proposed = sampled.tokens[: len(verified)], sampled.proposed[: len(verified)]
        else:
            tokens, proposed = self._verify_and_propose(executed, verified, drafts_by_req, grammar_output)
        frame = self._last_frame = self.in_flight.record(executed, verified, tokens, proposed, sampled)
        req_ids = [r.state.req_id for r in executed.rows]
        if frame.copy is None:
            self.in_flight.land(True, self.drafter)
            return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[[] for _ in req_ids])
        if not self._needs_host(verified, proposed, draft_overrides, grammar_output):
            self.num_in_flight_steps += 1
            return AsyncModelRunnerOutput(req_ids, [r.sampled_row for r in frame.rows], frame.copy)
        self.num_readback_steps += 1
        self.in_flight.land(False, self.drafter)
        token_rows = frame.copy.rows()
        sampled: list[list[int]] = []
        logprobs: dict[str, list[TokenLogprobs]] = {}
        for row, frame_row in zip(executed.rows, frame.rows, strict=True):
            row_tokens = [] if frame_row.sampled_row is None else token_rows[frame_row.sampled_row]
            if row_tokens and row.state.num_logprobs is not None:
                first = row.first_logits_row
                logprobs[row.state.req_id] = token_logprobs(
                    executed.logits[first : first + len(row_tokens)], row_tokens, row.state.num_logprobs
                )
            sampled.append(row_tokens)
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, logprobs=logprobs)

    def _verify_and_propose(
        self,
        executed: ExecutedBatch,
        verified: list[ScheduledRow],
        drafts_by_req: Mapping[str, tuple[int, ...]],
        grammar_output: GrammarOutput | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The general step: the verified rows' tokens, and the drafter's device drafts after them (one row
        per verified request; None without a device drafter)."""
        tokens = None
        if verified:
            tokens = verify_rows(
                self.input_batch, self.accept, executed.logits, verified, drafts_by_req, grammar_output,
                fed=executed.fed, positions=executed.sample_positions, sampler_graphs=self.dispatcher.sampler,
                sampler_key=executed.way.sampler,
            )  # fmt: skip
        if tokens is not None and self.tp_group is not None:
            # Invariant 45: every rank goes on with the same ids (rank 0's), whatever its own logits said.
            tokens = self.tp_group.broadcast_sampled(tokens)
        proposed = None
        if self.drafter is not None and executed.model_output is not None:
            proposed = self.drafter.propose(padded_draft_batch(executed, verified, tokens, self.input_batch))
        return tokens, proposed

    def _needs_host(
        self,
        verified: list[ScheduledRow],
        proposed: torch.Tensor | None,
        draft_overrides: Mapping[str, list[int]] | None,
        grammar_output: GrammarOutput | None,
    ) -> bool:
        """Whether the step's results must reach the host before the next step: the logprobs are
        computed from them, a host drafter drafts from them, bad words and a grammar judge the next
        drafts against them (so those drafts must be on the host too), and min_tokens counts outputs
        that a step with drafts leaves uncertain."""
        drafting = self.drafter is not None
        if (drafting and proposed is None) or draft_overrides or (drafting and grammar_output is not None):
            return True
        return any(
            r.state.num_logprobs is not None
            or r.state.params.bad_words_token_ids
            or (r.draft_ids and r.state.params.min_tokens > 0)
            for r in verified
        )

    def executed_rows(self) -> tuple[ScheduledRow, ...]:
        """The rows of the step executed and not yet sampled (none between steps)."""
        return () if self._executed is None else self._executed.rows

    def last_sampled_frame(self) -> StepFrame | None:
        """The frame of the step sampled last: what the oracle's step records read, once it lands."""
        return self._last_frame

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        """The drafts proposed after the steps sampled so far, for the scheduler: under sync scheduling
        to schedule them, in the deferred branch to validate them. Lands every frame in flight."""
        self.num_readback_steps += sum(f.copy is not None for f in self.in_flight.frames)
        with on_device(self.device), torch.inference_mode():
            self.in_flight.land(False, self.drafter)
        return {req_id: list(s.pending_drafts) for req_id, s in self.requests.items() if s.pending_drafts}
