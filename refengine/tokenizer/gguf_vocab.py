"""A byte-level BPE tokenizer rebuilt from the vocabulary a GGUF file stores as metadata."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as Backend

from refengine.tokenizer.errors import TokenizerError
from refengine.tokenizer.pretokenize import WHOLE_WORD_FIRST, pre_tokenizer_for

# llama.cpp's token types.
CONTROL = 3
USER_DEFINED = 4


@dataclass(frozen=True, slots=True)
class GgufVocab:
    """The `tokenizer.*` keys of a GGUF file."""

    model: str
    pre: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None


def build_backend(vocab: GgufVocab) -> Backend:
    if vocab.model != "gpt2":
        raise TokenizerError(
            f"unsupported tokenizer.ggml.model {vocab.model!r}: only byte-level BPE ('gpt2') is supported"
        )
    if len(vocab.token_types) not in (0, len(vocab.tokens)):
        raise TokenizerError(f"{len(vocab.token_types)} token types for {len(vocab.tokens)} tokens")
    merges = []
    for merge in vocab.merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise TokenizerError(f"malformed merge {merge!r}")
        merges.append((left, right))
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(vocab.tokens)},
        merges=merges,
        ignore_merges=vocab.pre in WHOLE_WORD_FIRST,
    )
    backend = Backend(bpe)
    backend.pre_tokenizer = pre_tokenizer_for(vocab.pre)
    backend.decoder = decoders.ByteLevel()
    # Control tokens (`<|im_start|>`) and user-defined ones (`<think>`) are matched whole in text,
    # never cut into BPE pieces; only control tokens count as special when decoding.
    typed = list(zip(vocab.tokens, vocab.token_types, strict=False))
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token, kind in typed if kind == CONTROL]
    )
    backend.add_tokens(
        [AddedToken(token, special=False, normalized=False) for token, kind in typed if kind == USER_DEFINED]
    )
    return backend
