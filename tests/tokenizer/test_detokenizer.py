"""Incremental detokenization emits only complete UTF-8 and adds up to a full decode."""

import random

import pytest
from text_corpus import UNICODE

from refengine.model import LoadedModel, build_tiny_model
from refengine.tokenizer import IncrementalDetokenizer, Tokenizer


@pytest.fixture
def byte_tokenizer() -> Tokenizer:
    return build_tiny_model("llama").tokenizer


def _stream(tokenizer: Tokenizer, ids: list[int], **kwargs: bool) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, **kwargs)
    return [detokenizer.push([token_id]) for token_id in ids] + [detokenizer.flush()]


def test_multibyte_characters_are_held_until_complete(byte_tokenizer: Tokenizer) -> None:
    text = "a😀b€ß" + "".join(UNICODE)
    ids = byte_tokenizer.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte: every character is split
    pieces = _stream(byte_tokenizer, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert pieces[:4] == ["a", "", "", ""] and pieces[4] == "😀"


def test_unfinished_character_is_replaced_at_flush(byte_tokenizer: Tokenizer) -> None:
    ids = byte_tokenizer.encode("x€")[:-1]
    assert _stream(byte_tokenizer, ids) == ["x", "", "", "\ufffd"]  # two of the three bytes of €


def test_special_tokens_skipped_or_kept(byte_tokenizer: Tokenizer) -> None:
    ids = byte_tokenizer.encode("hi<|im_end|>")
    assert "".join(_stream(byte_tokenizer, ids)) == "hi"
    assert "".join(_stream(byte_tokenizer, ids, skip_special_tokens=False)) == "hi<|im_end|>"


@pytest.mark.model
def test_random_smollm2_ids_stream_to_the_full_decode(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            assert "".join(_stream(tokenizer, ids, skip_special_tokens=skip)) == tokenizer.decode(
                ids, skip_special_tokens=skip
            )


@pytest.mark.model
def test_smollm2_pieces_never_hold_partial_characters(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    text = " ".join(UNICODE) + " 你好，世界！🙂🙃"
    pieces = _stream(tokenizer, tokenizer.encode(text))
    assert "".join(pieces) == text and all("\ufffd" not in piece for piece in pieces)
