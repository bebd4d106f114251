"""AsyncLLM: the engine behind an asyncio front end (the HTTP server).

The engine loop runs on its own thread, so a forward pass never blocks the event loop; requests and
aborts reach it through a command queue drained before every step. A request that fails alone gets a
RequestFailedError; a loop that raises makes the engine dead (EngineDeadError for every stream and every
later call) while the process stays up. Design: docs/design/architecture.md (the server).
"""

import asyncio
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import Engine, build_engine
from refengine.engine.llm import tokenize_bad_words
from refengine.engine.output_processor import OutputProcessor
from refengine.engine.outputs import (
    EngineDeadError,
    EngineInfo,
    EngineStats,
    GenerationRequest,
    RequestDelta,
    RequestFailedError,
)
from refengine.request import Request
from refengine.sampling_params import StructuredOutputsParams

logger = logging.getLogger("refengine")


@dataclass(frozen=True, slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue[RequestDelta | EngineDeadError | RequestFailedError]"

    def put(self, item: "RequestDelta | EngineDeadError | RequestFailedError") -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True, slots=True)
class _Add:
    request: GenerationRequest
    stream: _Stream


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _ResetPrefixCache:
    loop: asyncio.AbstractEventLoop
    done: "asyncio.Future[bool]"


class AsyncLLM:
    def __init__(self, args: EngineArgs, *, served_model_name: str | None = None) -> None:
        self.engine: Engine = build_engine(args)
        engine = self.engine
        self.tokenizer = engine.loaded.tokenizer
        self.model_name = served_model_name or (args.model if isinstance(args.model, str) else engine.loaded.source.path)
        self.max_model_len = engine.config.max_model_len
        spec = args.speculative_config
        self.engine_info = EngineInfo(
            numerics=str(engine.loaded.model.numerics),
            dtype=args.dtype,
            weight_format=engine.loaded.source.weight_type,
            spec_method=None if spec is None else spec.method,
            num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
            async_scheduling=engine.async_resolution.enabled,
            async_scheduling_source=engine.async_resolution.source,
            max_num_seqs=engine.config.max_num_seqs,
            block_size=engine.config.block_size,
            num_blocks=engine.config.num_blocks,
            device=str(engine.runner.device),
            enable_prefix_caching=engine.config.enable_prefix_caching,
        )
        drafter = engine.runner.drafter
        self._drafter_random_init = drafter is not None and drafter.random_init
        self._processor = OutputProcessor(self.tokenizer)
        self._commands: queue.SimpleQueue[_Add | _Abort | _ResetPrefixCache | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._num_requests = 0
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._dead_reason: str | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="refengine-engine", daemon=True)
        self._thread.start()

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[RequestDelta, None]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._commands.put(_Add(request, stream))
        if self._dead_reason is not None:
            # The loop died between the check above and the put: nobody will answer the command.
            raise EngineDeadError(self._dead_reason)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, EngineDeadError | RequestFailedError):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                # The consumer went away (client disconnect): free the request's KV blocks.
                self._commands.put(_Abort(request.request_id))

    async def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block, on the engine thread between steps; False while requests
        hold blocks (vLLM's rule: a reset never pulls blocks from under a running request)."""
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._commands.put(_ResetPrefixCache(loop, done))
        return await done

    def stats(self) -> EngineStats:
        scheduler = self.engine.core.scheduler
        spec = scheduler.spec_decoding_stats
        kv = scheduler.kv_cache_manager
        return EngineStats(
            num_requests_running=len(scheduler.running),
            num_requests_waiting=len(scheduler.waiting),
            num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            num_preemptions=scheduler.num_preemptions,
            num_free_blocks=kv.num_free_blocks,
            num_blocks=self.engine.config.num_blocks,
            spec_num_drafts=spec.num_drafts,
            spec_num_draft_tokens=spec.num_draft_tokens,
            spec_num_accepted_tokens=spec.num_accepted_tokens,
            spec_num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos),
            drafter_random_init=self._drafter_random_init,
            num_grammar_cut_drafts=scheduler.num_grammar_cut_drafts,
            prefix_cache_queries=kv.prefix_cache_stats.queries,
            prefix_cache_hits=kv.prefix_cache_stats.hits,
            num_prefix_cache_evictions=kv.block_pool.num_evictions,
        )

    def validate_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Raises ValueError naming why `params` cannot be compiled, or that the backend is missing."""
        self.engine.structured_output_manager.validate(params)

    def shutdown(self) -> None:
        self._stopping = True
        self._commands.put(None)
        self._thread.join(timeout=30)
        self.engine.core.shutdown()

    # ---- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        core = self.engine.core
        step = core.step_with_batch_queue if core.max_concurrent_batches > 1 else core.step
        try:
            while not self._stopping:
                # Block only when there is nothing to step.
                self._apply(self._commands.get() if not core.has_work() else None)
                while not self._commands.empty():
                    self._apply(self._commands.get_nowait())
                if self._stopping or not core.has_work():
                    continue
                outputs = step()
                if outputs is not None:
                    self._publish(outputs)
        except EngineDeadError as err:  # the loop found the engine dead (a tensor-parallel rank exited)
            self._die(err.reason)
        except Exception as err:  # noqa: BLE001 - any failure of the loop kills the engine, by design
            self._die(f"{type(err).__name__}: {err}")

    def _apply(self, command: "_Add | _Abort | _ResetPrefixCache | None") -> None:
        if isinstance(command, _Add):
            try:
                self._add(command)
            except Exception as err:  # noqa: BLE001 - whatever one request raises, it fails alone
                # Invariant: request-level fault isolation. An error while adding a request ends that
                # request only; the loop, and every other request, carry on.
                self._reject(command, f"{type(err).__name__}: {err}")
        elif isinstance(command, _Abort):
            if self._streams.pop(command.request_id, None) is not None:
                self.engine.core.abort_requests([command.request_id])
                self._processor.abort(command.request_id)
                self.engine.stop_checker.forget(command.request_id)
        elif isinstance(command, _ResetPrefixCache):
            reset = self.engine.core.scheduler.kv_cache_manager.block_pool.reset_prefix_cache()
            command.loop.call_soon_threadsafe(command.done.set_result, reset)

    def _add(self, command: _Add) -> None:
        req = command.request
        tokenizer = self.tokenizer
        params = dataclasses.replace(req.sampling_params, logprobs=req.logprobs)
        request = Request(
            req.request_id,
            req.prompt_token_ids,
            tokenize_bad_words(tokenizer, params),
            eos_token_id=tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None,
            arrival_index=self._num_requests,
            engine_seed=self.engine.config.seed,
        )
        self._num_requests += 1
        self.engine.core.add_request(request)
        self._processor.add_request(req.request_id, len(req.prompt_token_ids), req.sampling_params.stop)
        self._streams[req.request_id] = command.stream
        self._num_prompt_tokens += len(req.prompt_token_ids)

    def _reject(self, command: _Add, reason: str) -> None:
        """Undoes whatever part of `_add` happened, then tells the request's caller why it failed."""
        req_id = command.request.request_id
        logger.warning("request %s failed and was dropped: %s", req_id, reason)
        self.engine.core.abort_requests([req_id])
        self._processor.abort(req_id)
        self.engine.stop_checker.forget(req_id)
        self._streams.pop(req_id, None)
        command.stream.put(RequestFailedError(req_id, reason))

    def _publish(self, outputs) -> None:
        for req_id, delta in self._processor.process(outputs):
            self._num_generation_tokens += len(delta.token_ids)
            stream = self._streams.get(req_id)
            if stream is None:
                continue
            stream.put(delta)
            if delta.finished:
                del self._streams[req_id]
                self.engine.stop_checker.forget(req_id)

    def _die(self, reason: str) -> None:
        self._dead_reason = reason
        logger.error("engine is dead: %s", reason)
        error = EngineDeadError(reason)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        # Calls that raced with the failure are still in the command queue: answer them too.
        while not self._commands.empty():
            command = self._commands.get_nowait()
            if isinstance(command, _Add):
                command.stream.put(error)
            elif isinstance(command, _ResetPrefixCache):
                command.loop.call_soon_threadsafe(command.done.set_exception, error)
