"""The offline API: LLM(model, **engine_args).generate(prompts, sampling_params)."""

import dataclasses
from collections.abc import Sequence

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import Engine, build_engine
from refengine.engine.output_processor import OutputProcessor
from refengine.engine.outputs import RequestOutput
from refengine.model.loader import LoadedModel
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.tokenizer.tokenizer import Tokenizer


def tokenize_bad_words(tokenizer: Tokenizer, params: SamplingParams) -> SamplingParams:
    """bad_words are strings; the sampler bans token sequences. As vLLM does, a word is banned both as
    written and with a leading space, since BPE tokenizes the two differently."""
    if not params.bad_words:
        return params
    sequences: list[list[int]] = []
    for word in params.bad_words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return dataclasses.replace(params, bad_words_token_ids=params.bad_words_token_ids + sequences)


class LLM:
    def __init__(self, model: str | LoadedModel = "smollm2", **kwargs) -> None:
        self.engine: Engine = build_engine(EngineArgs(model=model, **kwargs))
        self.tokenizer = self.engine.loaded.tokenizer
        self._num_requests = 0

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        batch_queue: bool | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion; outputs come back in prompt order. `batch_queue` picks the
        front: depth 2 (step_with_batch_queue) or depth 1 (step); by default depth 2 under async."""
        if sampling_params is None:
            sampling_params = SamplingParams(temperature=0.0)
        params_list = (
            [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        )
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        for params in params_list:
            if params.structured_outputs is not None:
                # A constraint that cannot compile fails here, before any request is added.
                self.engine.structured_output_manager.validate(params.structured_outputs)
        core = self.engine.core
        processor = OutputProcessor(self.tokenizer)
        results: dict[str, RequestOutput] = {}
        for prompt, params in zip(prompts, params_list, strict=True):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            req_id = str(self._num_requests)
            request = Request(
                req_id,
                ids,
                tokenize_bad_words(self.tokenizer, params),
                eos_token_id=self.tokenizer.eos_token_ids[0] if self.tokenizer.eos_token_ids else None,
                arrival_index=self._num_requests,
                engine_seed=self.engine.config.seed,
            )
            self._num_requests += 1
            core.add_request(request)
            processor.add_request(req_id, len(ids), params.stop)
            results[req_id] = RequestOutput(req_id, ids)
        if batch_queue is None:
            batch_queue = core.max_concurrent_batches > 1
        step = core.step_with_batch_queue if batch_queue else core.step
        while core.has_work():
            outputs = step()
            if outputs is None:
                continue
            for req_id, delta in processor.process(outputs):
                result = results[req_id]
                result.token_ids += delta.token_ids
                result.text += delta.text
                if delta.finished:
                    result.finish_reason = delta.finish_reason
                    self.engine.stop_checker.forget(req_id)
        # Only now: at depth 2 a request's next frame may still be running on the runner's thread when
        # it finishes. That frame's output is discarded, so its record goes too; it is the one whose
        # drafts start at or after the request's last position.
        recorder = self.engine.step_recorder
        for result in results.values():
            end = len(result.prompt_token_ids) + len(result.token_ids)
            records = [] if recorder is None else recorder.take_step_records(result.request_id)
            result.steps = [r for r in records if r.position < end]
        return list(results.values())
