"""Seeded, tokenizer-free prompts: random words, sized to the requested input length.

Without a tokenizer the size comes from the server itself: two probe prompts of different word counts give
their `usage.prompt_tokens`, and a line through the two points (template overhead + tokens per word)
says how many words make `input_len` tokens. `--tokenizer` sizes each prompt's text exactly instead, to
`input_len` less the tokens the server adds around it (template, BOS), measured from one probe: either
way --input-len is the server's prompt_tokens.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ladder.config import SetupError

WORDS = tuple("""
able about above across act add after again against age ago agree air all almost alone along already also
always among amount animal answer any appear apple area arm around art ask attack away baby back bad ball
bank base bear beat beauty bed before begin behind believe best better between big bird black blood blue
board boat body bone book born both bottom box boy bread break bright bring brother brown build burn busy
buy call calm camp can capital car card care carry case cat catch cause cell center chair chance change
charge check child choose church circle city claim class clean clear climb clock close cloud coast coat
cold color come common cook cool copy corn corner cost count country course cover cow cross crowd cry
cup current cut dance dark day dead deal dear death decide deep degree desert design die differ dinner
direct doctor dog door double down draw dream dress drink drive drop dry duck during dust duty each
early earth east easy eat edge effect egg eight either else end enemy energy enough enter equal even
evening event ever every exact example except eye face fact fair fall family farm fast father fear feed
feel field fight figure fill final find fine finger fire first fish fit five floor flower fly follow food
foot force forest form forward four free fresh friend front fruit full game garden gas gather gentle
gift girl give glad glass gold good grass great green ground group grow guess guide hair half hall hand
happen happy hard hat head health hear heart heat heavy help here high hill history hold hole home hope
horse hot hour house huge human hundred hunt idea inch island iron join joy judge jump just keep key kind
king kitchen knee know lake land language large last late laugh lead learn leave left leg less letter
level lie life lift light like line lion list listen little live long look lot loud love low machine
main make man many map mark market match matter meal mean measure meat meet melody metal middle might
mile milk mind minute miss modern moment money month moon morning mother mountain mouth move music name
nation nature near neck need never new news next night noise north nose note notice number ocean offer
office often oil old open order other paper parent party pass path pay peace people period person pick
picture piece place plain plan plant play please poem point poor port possible pound power press pretty
print prove pull push quick quiet race rain raise reach read ready real reason record red region rest
rich ride right ring river road rock roll room root rope rose round row rule run safe sail salt same sand
save say school science sea season seat second see seed sell send sense sentence serve set settle shape
share sharp sheep shell shine ship shoe shop shore short shoulder show side sign silver simple sing
sister sit size skill skin sky sleep slow small smell smile snow soft soil soldier song soon sound south
space speak speed spend spring square stand star start state station stay steel step stick still stone
stop store story straight strange stream street strong student study subject sugar summer sun supply
sure surface sweet swim table tail take talk tall teach team teeth tell test thank thick thin thing
think third thought thousand three through throw tiny together tool top total touch town track trade
train travel tree trip true try turn twenty two under unit until use usual valley value very village
visit voice wait walk wall warm wash watch water wave way wear weather week weight west wheel white whole
wide wife wild wind window winter wire wish woman wonder wood word work world write yard year yellow young
""".split())

Sizer = Callable[[random.Random], str]


@dataclass(frozen=True)
class Calibration:
    """prompt_tokens ≈ overhead_tokens + tokens_per_word · words, fitted through two probe prompts."""

    overhead_tokens: float
    tokens_per_word: float
    probe_words: tuple[int, int]
    probe_tokens: tuple[int, int]

    def words_for(self, tokens: int) -> int:
        words = round((tokens - self.overhead_tokens) / self.tokens_per_word)
        if words < 1:
            raise SetupError(f"--input-len {tokens} is below the server's prompt overhead "
                             f"of {self.overhead_tokens:.0f} tokens")
        return words


def fit(probe_words: tuple[int, int], probe_tokens: tuple[int, int]) -> Calibration:
    (w1, w2), (p1, p2) = probe_words, probe_tokens
    slope = (p1 - p2) / (w1 - w2)
    if slope <= 0:
        raise SetupError(f"usage.prompt_tokens does not grow with the prompt ({w1} words -> {p1} tokens, "
                         f"{w2} words -> {p2} tokens); cannot size prompts, pass --tokenizer")
    return Calibration(overhead_tokens=p1 - slope * w1, tokens_per_word=slope,
                       probe_words=probe_words, probe_tokens=probe_tokens)


def words_text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choices(WORDS, k=num_words))


def calibrated_sizer(num_words: int) -> Sizer:
    return lambda rng: words_text(rng, num_words)


def load_tokenizer(path: Path):
    """A `tokenizers` Tokenizer from tokenizer.json or the folder holding it."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the tokenizers library raises its own untyped errors
        raise SetupError(f"cannot load tokenizer {file}: {e}") from e


def tokenizer_sizer(tokenizer, input_len: int) -> Sizer:
    """Each prompt gets the word count whose token count (text only) lands nearest to input_len."""

    def count(words: list[str]) -> int:
        return len(tokenizer.encode(" ".join(words), add_special_tokens=False).ids)

    def make(rng: random.Random) -> str:
        words = rng.choices(WORDS, k=input_len + 8)  # every word is at least one token
        lo, hi = 1, len(words)
        while lo < hi:  # smallest prefix with at least input_len tokens
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if count(words[:mid]) < input_len else (lo, mid)
        best = min((lo - 1, lo), key=lambda k: abs(count(words[:k]) - input_len) if k else input_len)
        return " ".join(words[:max(best, 1)])

    return make


def rung_prompts(seed: int, concurrency: int, phase: str, count: int, sizer: Sizer) -> list[str]:
    """The prompts of one phase of one rung, seeded per (seed, concurrency, phase): a rung's measured
    prompts depend neither on the other rungs nor on the warmup count."""
    rng = random.Random(f"ladder:{seed}:{concurrency}:{phase}")
    return [sizer(rng) for _ in range(count)]
