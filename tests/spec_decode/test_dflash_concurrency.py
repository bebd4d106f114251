"""DFlash at concurrency >= 2 (the defect in seeds.md, Document 2): requests that arrive at different
steps, accept different numbers of drafts and finish at different steps must each get, step for step,
the drafts they get when they run alone, and the context continuity check must never fire.

The DFlash head is the real one (random weights, seeded). A wrapper scripts each request's acceptance
per step (it proposes the target's continuation up to the scripted count, then a wrong token), and logs
the head's own drafts and its output rows for the request's block, so the head's context must follow
what the target committed for each request. The rows are compared bitwise: a random head's argmax
drafts repeat a few tokens, which would hide a wrong context.
"""

from dataclasses import dataclass, field

import pytest
import torch

from refengine.engine.llm import LLM
from refengine.oracle.seam_teacher import Trajectories
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.proposer import PaddedDraftBatch, Proposer

K = 4


@dataclass(frozen=True)
class Arrival:
    req_id: str
    step: int  # engine step at which the request is added
    prompt: list[int]
    max_tokens: int
    accepted: tuple[int, ...]  # drafts accepted at its proposing step i: accepted[i % len]


# "a" arrives first and finishes first, so the others move up a batch row while it is still running
# with them: state read by batch row instead of request id would then belong to another request.
ARRIVALS = [
    Arrival("a", 0, [(7 * j + 3) % 240 + 5 for j in range(9)], 10, (0, K, 1)),
    Arrival("b", 2, [(11 * j + 1) % 240 + 5 for j in range(14)], 16, (K, 0, 2, 0)),
    Arrival("c", 3, [(5 * j + 8) % 240 + 5 for j in range(6)], 20, (1, 1, 0, K)),
    Arrival("d", 7, [(13 * j + 2) % 240 + 5 for j in range(11)], 10, (2, K, 0)),
]


class RecordingHead:
    """The DFlash head, keeping the output rows and request boundaries of its last block forward."""

    def __init__(self, head) -> None:
        self.head = head
        self.last: tuple[torch.Tensor, list[int]] | None = None

    def __getattr__(self, name):
        return getattr(self.head, name)

    def forward(self, input_ids, positions, meta):
        out = self.head.forward(input_ids, positions, meta)
        self.last = (out.clone(), meta.query_start_loc.tolist())
        return out


@dataclass
class ScriptedAcceptance:
    """Logs the inner DFlash drafter's drafts and block rows per request; proposes drafts that accept
    the scripted count."""

    inner: Proposer
    trajectories: Trajectories
    arrivals: dict[str, Arrival]
    vocab_size: int
    log: dict[str, list[tuple[tuple[int, ...], torch.Tensor]]] = field(default_factory=dict)
    block: tuple[torch.Tensor, list[int]] | None = None  # the head's last block forward
    random_init = False

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.inner.capture_layers

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor | None:
        head = self.inner.network
        head.last = None
        drafts = self.inner.propose(batch)
        self.block = head.last
        return drafts

    def commit(self, requests, rows) -> dict[str, list[int]]:
        drafts = self.inner.commit(requests, rows)
        # The drafter runs one block forward over the drafting requests, in batch order.
        drafting = [d for d in requests if drafts.get(d.req_id)]
        rows = {}
        if drafting:
            out, starts = self.block
            rows = {d.req_id: out[starts[i] : starts[i + 1]] for i, d in enumerate(drafting)}
        proposals = {}
        for d in requests:
            if not d.propose:
                continue
            steps = self.log.setdefault(d.req_id, [])
            steps.append((tuple(drafts[d.req_id]), rows[d.req_id]))
            script = self.arrivals[d.req_id].accepted
            accepted = script[(len(steps) - 1) % len(script)]
            known = list(d.token_ids[: d.last_position + 2])
            traj = next(t for t in self.trajectories.items if t.tokens[: len(known)] == known)
            follow = traj.tokens[len(known) : len(known) + K]
            proposals[d.req_id] = follow[:accepted] + [(t + 1) % self.vocab_size for t in follow[accepted:]]
        return proposals

    def remove(self, req_ids) -> None:
        self.inner.remove(req_ids)


def _drive(tiny4, trajectories, arrivals: list[Arrival], max_num_seqs: int) -> ScriptedAcceptance:
    """Runs the engine step by step, adding each request at its arrival step."""
    llm = LLM(
        tiny4,
        num_blocks=128,
        block_size=4,
        max_model_len=64,
        max_num_seqs=max_num_seqs,
        speculative_config=SpeculativeConfig("dflash", K),
        # The script proposes on the host, in commit: sync scheduling feeds what commit returns (async
        # feeds the device's drafts, a frame before commit sees them).
        async_scheduling=False,
    )
    core = llm.engine.core
    core.runner.drafter.network = RecordingHead(core.runner.drafter.network)
    scripted = ScriptedAcceptance(
        core.runner.drafter, trajectories, {a.req_id: a for a in arrivals}, tiny4.config.vocab_size
    )
    core.runner.drafter = scripted
    step_fn = core.step_with_batch_queue if core.max_concurrent_batches > 1 else core.step
    pending = sorted(arrivals, key=lambda a: a.step)
    step = 0
    while pending or core.has_work():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
            core.add_request(Request(a.req_id, a.prompt, params, arrival_index=step))
        if core.has_work():
            step_fn()
        step += 1
    return scripted


@pytest.fixture(scope="module")
def trajectories(tiny4):
    return Trajectories(tiny4, [a.prompt for a in ARRIVALS], max(a.max_tokens for a in ARRIVALS) + K + 2)


@pytest.fixture(scope="module")
def alone(tiny4, trajectories):
    """Each request's per-step head drafts when it is the only request in the engine."""
    return {a.req_id: _drive(tiny4, trajectories, [a], 1).log[a.req_id] for a in ARRIVALS}


@pytest.mark.parametrize("num_requests", [2, 4])
def test_dflash_drafts_at_concurrency_equal_drafts_alone(tiny4, trajectories, alone, num_requests):
    arrivals = ARRIVALS[:num_requests]
    log = _drive(tiny4, trajectories, arrivals, num_requests).log  # a DraftContextError would raise here
    for a in arrivals:
        together, solo = log[a.req_id], alone[a.req_id]
        assert len(together) == len(solo) >= 4, (
            f"request {a.req_id}: {len(together)} steps, {len(solo)} alone"
        )
        for step, ((drafts, rows), (solo_drafts, solo_rows)) in enumerate(zip(together, solo, strict=True)):
            assert drafts == solo_drafts, f"request {a.req_id}, step {step}: drafts differ from its solo run"
            assert torch.equal(rows, solo_rows), (
                f"request {a.req_id}, step {step}: head rows differ from its solo run"
            )
