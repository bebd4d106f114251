"""Stop strings need text, and text needs the tokenizer: the scheduler asks this checker after every
token it appends to a request that has stop strings."""

from refengine.request import Request
from refengine.tokenizer.detokenizer import IncrementalDetokenizer
from refengine.tokenizer.tokenizer import Tokenizer


class StopStringChecker:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._state: dict[str, tuple[IncrementalDetokenizer, list[str], int]] = {}

    def __call__(self, request: Request) -> str | None:
        detok, pieces, seen = self._state.get(request.request_id) or (IncrementalDetokenizer(self._tokenizer), [], 0)
        outputs = request.output_token_ids
        if len(outputs) < seen:
            # A preempted request resumes with its outputs intact, so the list only ever grows.
            raise RuntimeError(f"request {request.request_id!r}: output shrank from {seen} to {len(outputs)} tokens")
        new_text = detok.push(outputs[seen:])
        pieces.append(new_text)
        self._state[request.request_id] = (detok, pieces, len(outputs))
        text = "".join(pieces)
        longest = max(len(s) for s in request.sampling_params.stop)
        # Only a match that ends in the new text is new.
        window = text[-(len(new_text) + longest - 1) :] if new_text else ""
        for stop in request.sampling_params.stop:
            if stop in window:
                return stop
        return None

    def forget(self, req_id: str) -> None:
        self._state.pop(req_id, None)
