"""Pre-tokenizer choice by `tokenizer.ggml.pre`, and rejection of what we do not support."""

import pytest

from refengine.tokenizer import GgufVocab, Tokenizer, TokenizerError
from refengine.tokenizer.pretokenize import pre_tokenizer_for


def _words(pre: str, text: str) -> list[str]:
    return [word for word, _ in pre_tokenizer_for(pre).pre_tokenize_str(text)]


def test_digit_grouping_follows_each_vocabulary() -> None:
    assert _words("gpt2", "x 12345") == ["x", "Ġ12345"]
    assert _words("smollm", "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]
    assert _words("llama-bpe", "x 12345") == ["x", "Ġ", "123", "45"]
    assert _words("qwen2", "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]


def test_llama3_split_keeps_case_insensitive_contractions_and_newlines() -> None:
    assert _words("llama-bpe", "DON'T stop\n\nnow") == ["DON", "'T", "Ġstop", "ĊĊ", "now"]


def test_unknown_pre_and_non_bpe_vocabularies_are_rejected() -> None:
    with pytest.raises(TokenizerError, match="unsupported tokenizer.ggml.pre 'mystery'"):
        pre_tokenizer_for("mystery")
    vocab = GgufVocab("llama", "default", ("a",), (1,), (), None, (), False, None)
    with pytest.raises(TokenizerError, match="only byte-level BPE"):
        Tokenizer.from_gguf_vocab(vocab)
