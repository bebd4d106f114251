"""A deterministic corpus of awkward strings for tokenizer comparisons."""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable

WORDS = ["hello", "world", "The", "quick", "brown", "fox", "isn't", "they'll", "we've", "I'm", "DON'T", "x"]
UNICODE = [
    "café",
    "naïve",
    "Straße",
    "λόγος",
    "привет",
    "你好世界",
    "こんにちは",
    "안녕하세요",
    "مرحبا",
    "שלום",
    "नमस्ते",
    "สวัสดี",
    "😀",
    "👍🏽",
    "👨‍👩‍👧",
    "e\u0301",
    "∑∫√∞",
    "ｆｕｌｌ",
    "🇫🇷",
    "\u200b",
    "Ω≈ç",
    "ß",
]
NUMBERS = [
    "0",
    "42",
    "3.14159",
    "1,000,000",
    "２０２４",
    "①",
    "½",
    "x²",
    "007",
    "12345678901234",
    "-1e-9",
    "٣",
]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "   \t  ", "\n    ", ""]
PUNCT = ["'s", "'ll", "n't", "...", "!!!", "?!", "--", "—", "“quoted”", "(", ")", "{}", "#", "@@", "'"]
CODE = [
    "def f(x):\n    return x**2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "SELECT * FROM t WHERE id = 1;",
    '<div class="a">&nbsp;</div>',
    "#include <stdio.h>",
    "const x = () => { return `${a}`; };",
    "    if err != nil {\n        return err\n    }",
    "λx.x",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
POOLS = [WORDS, UNICODE, NUMBERS, PUNCT, CODE, SPECIALS]


def random_strings(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choices(POOLS, weights=[4, 3, 2, 2, 1, 0.3])[0]
            pieces.append(rng.choice(pool))
            pieces.append(rng.choice(SPACES))
        out.append("".join(pieces))
    return out


def has_numeric(text: str) -> bool:
    return any(unicodedata.category(char).startswith("N") for char in text)


def numeric_free_strings(count: int, seed: int = 2) -> list[str]:
    """`count` corpus strings without any numeric character (Unicode category N*)."""
    out: list[str] = []
    batch = seed
    while len(out) < count:
        out += [text for text in random_strings(count, batch) if not has_numeric(text)]
        batch += 1000
    return out[:count]


def chat_strings(
    count: int, render: Callable[[list[tuple[str, str]], bool], str], seed: int = 1
) -> list[str]:
    """Conversations rendered through a chat template; `render(turns, add_generation_prompt)`."""
    rng = random.Random(seed)
    texts = random_strings(3 * count, seed)
    out = []
    for i in range(count):
        turns = [("user", texts[3 * i]), ("assistant", texts[3 * i + 1])]
        if rng.random() < 0.5:
            turns.insert(0, ("system", texts[3 * i + 2]))
        out.append(render(turns, rng.random() < 0.5))
    return out
