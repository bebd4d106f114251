"""Turns EngineCoreOutputs into per-request text deltas: incremental detokenization and the stop-string
cut (the scheduler already trimmed the tokens after the stopping one)."""

from collections.abc import Sequence
from dataclasses import dataclass

from refengine.core.outputs import EngineCoreOutputs
from refengine.engine.outputs import RequestDelta
from refengine.engine.stop_strings import find_stop_string
from refengine.tokenizer.detokenizer import IncrementalDetokenizer
from refengine.tokenizer.tokenizer import Tokenizer


@dataclass(slots=True)
class _Tracked:
    detokenizer: IncrementalDetokenizer
    num_prompt_tokens: int
    # A stop string may still be forming at the end of the text: hold back that many characters, so
    # no part of it is ever streamed.
    holdback: int
    num_output_tokens: int = 0
    text: str = ""
    num_emitted_chars: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._tracked: dict[str, _Tracked] = {}

    def add_request(self, request_id: str, num_prompt_tokens: int, stop: Sequence[str] = ()) -> None:
        holdback = max((len(s) for s in stop), default=1) - 1
        self._tracked[request_id] = _Tracked(IncrementalDetokenizer(self._tokenizer), num_prompt_tokens, holdback)

    def abort(self, request_id: str) -> None:
        self._tracked.pop(request_id, None)

    def process(self, outputs: EngineCoreOutputs) -> list[tuple[str, RequestDelta]]:
        deltas = []
        for out in outputs.outputs:
            tracked = self._tracked.get(out.req_id)
            if tracked is None:
                continue
            finished = out.finish_reason is not None
            # The last token apart: a stop string's match ends in its text (see StopStringChecker).
            tracked.text += tracked.detokenizer.push(out.new_token_ids[:-1])
            last_text = tracked.detokenizer.push(out.new_token_ids[-1:])
            tracked.text += last_text
            tracked.num_output_tokens += len(out.new_token_ids)
            if finished:
                match = None
                if isinstance(out.stop_reason, str):
                    match = find_stop_string(tracked.text, len(last_text), (out.stop_reason,))
                if match is not None:
                    # vLLM's default: the stop string and anything after it are not part of the output.
                    tracked.text = tracked.text[: match[1]]
                else:
                    tracked.text += tracked.detokenizer.flush()
                end = len(tracked.text)
            else:
                end = max(tracked.num_emitted_chars, len(tracked.text) - tracked.holdback)
            text = tracked.text[tracked.num_emitted_chars : end]
            tracked.num_emitted_chars = end
            delta = RequestDelta(
                token_ids=list(out.new_token_ids),
                text=text,
                logprobs=None if out.logprobs is None else list(out.logprobs),
                finished=finished,
                finish_reason=None if out.finish_reason is None else out.finish_reason.value,
                num_prompt_tokens=tracked.num_prompt_tokens,
                num_output_tokens=tracked.num_output_tokens,
                num_cached_tokens=out.num_cached_tokens,
                spec_decoding_stats=out.spec_decoding_stats,
            )
            deltas.append((out.req_id, delta))
            if finished:
                del self._tracked[out.req_id]
        return deltas
