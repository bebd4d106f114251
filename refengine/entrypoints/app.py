"""The OpenAI-compatible HTTP app: `build_app(engine, config)` returns a FastAPI app serving `engine`.

The engine is anything with AsyncLLM's surface (engine_client.EngineClient), so tests pass a fake.
Every client mistake becomes a 4xx with an OpenAI error body; a 5xx means the engine failed.
"""

import asyncio
import contextlib
import dataclasses
import hmac
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from refengine.entrypoints import sse
from refengine.entrypoints.admission import AdmissionGate, Ticket
from refengine.entrypoints.builders import ChatBuilder, CompletionBuilder, ResponseBuilder
from refengine.entrypoints.engine_client import (
    EngineClient,
    EngineDeadError,
    RequestDelta,
    RequestFailedError,
)
from refengine.entrypoints.errors import APIError, engine_dead, from_validation_error
from refengine.entrypoints.metrics import CONTENT_TYPE, RequestTimer, ServerMetrics
from refengine.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestModel,
    SamplingRequest,
    lone_surrogate,
)
from refengine.entrypoints.responses import ModelCard, ModelList
from refengine.entrypoints.serving import PreparedRequest, chat_logprobs_wanted, new_request_id, prepare

M = TypeVar("M", bound=RequestModel)

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# Requests that may queue behind the running batch before new ones get 429 (README, "Overload").
DEFAULT_MAX_WAITING_REQUESTS = 256

# Status for a request whose client left before the answer; nobody receives it (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS  # None: no bound
    request_timeout: float | None = None  # seconds; None: requests run until they finish


class OpenAIServer:
    def __init__(self, engine: EngineClient, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.gate = AdmissionGate(
            max_num_seqs=engine.engine_info.max_num_seqs,
            max_waiting_requests=config.max_waiting_requests,
            request_timeout=config.request_timeout,
        )
        self.metrics = ServerMetrics(engine, config.served_model_name, self.gate)
        self.created = int(time.time())

    # ---- request edge: auth, body, parsing ---------------------------------------------------------

    def check_auth(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken must not reveal how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.config.api_key.encode()
        ):
            raise APIError(
                401, "missing or incorrect API key (send Authorization: Bearer <key>)", code="invalid_api_key"
            )

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_request_bytes
        too_large = APIError(413, f"request body exceeds {limit} bytes", code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def parse(self, raw: bytes, model: type[M]) -> M:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise APIError(
                400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_utf8"
            ) from None
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            error = from_validation_error(e)
        if error.code == "invalid_json" and (escape := lone_surrogate(raw)) is not None:
            raise APIError(
                400,
                f"the request body holds the escape {escape}, half of a UTF-16 surrogate pair without "
                "its other half; it is no Unicode character, so no text can hold it",
                code="invalid_unicode",
            )
        raise error

    def check_model(self, req: SamplingRequest) -> None:
        if req.model is not None and req.model != self.config.served_model_name:
            raise APIError(
                404, f"the model `{req.model}` does not exist", param="model", code="model_not_found"
            )

    def check_alive(self) -> None:
        reason = self.engine.dead_reason
        if reason is not None:
            raise engine_dead(reason)

    async def read_request(self, request: Request, model: type[M]) -> M:
        self.check_auth(request)
        req = self.parse(await self.read_body(request), model)
        self.check_model(req)
        self.check_alive()
        return req

    # ---- endpoints ---------------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        req = await self.read_request(request, CompletionRequest)
        if isinstance(req.prompt, str):
            prompt_ids = await asyncio.to_thread(self.engine.tokenizer.encode, req.prompt)
        else:
            prompt_ids = list(req.prompt)
        return await self._respond(request, req, "cmpl", prompt_ids, req.logprobs, CompletionBuilder)

    async def chat_completions(self, request: Request) -> Response:
        req = await self.read_request(request, ChatCompletionRequest)
        logprobs = chat_logprobs_wanted(req)
        prompt_ids = await asyncio.to_thread(self._tokenize_chat, req)
        return await self._respond(request, req, "chatcmpl", prompt_ids, logprobs, ChatBuilder)

    async def _respond(
        self, request: Request, req: SamplingRequest, prefix: str, prompt_ids: list[int], logprobs: int | None,
        builder_class: Callable[..., ResponseBuilder],
    ) -> Response:  # fmt: skip
        """A completion or chat request: prepared, its structured outputs checked, driven through its builder."""
        prepared = self._prepare(req, prefix, prompt_ids, logprobs)
        await self._check_structured_outputs(req, prepared)
        builder = builder_class(
            prepared.generation.request_id, self.config.served_model_name, self.engine.tokenizer, prepared.options
        )
        return await self.generate(request, prepared, builder, req.timeout)

    def _tokenize_chat(self, req: ChatCompletionRequest) -> list[int]:
        tokenizer = self.engine.tokenizer
        try:
            text = tokenizer.apply_chat_template(req.messages)
        except Exception as e:  # a template refuses a conversation (roles out of order...) any way it likes
            raise APIError(
                400, f"the chat template rejected the conversation: {e}", param="messages"
            ) from None
        # The rendered template already holds any BOS text; adding one again would change the prompt.
        return tokenizer.encode(text, add_special_tokens=False)

    def _prepare(
        self, req: SamplingRequest, prefix: str, prompt_ids: list[int], logprobs: int | None
    ) -> PreparedRequest:
        return prepare(
            req,
            new_request_id(prefix),
            prompt_ids,
            max_model_len=self.engine.max_model_len,
            vocab_size=self.engine.tokenizer.vocab_size,
            logprobs=logprobs,
        )

    async def _check_structured_outputs(self, req: SamplingRequest, prepared: PreparedRequest) -> None:
        """A schema, regex or grammar the backend cannot compile is the client's mistake: a 400 naming
        it, before anything is admitted (checked off the event loop)."""
        constraint = prepared.generation.sampling_params.structured_outputs
        if constraint is None:
            return
        try:
            await asyncio.to_thread(self.engine.validate_structured_outputs, constraint)
        except ValueError as e:
            param = "structured_outputs" if req.structured_outputs is not None else "response_format"
            raise APIError(400, str(e), param=param) from None

    # ---- driving the engine ------------------------------------------------------------------------

    def admit(self, timeout: float | None) -> Ticket:
        try:
            return self.gate.admit(timeout)
        except APIError as e:
            self.metrics.rejected(e.code)
            raise

    async def generate(
        self, request: Request, prepared: PreparedRequest, builder: ResponseBuilder, timeout: float | None
    ) -> Response:
        """Admits one request and drives it. Its ticket is released on every path: here, unless a
        stream response takes it over and releases it when the response is done."""
        ticket = self.admit(timeout)
        timing = self.metrics.timer()
        stream = self.engine.generate(prepared.generation)
        handed_over = False
        try:
            if not prepared.options.stream:
                async with ticket.limit():
                    deltas = await sse.until_disconnect(request.receive, self._collect(stream, timing))
                return JSONResponse(builder.response(deltas).model_dump())
            # Headers wait for the first output, so an engine that is dead or dies before producing
            # anything still gets a proper 500 instead of a 200 stream carrying an error.
            async with ticket.limit():
                first = await sse.until_disconnect(request.receive, anext(stream))
            handed_over = True
        except sse.ClientDisconnected:
            self.metrics.aborted("client_disconnect")
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except TimeoutError:
            self.metrics.aborted(ticket.cutoff_reason)
            raise ticket.cutoff_error(prepared.generation.request_id) from None
        except EngineDeadError as e:
            self.metrics.failed()
            raise engine_dead(e.reason) from None
        except RequestFailedError as e:
            self.metrics.failed()
            raise APIError(500, str(e), code="request_failed") from None
        except StopAsyncIteration:
            self.metrics.failed()
            raise APIError(500, "the engine ended the request without output", code="engine_error") from None
        finally:
            if not handed_over:
                ticket.release()
        events = self._events(stream, first, builder, timing, prepared, ticket)
        return sse.EventStreamResponse(events, on_close=ticket.release)

    async def _collect(
        self, stream: AsyncGenerator[RequestDelta, None], timing: RequestTimer
    ) -> list[RequestDelta]:
        deltas = []
        async with contextlib.aclosing(stream):
            async for delta in stream:
                timing.observe(delta)
                deltas.append(delta)
                if delta.finished:
                    return deltas
        raise APIError(500, "the engine ended the request without finishing it", code="engine_error")

    async def _events(
        self,
        stream: AsyncGenerator[RequestDelta, None],
        first: RequestDelta,
        builder: ResponseBuilder,
        timing: RequestTimer,
        prepared: PreparedRequest,
        ticket: Ticket,
    ) -> AsyncGenerator[bytes, None]:
        accounted = False  # the request's outcome is in the metrics; if not, the client left first
        try:
            async with contextlib.aclosing(stream):
                for chunk in builder.prelude(first.num_prompt_tokens):
                    yield sse.event(chunk)
                delta = first
                try:
                    while True:
                        timing.observe(delta)
                        accounted = delta.finished
                        chunk = builder.chunk(delta)
                        if chunk is not None:
                            yield sse.event(chunk)
                        if delta.finished:
                            break
                        async with ticket.limit():
                            delta = await anext(stream)
                except TimeoutError:
                    # Cut off mid-stream (its deadline or shutdown): the engine request is already
                    # aborted; the client gets finish_reason "abort", then the reason as an error event.
                    self.metrics.aborted(ticket.cutoff_reason)
                    accounted = True
                    delta = dataclasses.replace(
                        delta, token_ids=[], text="", logprobs=None, finished=True, finish_reason="abort"
                    )
                    yield sse.event(builder.chunk(delta))
                    if prepared.options.include_usage:
                        yield sse.event(builder.usage_chunk(delta))
                    yield sse.event(ticket.cutoff_error(prepared.generation.request_id).body())
                    yield sse.DONE
                    return
                except EngineDeadError as e:
                    # The 200 has been sent; the failure travels as an error event, as vLLM does.
                    self.metrics.failed()
                    accounted = True
                    yield sse.event(engine_dead(e.reason).body())
                    yield sse.DONE
                    return
                except StopAsyncIteration:
                    self.metrics.failed()
                    accounted = True
                    yield sse.event(
                        APIError(500, "the engine ended the stream early", code="engine_error").body()
                    )
                    yield sse.DONE
                    return
                if prepared.options.include_usage:
                    yield sse.event(builder.usage_chunk(delta))
                yield sse.DONE
        finally:
            if not accounted:
                self.metrics.aborted("client_disconnect")

    # ---- operations --------------------------------------------------------------------------------

    def health(self) -> Response:
        reason = self.engine.dead_reason
        if reason is not None:
            return APIError(503, f"engine is dead: {reason}", code="engine_dead").response()
        if self.gate.draining:
            return APIError(503, "shutting down", code="shutting_down").response()
        return JSONResponse({"status": "ok"})

    async def blocks_in_use_when_idle(self, timeout: float = 10.0) -> int:
        """After a drain: waits (up to `timeout`) for the engine to apply the aborts, then returns the
        KV blocks still in use. Invariant: once every request has ended, every block is back in the
        pool; a dead engine's pool is not looked at."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            stats = self.engine.stats()
            idle = stats.num_requests_running == stats.num_requests_waiting == 0
            if self.engine.dead_reason is not None or (idle and stats.num_free_blocks == stats.num_blocks):
                return 0
            if asyncio.get_running_loop().time() > deadline:
                return stats.num_blocks - stats.num_free_blocks
            await asyncio.sleep(0.05)

    def models(self, request: Request) -> Response:
        self.check_auth(request)
        card = ModelCard(
            id=self.config.served_model_name,
            created=self.created,
            root=self.engine.model_name,
            max_model_len=self.engine.max_model_len,
        )
        return JSONResponse(ModelList(data=[card]).model_dump())

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's POST /reset_prefix_cache: benchmark clients call it between repeats so that each starts
        cold. Refused with 409 while requests hold KV blocks (vLLM logs and skips the reset then)."""
        self.check_auth(request)
        self.check_alive()
        if not await self.engine.reset_prefix_cache():
            raise APIError(409, "requests are running: the prefix cache is reset only when the engine is idle",
                           code="engine_busy")
        return Response(status_code=200)

    def render_metrics(self) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


def build_app(engine: EngineClient, config: ServerConfig) -> FastAPI:
    server = OpenAIServer(engine, config)
    # No generated docs: every route is one of the OpenAI ones below, and nothing else answers 200.
    app = FastAPI(title="refengine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.openai_server = server  # the HTTP server drains it on shutdown

    app.add_api_route("/health", server.health, methods=["GET"])
    app.add_api_route("/metrics", server.render_metrics, methods=["GET"])
    app.add_api_route("/reset_prefix_cache", server.reset_prefix_cache, methods=["POST"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", server.chat_completions, methods=["POST"])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return exc.response(headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed for {request.url.path}"
        elif exc.status_code == 404:
            message = f"no route for {request.method} {request.url.path}"
        else:
            message = str(exc.detail)
        return APIError(exc.status_code, message).response(exc.headers)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response is sent, so the server logs the traceback once.
        return APIError(
            500, f"internal server error: {type(exc).__name__}: {exc}", code="internal_error"
        ).response()

    return app
