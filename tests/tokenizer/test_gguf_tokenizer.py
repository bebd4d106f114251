"""SmolLM2's tokenizer rebuilt from GGUF metadata agrees with transformers' GGUF-built tokenizer.

One known difference: the file says `tokenizer.ggml.pre = smollm`, which llama.cpp (and SmolLM2's
published tokenizer.json) implement as "every numeric character alone, then GPT-2's split".
transformers' GGUF path ignores that value and uses GPT-2's split alone, so after whitespace the two
group digits differently ("  12": ours "  ", "1", "2"; theirs " ", " 1", "2"). We follow the
model's own rule, compare numeric-free text against transformers as it is, and all text against
transformers with the published pre-tokenizer put back.
"""

import pytest
from text_corpus import chat_strings, has_numeric, numeric_free_strings, random_strings
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from refengine.model import LoadedModel, embedded_smollm2_path
from refengine.tokenizer import ChatMessage, Tokenizer

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    gguf_path = embedded_smollm2_path()
    folder = tmp_path_factory.mktemp("smollm2")
    (folder / gguf_path.name).symlink_to(gguf_path)
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_path.name)


def _corpus(tokenizer: Tokenizer) -> list[str]:
    def render(turns: list[tuple[str, str]], add_generation_prompt: bool) -> str:
        messages = [ChatMessage(role, content) for role, content in turns]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    return random_strings(1100) + chat_strings(100, render)


def _assert_same_ids(tokenizer: Tokenizer, reference, corpus: list[str]) -> None:
    expected = reference(corpus)["input_ids"]
    mismatches = [text for text, ids in zip(corpus, expected, strict=True) if tokenizer.encode(text) != ids]
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} differ, first: {mismatches[0]!r}"


def test_ids_match_transformers_on_1000_numeric_free_strings(smollm2: LoadedModel, hf_tokenizer) -> None:
    corpus = numeric_free_strings(1000) + [t for t in _corpus(smollm2.tokenizer)[-100:] if not has_numeric(t)]
    assert len(corpus) >= 1000
    _assert_same_ids(smollm2.tokenizer, hf_tokenizer, corpus)


def test_ids_match_transformers_with_smollm2_published_pretokenizer(
    smollm2: LoadedModel, hf_tokenizer
) -> None:
    corpus = _corpus(smollm2.tokenizer)
    assert sum(has_numeric(text) for text in corpus) > 500
    original = hf_tokenizer.backend_tokenizer.pre_tokenizer
    hf_tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    try:
        _assert_same_ids(smollm2.tokenizer, hf_tokenizer, corpus)
    finally:
        hf_tokenizer.backend_tokenizer.pre_tokenizer = original


def test_digits_stand_alone_after_whitespace(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    assert [tokenizer.decode([i]) for i in tokenizer.encode("  12")] == ["  ", "1", "2"]


def test_decode_round_trips(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    for text in _corpus(tokenizer):
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_ids_and_flags_come_from_metadata(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids == (2,) and not tokenizer.add_bos
    assert tokenizer.encode("<|im_start|>user") == [1, 4093]
    assert tokenizer.is_special(2) and not tokenizer.is_special(4093)
    assert tokenizer.decode([1, 4093, 2], skip_special_tokens=True) == "user"


def test_chat_template_renders_like_transformers(smollm2: LoadedModel, hf_tokenizer) -> None:
    conversations = [
        [ChatMessage("user", "Hi there")],
        [ChatMessage("system", "Be terse."), ChatMessage("user", "2+2?"), ChatMessage("assistant", "4")],
        [ChatMessage("user", "a"), ChatMessage("assistant", "b"), ChatMessage("user", "ünïcödé 😀")],
    ]
    for messages in conversations:
        for add_generation_prompt in (True, False):
            ours = smollm2.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt
            )
            theirs = hf_tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
            assert ours == theirs
