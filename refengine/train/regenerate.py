"""Self-distillation sequences made by the engine itself: the target's greedy replies to chat prompts,
generated through `LLM.generate` (batched; on a GPU with CUDA graphs), then the target features of
every position from one dense forward per batch of whole sequences.

The replies are cached on disk by a key of everything that determines them; their digest (sha256 of
the token tensors) is what a head's config.json records as its data hash.
"""

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from refengine.model.loaded_model import LoadedModel
from refengine.sampling_params import SamplingParams
from refengine.train.data import FINAL, DistillSet, encode_prompt, layer_key
from refengine.train.dense_target import DenseTarget
from refengine.train.prompts import Prompt
from refengine.train.sharegpt import ChatPrompt

CHUNK = 1024  # prompts handed to LLM.generate at a time


@dataclass(frozen=True)
class Sequences:
    """Prompt + reply token ids, packed: sequence b is tokens[offsets[b]:offsets[b + 1]]."""

    tokens: torch.Tensor  # [N] int64
    offsets: torch.Tensor  # [B + 1] int64
    prompt_lens: torch.Tensor  # [B] int64

    @classmethod
    def of(cls, pairs: Sequence[tuple[list[int], int]]) -> "Sequences":
        lengths = torch.tensor([len(t) for t, _ in pairs], dtype=torch.long)
        return cls(
            torch.tensor([x for t, _ in pairs for x in t], dtype=torch.long),
            torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            torch.tensor([n for _, n in pairs], dtype=torch.long),
        )

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.tokens, self.offsets, self.prompt_lens):
            h.update(t.numpy().tobytes())
        return h.hexdigest()

    @property
    def num_generated(self) -> int:
        return int(self.offsets[-1] - self.prompt_lens.sum())


@dataclass(frozen=True)
class ReplySpec:
    """Everything that determines a set of replies (its cache key)."""

    target_id: str
    prompts_sha256: str
    held_out: bool
    seed: int  # shuffles the training prompts; the held-out part keeps file order
    num_tokens: int  # positions (prompt and reply) to reach
    max_new_tokens: int

    def key(self) -> str:
        text = json.dumps([2, *self.__dict__.values()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def chat_ids(loaded: LoadedModel, prompt: ChatPrompt) -> list[int]:
    """The turn under the target's chat template (with the template's own system prompt)."""
    return encode_prompt(loaded, Prompt("sharegpt", prompt.text, True))


def regenerate(
    llm,
    loaded: LoadedModel,
    prompts: Sequence[ChatPrompt],
    spec: ReplySpec,
    *,
    chunk: int = 64,
    log: Callable[[str], None] = print,
) -> Sequences:
    """Greedy replies to prompts (shuffled by spec.seed unless held out) through llm.generate, `chunk`
    prompts first, then as many as the positions still wanted need (at most CHUNK at a time), until
    the sequences hold spec.num_tokens positions."""
    order = list(prompts)
    if not spec.held_out:
        random.Random(spec.seed).shuffle(order)
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_new_tokens)
    pairs: list[tuple[list[int], int]] = []
    total = 0
    start = time.monotonic()
    first = 0
    while total < spec.num_tokens and first < len(order):
        # As many prompts as the positions still wanted need, judged by the sequences so far.
        wanted = (spec.num_tokens - total) * len(pairs) // max(total, 1) + 1 if pairs else 0
        ids = [chat_ids(loaded, p) for p in order[first : first + min(max(wanted, chunk), CHUNK)]]
        first += len(ids)
        for prompt, output in zip(ids, llm.generate(ids, params), strict=True):
            if total >= spec.num_tokens:
                break
            pairs.append((prompt + list(output.token_ids), len(prompt)))
            total += len(pairs[-1][0])
        seqs = Sequences.of(pairs)
        elapsed = time.monotonic() - start
        log(
            f"replies: {len(pairs)} sequences, {total} positions ({seqs.num_generated} generated), "
            f"{elapsed:.0f}s, {seqs.num_generated / max(elapsed, 1e-9):.0f} generated tok/s"
        )
    return Sequences.of(pairs)


def save_sequences(seqs: Sequences, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({"tokens": seqs.tokens, "offsets": seqs.offsets, "prompt_lens": seqs.prompt_lens}, str(tmp))
    tmp.rename(path)


def load_sequences(path: Path) -> Sequences | None:
    if not path.is_file():
        return None
    raw = load_file(str(path))
    return Sequences(raw["tokens"], raw["offsets"], raw["prompt_lens"])


def cached_replies(
    make_llm: Callable[[], object],
    loaded: LoadedModel,
    prompts: Sequence[ChatPrompt],
    spec: ReplySpec,
    cache_root: Path,
    *,
    chunk: int = 64,
    log: Callable[[str], None] = print,
) -> Sequences:
    path = cache_root / f"replies-{spec.key()}.safetensors"
    if (seqs := load_sequences(path)) is not None:
        log(f"replies: cached {path} ({len(seqs.prompt_lens)} sequences, {len(seqs.tokens)} positions)")
        return seqs
    seqs = regenerate(make_llm(), loaded, prompts, spec, chunk=chunk, log=log)
    save_sequences(seqs, path)
    log(f"replies: saved {path}, sha256 {seqs.digest()}")
    return seqs


@torch.no_grad()
def with_features(
    loaded: LoadedModel, seqs: Sequences, capture: Sequence[int], *, batch_tokens: int = 16384
) -> DistillSet:
    """The sequences with the target features of every position (float16, on the model's device),
    from one dense forward of whole sequences per batch."""
    model = loaded.model
    device = model.embed_tokens.weight.device
    lengths = (seqs.offsets[1:] - seqs.offsets[:-1]).tolist()
    names = [FINAL, *(layer_key(i) for i in capture)]
    features = {
        n: torch.empty(len(seqs.tokens), model.config.hidden_size, dtype=torch.float16, device=device)
        for n in names
    }
    tokens = seqs.tokens.to(device)
    order = sorted(range(len(lengths)), key=lambda b: lengths[b])
    first = 0
    while first < len(order):
        members = [order[first]]
        while (
            first + len(members) < len(order)
            and (len(members) + 1) * lengths[order[first + len(members)]] <= batch_tokens
        ):
            members.append(order[first + len(members)])
        first += len(members)
        rows = torch.cat([torch.arange(int(seqs.offsets[b]), int(seqs.offsets[b + 1])) for b in members]).to(
            device
        )
        positions = torch.cat([torch.arange(lengths[b]) for b in members]).to(device)
        seq_ids = torch.cat([torch.full((lengths[b],), i) for i, b in enumerate(members)]).to(device)
        dense = DenseTarget(model, len(members), max(lengths[b] for b in members))
        final, aux = dense.forward(tokens[rows], positions, seq_ids, tuple(capture))
        features[FINAL][rows] = final.half()
        for i, h in aux.items():
            features[layer_key(i)][rows] = h.half()
    # Offsets stay on the CPU: batching reads them row by row.
    return DistillSet(tokens, seqs.offsets, seqs.prompt_lens, features)
