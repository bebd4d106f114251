"""Batched sampling on the logits' device. Every operation works row by row (masks, softmax, sorts and
argmax along the vocabulary; noise keyed by each row's request and position), so a request's result
never depends on the other rows of the batch; greedy is an exact argmax. Nothing is read back to the
host: the branches are chosen from SamplingMetadata's host facts."""

from collections.abc import Sequence

import torch

from refengine.sample import rng
from refengine.sample.bad_words import banned_next_tokens
from refengine.sample.metadata import RowParams, SamplingMetadata

# The logit of a token a constraint forbids. A Python scalar, not a tensor made on the device: that would
# be a blocking host-to-device copy.
MASKED_LOGIT = float("-inf")


def masked_token_ids(params: RowParams, history: Sequence[int], num_output_tokens: int) -> list[int]:
    """The tokens a row may not emit: bad words and, below min_tokens, the stop tokens. `history` is
    prompt + outputs + any drafts before this row (so a verify row sees what the non-spec path would
    have seen); only its tail matters."""
    masked = []
    if params.bad_words_token_ids:
        masked += banned_next_tokens(history, params.bad_words_token_ids)
    if num_output_tokens < params.min_tokens:
        masked += params.stop_token_ids
    return masked


def apply_constraints(
    logits: torch.Tensor, params: RowParams, history: Sequence[int], num_output_tokens: int
) -> torch.Tensor:
    """One row of logits with masked_token_ids set to -inf."""
    masked = masked_token_ids(params, history, num_output_tokens)
    if not masked:
        return logits
    out = logits.clone()
    out[masked] = MASKED_LOGIT
    return out


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[G, W] int32 bitmasks -> [G, vocab_size] bool, True where a token is allowed (bit t of word t // 32,
    llguidance's and xgrammar's layout). Ids past the bitmask's 32 * W never are."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)
    if allowed.shape[1] < vocab_size:
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab_size - allowed.shape[1])], dim=1)
    return allowed[:, :vocab_size]


def mark_forbidden(out: torch.Tensor, md: SamplingMetadata, value: float | bool) -> None:
    """Write `value` into [N, V] `out` wherever the metadata's (row, token) pairs and its grammar rows
    forbid a token: -inf into logits (apply_masks), True into a dense mask (a rejection sampler graph's)."""
    if md.num_masked:
        out[md.masked_rows, md.masked_token_ids] = value
    if md.num_bitmask_rows:
        allowed = unpack_bitmask(md.token_bitmask, out.shape[1])
        out[md.bitmask_rows] = out[md.bitmask_rows].masked_fill(~allowed, value)


def apply_masks(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """[N, V] logits with the metadata's (row, token) pairs and its grammar rows' forbidden tokens set
    to -inf: one path on every device, with nothing read back to the host."""
    if not md.num_masked and not md.num_bitmask_rows:
        return logits
    out = logits.clone()
    mark_forbidden(out, md, MASKED_LOGIT)
    return out


def probabilities_batch(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Temperature, top-k and top-p applied to [N, V] logits, as float32 distributions. Greedy rows
    come out at temperature 1 (the caller takes their argmax instead)."""
    temperature = torch.where(md.temperature == 0.0, 1.0, md.temperature)
    scaled = logits.float() / temperature[:, None]
    vocab = scaled.shape[1]
    if md.any_top_k:
        values = torch.sort(scaled, dim=1, descending=True).values
        # A top_k of the vocabulary or more keeps every token: its k-th value is the row's smallest.
        kth = values.gather(1, (md.top_k - 1).clamp(0, vocab - 1)[:, None])
        scaled = scaled.masked_fill((md.top_k > 0)[:, None] & (scaled < kth), MASKED_LOGIT)
    probs = torch.softmax(scaled, dim=1)
    if md.any_top_p:
        sorted_probs, order = torch.sort(probs, dim=1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p; the top token always survives.
        drop = (before >= md.top_p[:, None]) & (md.top_p < 1.0)[:, None]
        probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=1, keepdim=True)
    return probs


def sample_batch(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """[N] token ids, one per row of [N, V] logits, on the logits' device (sample_masked after the masks)."""
    return sample_masked(apply_masks(logits, md), md)


def sample_masked(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """[N] token ids of masked logits: the argmax for greedy rows, for the others an exponential race
    over the processed distribution keyed by (request, position)."""
    greedy = torch.argmax(logits, dim=1)
    if md.all_greedy:
        return greedy
    noise = rng.exponentials(md.seeds, logits.shape[1])
    sampled = torch.argmax(probabilities_batch(logits, md) / noise, dim=1)
    return torch.where(md.temperature == 0.0, greedy, sampled)
