"""The rest of a uniform verify step after the target's forward, as one CUDA graph: verification (the
rejection sampler's step), the drafter's whole step (pass 1 and the proposal) and the frame's device
columns (step_frame.py). SGLang's spec v2 keeps its draft, verify and draft-extend free of the host the
same way.

A uniform step is one where every request verifies k drafts that the latest frame left on the device,
without masks, logprobs or a grammar, greedy or seeded without top-k and top-p: the steady state of a
served speculative batch. Its target replays the graph of P * (k + 1) tokens (P its padded batch size),
and this graph, captured on that graph's outputs, replays right after it. Every input the two graphs
hand each other moves inside the graphs; the host stages the rows' sampling parameters and drafting
limits (one host-to-device copy) and launches two replays, where the general way launches dozens of
small operations between them.

The sampler's and the drafter's graph steps (sampler_graphs.py, spec_decode/draft_step_graphs.py) run
unchanged inside it, from their own static buffers. `step` runs the same code with or without capture,
so the CPU runs it eagerly (P = the batch, no padding), where tests check it against the general way.

Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.cuda_graph_sizes import padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.model.transformer import ModelOutput
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from refengine.spec_decode.draft_step_graphs import DraftStepGraphs
from refengine.spec_decode.proposer import PaddedDraftBatch
from refengine.worker.input_batch import InputBatch
from refengine.worker.sampler_graphs import RejectionSamplerGraphs, SamplerGraphKey
from refengine.worker.step_rows import ScheduledRow

if TYPE_CHECKING:
    from refengine.worker.cuda_graphs import CudaGraphs


@dataclass(frozen=True, slots=True)
class TargetRows:
    """What a uniform step's target forward left on the device for P requests of k + 1 rows each."""

    logits: torch.Tensor  # [P * (k + 1), V]: every fed row samples
    positions: torch.Tensor  # [P * (k + 1)]: exact
    gathered: torch.Tensor  # [P * (k + 1)]: each row's id as read from the latest frame (-1: none proposed)
    model_output: ModelOutput
    attn_metadata: AttentionMetadata  # at least P sequences


@dataclass(frozen=True, slots=True)
class SampledStep:
    """A uniform step's results on the device, one row per request of P: the step's first, then padding."""

    tokens: torch.Tensor  # [P, k + 1], -1 after the valid ones
    proposed: torch.Tensor  # [P, k]: the drafts proposed after it
    results: torch.Tensor  # [P, (k + 1) + 1 + k + k]: the frame's columns (step_frame.py)
    source: torch.Tensor  # [P + P * k]: each row's last valid token, then the proposed drafts
    num_rejected: torch.Tensor  # [P]


class SpecStepGraphs:
    def __init__(self, sampler: RejectionSamplerGraphs, drafter: DraftStepGraphs, device: torch.device) -> None:
        self.sampler = sampler
        self.drafter = drafter
        self.k = sampler.k
        self.q = sampler.q
        self.batch_sizes = drafter.batch_sizes
        self.device = device
        # Per row its temperature and top-p (float32, two to an int64), top-k and key word; per request its
        # drafting limit. Staged on the host, copied in one piece.
        self._rows = self.batch_sizes[-1] * self.q
        size = 3 * self._rows + self.batch_sizes[-1]
        on_gpu = device.type == "cuda"
        self._staging = torch.zeros(size, dtype=torch.int64, pin_memory=on_gpu)
        self._static = torch.zeros(size, dtype=torch.int64, device=device) if on_gpu else self._staging
        self._copied = torch.cuda.Event() if on_gpu else None
        # Numpy views of the staging buffer per P: a torch view's conversion costs host time every step.
        self._staged = functools.cache(lambda padded: tuple(x.numpy() for x in self._params(self._staging, padded)))
        # None until captured: the steps run eagerly (the CPU), unpadded.
        self._graphs: dict[SamplerGraphKey, tuple[torch.cuda.CUDAGraph, SampledStep]] | None = None
        self._captured_sizes: list[int] = []  # the P with graphs: every step asks which one it pads to
        self.num_replays = 0
        self.num_eager_steps = 0

    def padded_size(self, num_requests: int) -> int | None:
        """The P a step of `num_requests` requests runs at: a captured batch size, or itself eagerly."""
        if self._graphs is None:
            return num_requests if num_requests <= self.batch_sizes[-1] else None
        return padded_batch_size(num_requests, self._captured_sizes)

    # ---- the step, with or without capture ------------------------------------------------------
    def _params(self, buffer: torch.Tensor, padded: int) -> tuple[torch.Tensor, ...]:
        """Views of the staged parameters of P requests (`buffer` a host or device copy)."""
        rows, n = self._rows, padded * self.q
        floats = buffer[:rows].view(torch.float32)
        return (
            floats[:n],
            floats[rows : rows + n],
            buffer[rows : rows + n],
            buffer[2 * rows : 2 * rows + n],
            buffer[3 * rows : 3 * rows + padded],
        )

    def step(self, key: SamplerGraphKey, rows: TargetRows) -> SampledStep:
        """Verify P requests' rows, draft after them and lay out the frame: tensor ops only."""
        p, q, n = key.padded, self.q, key.padded * self.q
        temperature, top_p, top_k, key_words, limit = self._params(self._static, p)
        positions = rows.positions[:n]
        # Row j of a request decides the position after its fed row j; its drafts are the ids it fed after
        # its first row, as the latest frame proposed them.
        md = SamplingMetadata.unmasked(
            temperature=temperature, top_p=top_p, top_k=top_k, key_words=key_words, positions=positions + 1,
            all_greedy=key.greedy, any_top_k=False, any_top_p=False,
        )  # fmt: skip
        drafts = rows.gathered[:n].view(p, q)[:, 1:]
        self.sampler.fill(rows.logits[:n], md, drafts, key)
        tokens = self.sampler.step(key)
        valid = (tokens != PLACEHOLDER_TOKEN_ID).sum(dim=1)
        # Invariant 48: a request's rejected drafts are its fed drafts less its valid tokens less one.
        num_rejected = self.k - (valid - 1)
        out = rows.model_output
        batch = PaddedDraftBatch(
            self.drafter.requests(p),
            tokens.reshape(-1).clamp(min=0),  # a rejected row's input is any valid id
            num_rejected,
            out.hidden_states[:n],
            {i: t[:n] for i, t in out.aux_hidden_states.items()},
            positions,
            rows.attn_metadata,
        )
        self.drafter.fill(batch, limit, p)
        proposed = self.drafter.step(p)
        last = tokens.gather(1, (valid - 1)[:, None])[:, 0]
        results = torch.cat([tokens, positions.view(p, q)[:, :1], drafts, proposed], dim=1)
        return SampledStep(tokens, proposed, results, torch.cat([last, proposed.reshape(-1)]), num_rejected)

    # ---- capture and replay: a GPU only ---------------------------------------------------------
    def capture(self, target: CudaGraphs) -> None:  # pragma: no mutate block
        """One graph per batch size and variant, on the outputs of the target's graph of P * (k + 1) tokens
        (a batch size whose verify step the target graphs leave out, past max_num_batched_tokens, has none)."""
        self._graphs = {}
        with graph_capture(self.device) as capture:
            for padded in reversed(self.batch_sizes):
                if not target.holds(padded * self.q):
                    continue
                rows = target.verify_rows(padded * self.q)
                for greedy in (True, False):
                    key = SamplerGraphKey(padded, greedy, False, False, False)
                    self._graphs[key] = capture(partial(self.step, key, rows))
                self._captured_sizes.append(padded)

    def key(self, padded: int, batch_rows: Sequence[int], input_batch: InputBatch) -> SamplerGraphKey:
        """The graph of a uniform step of the requests in `batch_rows` at P = `padded`: greedy, or seeded
        (top-k and top-p only on greedy rows: the runner's eligibility, sample/step_support.py)."""
        greedy = not input_batch.temperature[np.asarray(batch_rows, dtype=np.int64)].any()
        return SamplerGraphKey(padded, greedy, False, False, False)

    def run(self, key: SamplerGraphKey, verified: Sequence[ScheduledRow], input_batch: InputBatch, rows: TargetRows) -> SampledStep:
        """The step of the `verified` requests, replayed right after its target's graph of P = `key.padded`
        requests, or run eagerly on `rows`."""
        rows_a = np.repeat(np.asarray([r.batch_row for r in verified], dtype=np.int64), self.q)
        limits = [self.drafter.proposer.position_limit(r.state.block_ids) for r in verified]
        self._stage(key.padded, rows_a, limits, input_batch)
        if self._graphs is None:
            self.num_eager_steps += 1
            return self.step(key, rows)
        # pragma: no mutate block
        graph, out = self._graphs[key]
        graph.replay()
        self.num_replays += 1
        return out

    def _stage(self, padded: int, rows_a: np.ndarray, limits: list[int], input_batch: InputBatch) -> None:
        """The rows' parameters, and greedy padding without drafts behind them, into the static buffer."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has left the staging buffer
        t, f, k, w, lim = self._staged(padded)
        n, b = rows_a.shape[0], len(limits)
        t[:n], f[:n], k[:n], w[:n] = (a[rows_a] for a in (input_batch.temperature, input_batch.top_p, input_batch.top_k, input_batch.key_words))
        lim[:b] = limits
        t[n:], f[n:], k[n:], w[n:], lim[b:] = 0, 1, 0, 0, 0
        if self._copied is not None:
            self._static.copy_(self._staging, non_blocking=True)
            self._copied.record()
