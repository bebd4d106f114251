"""CUDA graphs of the batched rejection sampler for a verify step of k + 1 rows per request, like the
target's verify graphs (cuda_graphs.py), so that verification launches as one replay instead of some
fifty small kernels between the target's forward and the drafter's step.

One graph per padded batch size and per variant of the step: greedy or seeded, with or without masks
((row, token) pairs and grammar bitmasks), top-k and top-p each on or off. A variant runs the eager
sampler's branches for those host facts, so a replay samples what the eager sampler samples, bit for
bit. Only drafts with probabilities (a drafter that samples its drafts) are left to the eager sampler.
The accept rule is the runner's: verification's own, or a speed study's synthetic rule.

A step's logits and per-row parameters are copied device to device into static buffers; its masks
become one dense [rows, vocab] mask there (the pairs scattered, the bitmasks unpacked), which the graph
applies as the eager sampler applies the masks. Padded requests are greedy rows of zero logits with -1
drafts, whose tokens are cut off. `fill` and `step` run the same code with or without capture, so a CPU
test checks them against the eager sampler; capture and replay run only on a GPU.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial

import torch

from refengine.model.cuda_graph_sizes import padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    AcceptRule,
    SpecDecodeMetadata,
    StepAcceptRule,
    accept_matching_prefix,
    rejection_sample,
)
from refengine.sample.sampler import MASKED_LOGIT, mark_forbidden


@dataclass(frozen=True)
class SamplerGraphKey:
    """The graph a verify step replays: its padded batch size and the sampler's branches it takes."""

    padded: int
    greedy: bool  # every row greedy: top-k and top-p then take no part
    masked: bool  # (row, token) pairs or grammar bitmasks apply
    top_k: bool
    top_p: bool


# The variants captured at every padded batch size.
VARIANTS = [(True, masked, False, False) for masked in (False, True)] + [
    (False, masked, top_k, top_p) for masked, top_k, top_p in itertools.product((False, True), repeat=3)
]


class RejectionSamplerGraphs:
    def __init__(
        self,
        vocab_size: int,
        num_speculative_tokens: int,
        batch_sizes: list[int],
        device: torch.device,
        accept_rule: StepAcceptRule | None = None,
    ) -> None:
        self.k = num_speculative_tokens
        self.q = num_speculative_tokens + 1
        self.batch_sizes = sorted(set(batch_sizes))
        self.device = device
        self.accept_rule = accept_rule
        b, rows = self.batch_sizes[-1], self.batch_sizes[-1] * self.q
        self._logits = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)  # compute_logits's
        self._masked = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)
        self._temperature = torch.zeros(rows, dtype=torch.float32, device=device)
        self._top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self._top_k, self._key_words, self._positions = (
            torch.zeros(rows, dtype=torch.int64, device=device) for _ in range(3)
        )
        self._drafts = torch.full((b, self.k), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
        # Request r's rows are r * q .. r * q + k, in every verify step of this shape.
        self._index = torch.arange(rows, device=device).view(b, self.q)
        self._num_drafts = torch.full((b,), self.k, dtype=torch.int64, device=device)
        self._graphs: dict[SamplerGraphKey, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0

    def key(self, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata) -> SamplerGraphKey | None:
        """The graph of a step the graphs can sample, else None."""
        num_seqs = spec.draft_token_ids.shape[0]
        if (
            spec.draft_probs is not None
            or spec.draft_token_ids.shape[1] != self.k
            or logits.shape != (num_seqs * self.q, self._logits.shape[1])
        ):
            return None
        padded = padded_batch_size(num_seqs, self.batch_sizes)
        if padded is None:
            return None
        greedy = md.all_greedy
        masked = bool(md.num_masked or md.num_bitmask_rows)
        return SamplerGraphKey(padded, greedy, masked, md.any_top_k and not greedy, md.any_top_p and not greedy)

    def fill(
        self,
        logits: torch.Tensor,
        md: SamplingMetadata,
        draft_token_ids: torch.Tensor,
        key: SamplerGraphKey,
        positions: torch.Tensor | None = None,
    ) -> None:
        """The step's logits, row parameters, masks and drafts into the static buffers, device to device;
        rows past them up to `key.padded` requests become greedy padding (whatever an earlier step left).
        `positions`, when given, are the exact positions the rows decide (computed on the device under
        async speculative decoding), in place of the metadata's."""
        num_seqs = draft_token_ids.shape[0]
        rows, padded_rows = num_seqs * self.q, key.padded * self.q
        for static, value, pad in (
            (self._logits, logits, 0),
            (self._temperature, md.temperature, 0),
            (self._top_p, md.top_p, 1),
            (self._top_k, md.top_k, 0),
            (self._key_words, md.key_words, 0),
            (self._positions, md.positions if positions is None else positions, 0),
        ):
            static[:rows].copy_(value)
            # An op on an empty slice still costs host time, and a full step has no padding (`>=` would
            # fill an empty slice).
            if padded_rows > rows:  # pragma: no mutate
                static[rows:padded_rows].fill_(pad)
        if key.masked:
            self._masked[:padded_rows].zero_()
            mark_forbidden(self._masked, md, True)
        self._drafts[:num_seqs].copy_(draft_token_ids)
        if key.padded > num_seqs:  # pragma: no mutate
            self._drafts[num_seqs : key.padded].fill_(PLACEHOLDER_TOKEN_ID)

    def step(self, key: SamplerGraphKey) -> torch.Tensor:
        """[padded, k + 1] tokens from the static buffers: the eager sampler's code, tensor ops only."""
        rows = key.padded * self.q
        logits = self._logits[:rows]
        if key.masked:  # what apply_masks does to the pairs and the grammar rows, from the dense mask
            logits = logits.masked_fill(self._masked[:rows], MASKED_LOGIT)
        # The seeds are hashed inside the graph from the exact positions, as the eager path's at_positions.
        md = SamplingMetadata.unmasked(
            temperature=self._temperature[:rows],
            top_p=self._top_p[:rows],
            top_k=self._top_k[:rows],
            key_words=self._key_words[:rows],
            positions=self._positions[:rows],
            all_greedy=key.greedy,
            any_top_k=key.top_k,
            any_top_p=key.top_p,
        )
        index = self._index[: key.padded]
        spec = SpecDecodeMetadata(self._drafts[: key.padded], self._num_drafts[: key.padded], index)
        accept: AcceptRule = accept_matching_prefix
        if self.accept_rule is not None:
            first_rows = index[:, 0]
            accept = partial(
                self.accept_rule, key_words=self._key_words[first_rows], first_positions=self._positions[first_rows]
            )
        return rejection_sample(logits, md, spec, accept)

    # ---- capture and replay: a GPU only ---------------------------------------------------------
    # No CPU test can reach them (`pytest -m gpu` checks them on a GPU), so mutation testing on the CPU
    # skips them, as it skips cuda_graphs.py.
    def capture(self) -> None:  # pragma: no mutate block
        with graph_capture(self.device) as capture:
            for padded in reversed(self.batch_sizes):
                for variant in VARIANTS:
                    key = SamplerGraphKey(padded, *variant)
                    self._graphs[key] = capture(partial(self.step, key))

    def run(self, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata, positions: torch.Tensor | None) -> torch.Tensor | None:  # pragma: no mutate block
        """[R, k + 1] tokens replayed for a step whose key() a captured graph has, else None (sample it
        eagerly): a view of the graph's static output, valid until the next replay."""
        key = self.key(logits, md, spec)
        if key not in self._graphs:
            return None
        self.fill(logits, md, spec.draft_token_ids, key, positions)
        graph, tokens = self._graphs[key]
        graph.replay()
        self.num_replays += 1
        return tokens[: spec.draft_token_ids.shape[0]]
