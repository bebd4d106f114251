"""A byte-level tokenizer over a whole vocabulary, for models with random weights: ids 0-255 are the
bytes, then the ChatML specials, and every further id decodes to a fixed three-byte filler."""

import functools

from tokenizers import pre_tokenizers

from refengine.tokenizer.byte_alphabet import CHAR_TO_BYTE
from refengine.tokenizer.tokenizer import Tokenizer

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def byte_level_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level, no merges, over exactly `vocab_size` ids (fillers as plain vocabulary entries, so
    building it takes milliseconds where thousands of added tokens would take seconds)."""
    alphabet = list(pre_tokenizers.ByteLevel.alphabet())
    alphabet.sort(key=lambda ch: CHAR_TO_BYTE.get(ch, 1 << 20))
    vocab = {ch: i for i, ch in enumerate(alphabet[:256])}
    for special in _SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    filler = (a + b + c for a in alphabet for b in alphabet for c in alphabet)
    while len(vocab) < vocab_size:
        vocab.setdefault(next(filler), len(vocab))
    return Tokenizer.from_byte_vocab(vocab, _SPECIAL_TOKENS, "<|im_end|>", _CHATML)
