"""Absolute checks: what an arm's output must satisfy on its own, whatever the baseline says. A bug
shared by every arm (a constraint ignored in a path all of them take) passes every relative
comparison; these catch it."""

from collections.abc import Sequence

import numpy as np
import torch

from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.kv_cache import KVCache
from refengine.model.loader import LoadedModel
from refengine.sample.sampler import RowParams, apply_constraints, unpack_bitmask
from refengine.sampling_params import SamplingParams
from refengine.tokenizer.detokenizer import IncrementalDetokenizer
from refengine.tokenizer.tokenizer import Tokenizer

BLOCK_SIZE = 16  # the scratch cache's own layout, unrelated to the engine's


def banned_occurrences(prompt: Sequence[int], output: Sequence[int], banned: Sequence[Sequence[int]]) -> list[str]:
    """Every banned token sequence that ends inside the output (it may begin in the prompt, as the
    sampler's history does)."""
    tokens = [*prompt, *output]
    found = []
    for word in banned:
        n = len(word)
        for end in range(max(len(prompt) + 1, n), len(tokens) + 1):
            if tuple(tokens[end - n : end]) == tuple(word):
                found.append(f"banned {list(word)} at output position {end - 1 - len(prompt)}")
    return found


def detokenize(tokenizer: Tokenizer, token_ids: Sequence[int]) -> str:
    """The text the engine's own detokenizer makes of these tokens, all at once."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    return detokenizer.push(token_ids) + detokenizer.flush()


def stop_string_violations(tokenizer: Tokenizer, output: Sequence[int], text: str, stop: str) -> list[str]:
    """The text ends exactly where the stop string first begins, and the request ended with the token
    that completed it; without a match the text is all of the output's."""
    full = detokenize(tokenizer, output)
    at = full.find(stop)
    if at < 0:
        return [] if text == full else [f"text {text!r} is not the output's {full!r}"]
    found = []
    if text != full[:at]:
        found.append(f"text cut at {len(text)} characters, the stop string {stop!r} begins at {at}")
    if stop in detokenize(tokenizer, output[:-1]):
        found.append(f"output goes on after the stop string {stop!r}")
    return found


def stop_violations(output: Sequence[int], params: SamplingParams, stopped_by_string: bool = False) -> list[str]:
    """With ignore_eos, a request ends at max_tokens, right after its first stop token, or at a stop
    string; a stop token never comes before min_tokens outputs."""
    stops = set(params.stop_token_ids)
    first_stop = next((j for j, t in enumerate(output) if t in stops), None)
    if first_stop is None:
        if len(output) != params.max_tokens and not stopped_by_string:
            return [f"{len(output)} tokens without a stop, max_tokens {params.max_tokens}"]
        return []
    found = []
    if first_stop < params.min_tokens:
        found.append(f"stop token {output[first_stop]} at output position {first_stop}, min_tokens {params.min_tokens}")
    if first_stop != len(output) - 1:
        found.append(f"stop token at output position {first_stop} but {len(output)} tokens")
    return found


def greedy_argmax_mismatches(
    loaded: LoadedModel,
    prompt: Sequence[int],
    output: Sequence[int],
    params: RowParams,
    token_bitmask: np.ndarray | None = None,
) -> tuple[int, list[str]]:
    """Each output token against the argmax of a fresh single-sequence forward of the target on the same
    prefix, with the request's constraints (bad_words; stop tokens below min_tokens; row i of a grammar's
    `token_bitmask`, one row per output position) masked. One forward
    over prompt + output gives every prefix's last row: the numerics are batch invariant, so a row does
    not depend on the rows after it. Returns (positions checked, mismatches)."""
    model = loaded.model
    tokens = [*prompt, *output]
    length = len(tokens) - 1  # the last output token is never fed
    device = next(model.parameters()).device
    num_blocks = -(-length // BLOCK_SIZE)
    cache = KVCache.allocate(loaded.config, num_blocks, BLOCK_SIZE, dtype=next(model.parameters()).dtype, device=device)
    meta = build_attention_metadata([0], [length], [list(range(num_blocks))], BLOCK_SIZE)
    if device.type != "cpu":
        meta = meta.to(device)
    with torch.inference_mode():
        out = model(torch.tensor(tokens[:length], device=device), torch.arange(length, device=device), meta, cache)
        logits = model.compute_logits(out.hidden_states[len(prompt) - 1 :]).float().cpu()
    mismatches = []
    allowed = None if token_bitmask is None else unpack_bitmask(torch.from_numpy(token_bitmask), logits.shape[-1])
    for i, token in enumerate(output):
        row = apply_constraints(logits[i], params, tokens[: len(prompt) + i], i)
        if allowed is not None:
            row = row.masked_fill(~allowed[i], float("-inf"))
        expected = int(torch.argmax(row))
        if expected != token:
            mismatches.append(f"output position {i}: {token}, argmax {expected}")
    return len(output), mismatches
