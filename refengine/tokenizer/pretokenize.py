"""How text is split into words before BPE, for each `tokenizer.ggml.pre` value we support.

The patterns are the ones the vocabularies were trained with (as llama.cpp applies them); a
vocabulary split differently gives different ids, so an unknown value is an error, not a guess.
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

from refengine.tokenizer.errors import TokenizerError

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Vocabularies whose BPE looks a whole word up before merging (Llama 3's `ignore_merges`).
WHOLE_WORD_FIRST = frozenset({"llama-bpe", "llama3", "llama-v3"})


def pre_tokenizer_for(pre: str) -> pre_tokenizers.PreTokenizer:
    # GPT-2's own split is built into ByteLevel(use_regex=True).
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt2", "gpt-2"):
        return gpt2
    if pre == "smollm":
        # Every numeric character stands alone, then GPT-2's split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    pattern = {"llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "qwen2": _QWEN2}.get(pre)
    if pattern is None:
        raise TokenizerError(
            f"unsupported tokenizer.ggml.pre {pre!r} (supported: default, gpt2, smollm, llama-bpe, qwen2)"
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
