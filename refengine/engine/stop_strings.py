"""Stop strings need text, and text needs the tokenizer: the scheduler asks this checker after every
token it appends to a request that has stop strings."""

from collections.abc import Sequence

from refengine.request import Request
from refengine.tokenizer.detokenizer import IncrementalDetokenizer
from refengine.tokenizer.tokenizer import Tokenizer


def find_stop_string(text: str, num_new_chars: int, stops: Sequence[str]) -> tuple[str, int] | None:
    """The stop string whose match ends in the last `num_new_chars` characters of `text` and starts
    earliest, with that start; None if there is none. Each string gets its own reach back into the old
    text: a shorter string lying wholly in the old text ended at an earlier token, which was either
    checked already or below min_tokens."""
    best: tuple[str, int] | None = None
    for stop in stops:
        start = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if start >= 0 and (best is None or start < best[1]):
            best = (stop, start)
    return best


class StopStringChecker:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._state: dict[str, tuple[IncrementalDetokenizer, list[str], int]] = {}

    def __call__(self, request: Request) -> str | None:
        detok, pieces, seen = self._state.get(request.request_id) or (IncrementalDetokenizer(self._tokenizer), [], 0)
        outputs = request.output_token_ids
        if len(outputs) <= seen:
            # Called once per appended token, and a preempted request resumes with its outputs intact,
            # so the list grows between calls.
            raise RuntimeError(f"request {request.request_id!r}: output went from {seen} to {len(outputs)} tokens")
        # Tokens appended while below min_tokens were not checked; only the last one is new here.
        pieces.append(detok.push(outputs[seen:-1]))
        new_text = detok.push(outputs[-1:])
        pieces.append(new_text)
        self._state[request.request_id] = (detok, pieces, len(outputs))
        match = find_stop_string("".join(pieces), len(new_text), request.sampling_params.stop)
        return None if match is None else match[0]

    def forget(self, req_id: str) -> None:
        self._state.pop(req_id, None)
