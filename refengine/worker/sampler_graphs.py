"""CUDA graphs of the batched rejection sampler for a verify step of k + 1 rows per request: one graph
per (padded batch size, greedy or seeded), like the target's verify graphs (cuda_graphs.py), so that
verification launches as one replay instead of some fifty small kernels between the target's forward
and the drafter's step.

A step qualifies when its drafts are one-hot (every drafter here), no (row, token) or grammar mask
applies, no row uses top-k or top-p, and acceptance is verification's own (not a study's synthetic
rule); anything else samples eagerly. Its logits and per-row parameters are copied device to device
into static buffers; padded requests are greedy rows of zero logits with -1 drafts, whose tokens are
cut off. `fill` and `step` run the same code with or without capture, so a CPU test checks them against
the eager sampler; capture and replay run only on a GPU.
"""

from __future__ import annotations

from functools import partial

import torch

from refengine.model.cuda_graph_sizes import padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata, rejection_sample


class RejectionSamplerGraphs:
    def __init__(self, vocab_size: int, num_speculative_tokens: int, batch_sizes: list[int], device: torch.device) -> None:
        self.k = num_speculative_tokens
        self.q = num_speculative_tokens + 1
        self.batch_sizes = sorted(set(batch_sizes))
        self.device = device
        b, rows = self.batch_sizes[-1], self.batch_sizes[-1] * self.q
        self._logits = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)  # compute_logits's
        self._temperature = torch.zeros(rows, dtype=torch.float32, device=device)
        self._seeds, self._key_words, self._positions = (torch.zeros(rows, dtype=torch.int64, device=device) for _ in range(3))
        self._drafts = torch.full((b, self.k), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
        # Request r's rows are r * q .. r * q + k, in every verify step of this shape.
        self._index = torch.arange(rows, device=device).view(b, self.q)
        self._num_drafts = torch.full((b,), self.k, dtype=torch.int64, device=device)
        self._none = torch.zeros(0, dtype=torch.int64, device=device)
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0

    def key(self, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata) -> tuple[int, bool] | None:
        """(padded batch size, greedy) of a step the graphs can sample, else None."""
        num_seqs = spec.draft_token_ids.shape[0]
        if (
            spec.draft_probs is not None
            or spec.draft_token_ids.shape[1] != self.k
            or logits.shape != (num_seqs * self.q, self._logits.shape[1])
            or md.num_masked
            or md.num_bitmask_rows
            or md.any_top_k
            or md.any_top_p
        ):
            return None
        padded = padded_batch_size(num_seqs, self.batch_sizes)
        return None if padded is None else (padded, md.all_greedy)

    def fill(self, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata, padded: int) -> None:
        """The step's logits, row parameters and drafts into the static buffers, device to device; rows
        past them up to `padded` requests become greedy padding (whatever an earlier step left)."""
        num_seqs = spec.draft_token_ids.shape[0]
        rows, padded_rows = num_seqs * self.q, padded * self.q
        for static, value in (
            (self._logits, logits),
            (self._temperature, md.temperature),
            (self._seeds, md.seeds),
            (self._key_words, md.key_words),
            (self._positions, md.positions),
        ):
            static[:rows].copy_(value)
            static[rows:padded_rows].zero_()
        self._drafts[:num_seqs].copy_(spec.draft_token_ids)
        self._drafts[num_seqs:padded].fill_(PLACEHOLDER_TOKEN_ID)

    def step(self, padded: int, greedy: bool) -> torch.Tensor:
        """[padded, k + 1] tokens from the static buffers: the eager sampler's code, tensor ops only."""
        rows = padded * self.q
        none = self._none
        md = SamplingMetadata(
            temperature=self._temperature[:rows],
            top_p=torch.ones_like(self._temperature[:rows]),
            top_k=torch.zeros_like(self._seeds[:rows]),
            seeds=self._seeds[:rows],
            key_words=self._key_words[:rows],
            positions=self._positions[:rows],
            masked_rows=none,
            masked_token_ids=none,
            bitmask_rows=none,
            token_bitmask=torch.zeros(0, 0, dtype=torch.int32, device=self.device),
            all_greedy=greedy,
            any_top_k=False,
            any_top_p=False,
            num_masked=0,
            num_bitmask_rows=0,
        )
        spec = SpecDecodeMetadata(self._drafts[:padded], self._num_drafts[:padded], self._index[:padded])
        return rejection_sample(self._logits[:rows], md, spec)

    # ---- capture and replay: a GPU only ---------------------------------------------------------
    # No CPU test can reach them (`pytest -m gpu` checks them on a GPU), so mutation testing on the CPU
    # skips them, as it skips cuda_graphs.py.
    def capture(self) -> None:  # pragma: no mutate block
        with graph_capture(self.device) as capture:
            for padded in reversed(self.batch_sizes):
                for greedy in (True, False):
                    self._graphs[(padded, greedy)] = capture(partial(self.step, padded, greedy))

    def run(self, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata) -> torch.Tensor | None:  # pragma: no mutate block
        """[R, k + 1] tokens replayed for a step whose key() a captured graph has, else None (sample it
        eagerly): a view of the graph's static output, valid until the next replay."""
        key = self.key(logits, md, spec)
        if key not in self._graphs:
            return None
        self.fill(logits, md, spec, key[0])
        graph, tokens = self._graphs[key]
        graph.replay()
        self.num_replays += 1
        return tokens[: spec.draft_token_ids.shape[0]]
