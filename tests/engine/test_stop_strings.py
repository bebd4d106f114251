"""Stop strings through the real scheduler, StopStringChecker and OutputProcessor, with tokens chosen
exactly: the tiny model's byte tokenizer makes every ASCII character one token, so a row of tokens is a
piece of text. The text is cut at the earliest stop-string match that ends in a token past min_tokens,
whichever of several stop strings of different lengths it is, and nothing of it is emitted."""

import pytest

from refengine.engine.output_processor import OutputProcessor
from refengine.engine.stop_strings import StopStringChecker
from refengine.model.tiny import CHATML_TEMPLATE, SPECIAL_TOKENS
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.tokenizer import Tokenizer
from tests.core.harness import make_scheduler, runner_output

TOKENIZER = Tokenizer.byte_level(320, SPECIAL_TOKENS, "<|im_end|>", CHATML_TEMPLATE)
K = 3


def generate(text: str, stop: list[str], min_tokens: int = 0) -> tuple[str, str | None, int]:
    """Emits `text` one character per token, up to 1 + K tokens per step (accepted drafts), and
    returns the streamed text, the stop reason and the number of tokens kept."""
    checker = StopStringChecker(TOKENIZER)
    scheduler = make_scheduler(k=K, stop_checker=checker)
    params = SamplingParams(temperature=0.0, max_tokens=len(text), min_tokens=min_tokens, stop=stop)
    scheduler.add_request(Request("a", [ord(c) for c in "Hi: "], params, eos_token_id=None))
    processor = OutputProcessor(TOKENIZER)
    processor.add_request("a", 4, stop)
    tokens = [ord(c) for c in text]
    streamed, num_tokens, pos = "", 0, 0
    while scheduler.has_requests():
        so = scheduler.schedule()
        width = len(so.scheduled_spec_decode_tokens.get("a", [])) + 1
        row, pos = tokens[pos : pos + width], pos + width
        out = scheduler.update_from_output(so, runner_output(so, {"a": row}))
        for _, delta in processor.process(out):
            streamed += delta.text
            num_tokens += len(delta.token_ids)
            if delta.finished:
                return streamed, out.outputs[0].stop_reason, num_tokens
        scheduler.update_draft_token_ids({"a": tokens[pos : pos + K]})
    raise AssertionError("the request never finished")


@pytest.mark.parametrize(
    ("text", "stop", "min_tokens", "expected"),
    [
        # The longer stop string spans tokens and ends first; the shorter one comes later.
        ("one wxyz then b", ["b", "wxyz"], 0, ("one ", "wxyz", 8)),
        # Both end in the same token: the cut is at the earliest start, whatever the list order.
        ("one xyz then", ["yz", "xyz"], 0, ("one ", "xyz", 7)),
        ("one xyz then", ["xyz", "yz"], 0, ("one ", "xyz", 7)),
        # "ab" ends in token 3, below min_tokens=4: no stop there, even though it is still within the
        # longest stop string's reach when token 4 is checked; "ab" again later stops it.
        ("qab-cd-ab!", ["ab", "wxyz"], 4, ("qab-cd-", "ab", 9)),
        ("qab-cd-ab!", ["ab"], 4, ("qab-cd-", "ab", 9)),
        ("qab-cdef", ["wxyz", "ab"], 4, ("qab-cdef", None, 8)),
        # The first token past min_tokens completes the match: it counts.
        ("qab-cd", ["ab"], 3, ("q", "ab", 3)),
    ],
)
def test_several_stop_strings_cut_at_the_earliest_match(text, stop, min_tokens, expected):
    streamed, stop_reason, num_tokens = generate(text, stop, min_tokens)
    assert (streamed, stop_reason, num_tokens) == expected
