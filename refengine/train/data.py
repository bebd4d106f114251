"""Self-distillation data: the target's own greedy continuations of seeded prompts, with the target
features each head reads, cached on disk.

A sequence is prompt + completion, `x[0..T-1]`; every position is fed to the target once (prefill,
then one decode row per generated token, the last one included), and the features of position q
are what the runner would hand a drafter for that row: `final` (the target's output after its final
norm) and `layer.<i>` (layer i's output). The cache is one folder per distillation set, named by a
hash of everything that determines it.
"""

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from refengine.model.loaded_model import LoadedModel
from refengine.tokenizer.chat_template import ChatMessage
from refengine.train.dense_target import DenseTarget
from refengine.train.prompts import Prompt, build_prompts

FINAL = "final"
CACHE_ROOT = Path("runs/train-cache")
FORMAT_VERSION = 1
MAX_PROMPT_TOKENS = 320


def layer_key(index: int) -> str:
    return f"layer.{index}"


@dataclass(frozen=True)
class DistillSet:
    """Sequences packed end to end: sequence b is rows offsets[b]:offsets[b + 1] of every tensor."""

    tokens: torch.Tensor  # [N] int64
    offsets: torch.Tensor  # [B + 1] int64
    prompt_lens: torch.Tensor  # [B] int64
    features: dict[str, torch.Tensor]  # name -> [N, H] float16

    @property
    def num_sequences(self) -> int:
        return len(self.prompt_lens)

    @property
    def num_generated(self) -> int:
        return int(self.offsets[-1] - self.prompt_lens.sum())

    def sequence(self, b: int) -> tuple[int, int]:
        return int(self.offsets[b]), int(self.offsets[b + 1])


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines a distillation set (its cache key)."""

    target_id: str
    seed: int
    num_tokens: int
    max_new_tokens: int
    held_out: bool = False
    batch: int = 64  # prompts generated together

    def key(self) -> str:
        text = json.dumps(
            [
                FORMAT_VERSION,
                self.target_id,
                self.seed,
                self.num_tokens,
                self.max_new_tokens,
                self.held_out,
                self.batch,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def target_id(loaded: LoadedModel) -> str:
    return f"{Path(loaded.source.path).name}:{loaded.source.weight_type}"


def encode_prompt(loaded: LoadedModel, prompt: Prompt) -> list[int]:
    tokenizer = loaded.tokenizer
    if prompt.chat:
        text = tokenizer.apply_chat_template([ChatMessage("user", prompt.text)])
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(prompt.text)
    return ids[-MAX_PROMPT_TOKENS:]


def prompt_stream(loaded: LoadedModel, seed: int, held_out: bool, batch: int):
    """Encoded prompts, `batch` at a time, forever: chunk c is build_prompts(batch, seed * 7919 + c)."""
    chunk = 0
    while True:
        prompts = build_prompts(batch, seed * 7919 + chunk, held_out=held_out)
        yield [encode_prompt(loaded, p) for p in prompts]
        chunk += 1


@torch.no_grad()
def generate_with_features(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    capture: Sequence[int],
) -> list[tuple[list[int], int, dict[str, torch.Tensor]]]:
    """Greedy continuations of `prompts` in one batch, each stopped at an eos token or after
    max_new_tokens, with the features of every position: (tokens, prompt length, features)."""
    model = loaded.model
    eos = set(loaded.tokenizer.eos_token_ids)
    num = len(prompts)
    max_len = max(map(len, prompts)) + max_new_tokens
    dense = DenseTarget(model, num, max_len)
    tokens = [list(p) for p in prompts]
    fed = [0] * num
    rows: list[dict[str, list[torch.Tensor]]] = [{} for _ in range(num)]
    while live := [b for b in range(num) if fed[b] < len(tokens[b])]:
        new = {b: tokens[b][fed[b] :] for b in live}
        ids = torch.tensor([t for b in live for t in new[b]], dtype=torch.long)
        positions = torch.tensor([fed[b] + i for b in live for i in range(len(new[b]))], dtype=torch.long)
        seq_ids = torch.tensor([b for b in live for _ in new[b]], dtype=torch.long)
        final, aux = dense.forward(ids, positions, seq_ids, tuple(capture))
        named = {FINAL: final, **{layer_key(i): h for i, h in aux.items()}}
        ends = torch.cumsum(torch.tensor([len(new[b]) for b in live]), 0)
        next_ids = model.compute_logits(final[ends - 1]).argmax(-1).tolist()
        for j, b in enumerate(live):
            begin = int(ends[j]) - len(new[b])
            for name, h in named.items():
                rows[b].setdefault(name, []).append(h[begin : int(ends[j])].to(torch.float16))
            fed[b] = len(tokens[b])
            generated = len(tokens[b]) - len(prompts[b])
            if generated < max_new_tokens and not (generated and tokens[b][-1] in eos):
                tokens[b].append(next_ids[j])
    return [
        (tokens[b], len(prompts[b]), {n: torch.cat(parts) for n, parts in rows[b].items()})
        for b in range(num)
    ]


def build_distill_set(
    loaded: LoadedModel,
    spec: DataSpec,
    capture: Sequence[int],
    *,
    log: Callable[[str], None] = print,
) -> DistillSet:
    """Generate until the set holds spec.num_tokens positions (prompt and completion)."""
    stream = prompt_stream(loaded, spec.seed, spec.held_out, spec.batch)
    sequences: list[tuple[list[int], int, dict[str, torch.Tensor]]] = []
    total = generated = 0
    start = time.monotonic()
    while total < spec.num_tokens:
        for seq in generate_with_features(loaded, next(stream), spec.max_new_tokens, capture):
            sequences.append(seq)
            total += len(seq[0])
            generated += len(seq[0]) - seq[1]
        elapsed = time.monotonic() - start
        log(
            f"data: {len(sequences)} sequences, {total} positions ({generated} generated), "
            f"{elapsed:.0f}s, {generated / max(elapsed, 1e-9):.1f} generated tok/s"
        )
    lengths = torch.tensor([len(s[0]) for s in sequences])
    return DistillSet(
        tokens=torch.tensor([t for s in sequences for t in s[0]], dtype=torch.long),
        offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        prompt_lens=torch.tensor([s[1] for s in sequences], dtype=torch.long),
        features={n: torch.cat([s[2][n] for s in sequences]) for n in sequences[0][2]},
    )


def save_distill_set(data: DistillSet, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "tokens": data.tokens,
            "offsets": data.offsets,
            "prompt_lens": data.prompt_lens,
            **{f"feature.{n}": t.contiguous() for n, t in data.features.items()},
        },
        str(folder / "data.tmp"),
    )
    (folder / "data.tmp").rename(folder / "data.safetensors")


def load_distill_set(folder: Path) -> DistillSet | None:
    path = folder / "data.safetensors"
    if not path.is_file():
        return None
    raw = load_file(str(path))
    features = {n.removeprefix("feature."): t for n, t in raw.items() if n.startswith("feature.")}
    return DistillSet(raw["tokens"], raw["offsets"], raw["prompt_lens"], features)


def distill_set(
    loaded: LoadedModel,
    spec: DataSpec,
    needed: Sequence[str],
    capture: Sequence[int],
    *,
    cache_root: Path = CACHE_ROOT,
    log: Callable[[str], None] = print,
) -> DistillSet:
    """The cached set for `spec` if it holds every feature in `needed`, else a fresh one capturing
    `capture` (a superset of the layers `needed` names), which replaces the cache."""
    folder = cache_root / f"{Path(spec.target_id.split(':')[0]).stem}-{spec.key()}"
    cached = load_distill_set(folder)
    if cached is not None and all(n in cached.features for n in needed):
        log(f"data: cached {folder} ({cached.num_sequences} sequences, {len(cached.tokens)} positions)")
        return cached
    data = build_distill_set(loaded, spec, capture, log=log)
    save_distill_set(data, folder)
    log(f"data: saved {folder}")
    return data
