"""The rejection sampler of a verify step (k + 1 rows a request) as a graph per padded batch size and
variant (docs/design/cuda-graphs.md). A variant runs the eager sampler's branches for its host facts, so
a replay samples what the eager sampler samples, bit for bit; masks become one dense [rows, vocab] mask.
Padded requests are greedy rows of zero logits with -1 drafts, cut off after the replay."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial

import torch

from refengine.model.graphs import GraphPool, GraphSet
from refengine.model.static_buffers import BufferSet, Field
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
# Per logits row: the sampling parameters, with what a padding row holds (greedy, no top-k or top-p).
_ROW_FIELDS = (("temperature", torch.float32, 0), ("top_p", torch.float32, 1), ("top_k", torch.int64, 0),
               ("key_words", torch.int64, 0), ("positions", torch.int64, 0))  # fmt: skip


class RejectionSamplerGraphs:
    def __init__(
        self, vocab_size: int, num_speculative_tokens: int, batch_sizes: list[int], device: torch.device,
        accept_rule: StepAcceptRule | None = None,
    ) -> None:  # fmt: skip
        self.k, self.q = num_speculative_tokens, num_speculative_tokens + 1
        self.batch_sizes = sorted(set(batch_sizes))
        self.accept_rule = accept_rule
        b = self.batch_sizes[-1]
        rows = b * self.q
        fields = {name: Field((rows,), pad, dtype, staged=False) for name, dtype, pad in _ROW_FIELDS}
        fields["logits"] = Field((rows, vocab_size), dtype=torch.float32, staged=False)  # compute_logits's
        fields["masked"] = Field((rows, vocab_size), dtype=torch.bool, staged=False)
        fields["drafts"] = Field((b, self.k), PLACEHOLDER_TOKEN_ID, staged=False)
        self.buffers = BufferSet(device, fields)
        # Request r's rows are r * q .. r * q + k, in every verify step of this shape.
        self._index = torch.arange(rows, device=device).view(b, self.q)
        self._num_drafts = torch.full((b,), self.k, dtype=torch.int64, device=device)
        self.graphs: GraphSet[SamplerGraphKey, torch.Tensor] = GraphSet("rejection sampler", self.step)

    def fill(
        self, logits: torch.Tensor, md: SamplingMetadata, draft_token_ids: torch.Tensor, key: SamplerGraphKey,
        positions: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """The step's logits, row parameters, masks and drafts into the buffers, padded to `key.padded`
        requests; `positions`: the exact positions the rows decide (async spec), else the metadata's."""
        b = self.buffers
        padded_rows = key.padded * self.q
        values = dict(temperature=md.temperature, top_p=md.top_p, top_k=md.top_k, key_words=md.key_words,
                      positions=md.positions if positions is None else positions, logits=logits)  # fmt: skip
        for name, value in values.items():
            b.put(name, value, padded_rows)
        if key.masked:
            b["masked"][:padded_rows].zero_()
            mark_forbidden(b["masked"], md, True)
        b.put("drafts", draft_token_ids, key.padded)

    def step(self, key: SamplerGraphKey) -> torch.Tensor:
        """[padded, k + 1] tokens from the buffers: the eager sampler's code, tensor ops only."""
        rows, b = key.padded * self.q, self.buffers
        logits = b["logits"][:rows]
        if key.masked:  # what apply_masks does to the pairs and the grammar rows, from the dense mask
            logits = logits.masked_fill(b["masked"][:rows], MASKED_LOGIT)
        # The seeds are hashed inside the graph from the exact positions, as the eager path's at_positions.
        md = SamplingMetadata.unmasked(
            **{name: b[name][:rows] for name, _, _ in _ROW_FIELDS},
            all_greedy=key.greedy, any_top_k=key.top_k, any_top_p=key.top_p,
        )  # fmt: skip
        index = self._index[: key.padded]
        spec = SpecDecodeMetadata(b["drafts"][: key.padded], self._num_drafts[: key.padded], index)
        accept: AcceptRule = accept_matching_prefix
        if self.accept_rule is not None:
            first = index[:, 0]
            accept = partial(self.accept_rule, key_words=md.key_words[first], first_positions=md.positions[first])
        return rejection_sample(logits, md, spec, accept)

    def capture(self, pool: GraphPool) -> None:
        keys = [SamplerGraphKey(p, *v) for p in reversed(self.batch_sizes) for v in VARIANTS]
        self.graphs.capture(pool, keys)

    def run(self, key: SamplerGraphKey, logits: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata, positions: torch.Tensor | None) -> torch.Tensor:
        """[R, k + 1] tokens of the step the dispatcher gave `key`: a view, valid until the next replay."""
        self.fill(logits, md, spec.draft_token_ids, key, positions)
        return self.graphs.run(key)[: spec.draft_token_ids.shape[0]]
