"""What the sampler needs to know: RowParams per request (host), and SamplingMetadata per logits row,
as tensors on the logits' device (vLLM's name). The metadata is built on the host from per-row arrays
and sent in non-blocking copies (two, and a third for grammar bitmasks), so sampling a step reads
nothing back from the device."""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from refengine.model.device import arrays_to_device
from refengine.sample import rng


@dataclass(frozen=True, slots=True)
class RowParams:
    """What the sampler needs to know about one request; built by the runner from SamplingParams."""

    temperature: float
    top_k: int  # <= 0 means off
    top_p: float  # 1.0 means off
    min_tokens: int
    stop_token_ids: tuple[int, ...]  # eos (unless ignore_eos) plus the request's stop ids
    bad_words_token_ids: tuple[tuple[int, ...], ...]
    rng_key: int

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    temperature: torch.Tensor  # [N] float32; 0 means greedy
    top_p: torch.Tensor  # [N] float32; 1 means off
    top_k: torch.Tensor  # [N] int64; 0 means off
    # [N] int64: rng.row_seed of (request key, the position the row decides, STREAM_SAMPLE); empty when
    # every row is greedy, for the sampler never reads them then (their hash was most of the greedy
    # sampler graph's 58 kernels).
    seeds: torch.Tensor
    # The two halves of that seed, so that the rejection sampler hashes its other streams on the device.
    key_words: torch.Tensor  # [N] int64: rng.key_word of the row's request key
    positions: torch.Tensor  # [N] int64: the position the row decides
    masked_rows: torch.Tensor  # [M] int64: (row, token) pairs set to -inf (bad words, min_tokens)
    masked_token_ids: torch.Tensor  # [M] int64
    # Grammar rows: row bitmask_rows[g] may emit token t only if bit t of token_bitmask[g] is set.
    bitmask_rows: torch.Tensor  # [G] int64
    token_bitmask: torch.Tensor  # [G, ceil(vocab / 32)] int32
    # Host facts about the rows, so that the sampler picks its branches without reading the device.
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    num_masked: int
    num_bitmask_rows: int

    @classmethod
    def build(
        cls,
        params: Sequence[RowParams],
        positions: Sequence[int],
        masked: Sequence[Sequence[int]],
        device: torch.device,
        bitmask_rows: Sequence[int] = (),
        token_bitmask: np.ndarray | None = None,
    ) -> "SamplingMetadata":
        """One entry per logits row: its request's params, its position and its masked token ids; and
        the grammar bitmask of the rows `bitmask_rows` (row g of `token_bitmask` for bitmask_rows[g])."""
        return cls.from_arrays(
            temperature=np.array([p.temperature for p in params], dtype=np.float32),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            top_k=np.array([max(p.top_k, 0) for p in params], dtype=np.int64),
            key_words=np.array([rng.key_word(p.rng_key) for p in params], dtype=np.int64),
            positions=np.array(positions, dtype=np.int64),
            masked=[(row, token) for row, tokens in enumerate(masked) for token in tokens],
            device=device,
            bitmask_rows=bitmask_rows,
            token_bitmask=token_bitmask,
        )

    @classmethod
    def from_arrays(
        cls,
        *,
        temperature: np.ndarray,
        top_p: np.ndarray,
        top_k: np.ndarray,
        key_words: np.ndarray,
        positions: np.ndarray,
        masked: Sequence[tuple[int, int]],
        device: torch.device,
        bitmask_rows: Sequence[int] = (),
        token_bitmask: np.ndarray | None = None,
    ) -> "SamplingMetadata":
        """From per-row host arrays (a runner gathers them from its persistent rows): the seeds are hashed
        for the whole batch at once and `masked` lists (row, token) pairs, so nothing here loops over rows.
        In a batch with a sampled row greedy rows get seeds too; the sampler never reads them. Row
        bitmask_rows[g] is masked by row g of `token_bitmask`."""
        n, m = len(temperature), len(masked)
        all_greedy = not temperature.any()
        # Hashed in numpy on the host: the same integer arithmetic as on tensors, at a fraction of the
        # per-operation cost for a batch of rows.
        seeds = np.zeros(0, dtype=np.int64) if all_greedy else rng.row_seeds(key_words, positions, rng.STREAM_SAMPLE)
        s = len(seeds)
        pairs = np.asarray(masked, dtype=np.int64).reshape(m, 2)
        ints = np.concatenate(
            [top_k, seeds, key_words, positions, pairs[:, 0], pairs[:, 1], np.asarray(bitmask_rows, dtype=np.int64)]
        )
        floats = np.concatenate([temperature, top_p])
        bitmask = token_bitmask if len(bitmask_rows) else np.zeros((0, 0), dtype=np.int32)
        ints, floats, bitmask = arrays_to_device([ints, floats, bitmask], device)
        return cls(
            temperature=floats[:n],
            top_p=floats[n:],
            top_k=ints[:n],
            seeds=ints[n : n + s],
            key_words=ints[n + s : 2 * n + s],
            positions=ints[2 * n + s : 3 * n + s],
            masked_rows=ints[3 * n + s : 3 * n + s + m],
            masked_token_ids=ints[3 * n + s + m : 3 * n + s + 2 * m],
            bitmask_rows=ints[3 * n + s + 2 * m :],
            token_bitmask=bitmask,
            all_greedy=all_greedy,
            any_top_k=bool((top_k > 0).any()),
            any_top_p=bool((top_p < 1.0).any()),
            num_masked=m,
            num_bitmask_rows=len(bitmask_rows),
        )

    @classmethod
    def unmasked(
        cls,
        *,
        temperature: torch.Tensor,
        top_p: torch.Tensor,
        top_k: torch.Tensor,
        key_words: torch.Tensor,
        positions: torch.Tensor,
        all_greedy: bool,
        any_top_k: bool,
        any_top_p: bool,
    ) -> "SamplingMetadata":
        """Rows without (row, token) pairs or grammar masks, their seeds (unless all are greedy) hashed on
        their device from `key_words` and `positions`: a CUDA graph's static rows, which apply their masks
        before sampling."""
        none = torch.zeros(0, dtype=torch.int64, device=temperature.device)
        return cls(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seeds=none if all_greedy else rng.row_seeds(key_words, positions, rng.STREAM_SAMPLE),
            key_words=key_words,
            positions=positions,
            masked_rows=none,
            masked_token_ids=none,
            bitmask_rows=none,
            token_bitmask=torch.zeros(0, 0, dtype=torch.int32, device=temperature.device),
            all_greedy=all_greedy,
            any_top_k=any_top_k,
            any_top_p=any_top_p,
            num_masked=0,
            num_bitmask_rows=0,
        )

    def at_positions(self, positions: torch.Tensor) -> "SamplingMetadata":
        """The same rows deciding `positions` (on the device, computed there: a step's exact positions
        under async speculative decoding), their seeds (unless all are greedy) hashed there too."""
        if self.all_greedy:
            return dataclasses.replace(self, positions=positions)
        seeds = rng.row_seeds(self.key_words, positions, rng.STREAM_SAMPLE)
        return dataclasses.replace(self, positions=positions, seeds=seeds)
