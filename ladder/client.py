"""The load generator: streams requests over one shared aiohttp session, c at a time per phase.

NOTE: aiohttp, not httpx: on the 2-core development machine httpx cost about twice the client CPU per SSE
event, even with a raw-bytes parser (reports/client-overhead.md has the numbers).
"""

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter

import aiohttp

from ladder import arrivals
from ladder.records import RequestRecord
from ladder.spec_metrics import read_spec
from ladder.sse import SSEParser


@dataclass(slots=True)
class Progress:
    """Shared by the requests of one phase; the watchdog reads it to spot a stalled engine."""

    last_activity: float  # last send, SSE data event or completion of any request
    in_flight: int = 0
    peak_in_flight: int = 0  # the most requests in flight at once: proof a rung reached its concurrency
    num_failed: int = 0
    # request bytes (prompt text, mostly) of the requests in flight still waiting for their first chunk:
    # a long prompt's prefill may keep every stream silent for long (ladder.runner scales the stall limit)
    waiting_bytes: int = 0


@dataclass(frozen=True)
class Target:
    session: aiohttp.ClientSession
    url: str  # the completions URL
    chat: bool


Messages = Sequence[tuple[str, str]]  # (role, content)


def request_body(prompt: str | Messages, *, model: str, chat: bool, max_tokens: int, temperature: float,
                 continuous_usage: bool, ignore_eos: bool = True, stream: bool = True,
                 extra: dict | None = None) -> bytes:
    """The JSON body, serialised once before any clock starts. A str prompt is one user message; the
    completions endpoint gets the messages' contents joined by newlines. `extra` (sampling fields,
    --extra-body) is merged in last, so it can override any field."""
    messages = [("user", prompt)] if isinstance(prompt, str) else list(prompt)
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
        if continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": role, "content": content} for role, content in messages]
    else:
        body["prompt"] = "\n".join(content for _, content in messages)
    body.update(extra or {})
    return json.dumps(body).encode()


# NOTE: raw_decode on the decoded text skips json.loads' encoding sniffing: a quarter of the per-event
# JSON cost, and JSON is the largest single item of client CPU per event.
_decode = json.JSONDecoder().raw_decode


def _carries_output(choice: dict, chat: bool) -> bool:
    if not chat:
        return bool(choice.get("text"))
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                or delta.get("tool_calls") or delta.get("function_call"))


def token_ids(choice: dict) -> list[int] | None:
    """The ids a chunk's choice carries: choices[].token_ids (return_token_ids), else logprob tokens spelled
    "token_id:N" (return_tokens_as_token_ids); None when it carries neither."""
    if isinstance(choice.get("token_ids"), list):
        return choice["token_ids"]
    logprobs = choice.get("logprobs") or {}
    tokens = [e.get("token") for e in logprobs.get("content") or ()] or logprobs.get("tokens") or []
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    return None


def _on_usage(rec: RequestRecord, usage: dict) -> None:
    rec.completion_tokens, rec.prompt_tokens = usage.get("completion_tokens"), usage.get("prompt_tokens")
    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _on_spec(rec: RequestRecord, obj: dict) -> None:
    rec.spec = read_spec(obj) or rec.spec  # the finishing chunk carries it; the others carry none


def _on_event(rec: RequestRecord, data: bytes, now: float, chat: bool) -> None:
    rec.num_events += 1
    if data == b"[DONE]":
        rec.done = True
        return
    obj = _decode(data.decode())[0]
    usage = obj.get("usage")
    counted = bool(usage) and usage.get("completion_tokens") is not None
    if counted:
        _on_usage(rec, usage)
    _on_spec(rec, obj)
    choices = obj.get("choices")
    if choices:
        choice = choices[0]
        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
        if rec.token_ids is not None and (ids := token_ids(choice)) is not None:
            if rec.silent_positions is not None and not _carries_output(choice, chat):  # special tokens
                rec.silent_positions += range(len(rec.token_ids), len(rec.token_ids) + len(ids))
            rec.token_ids += ids
        if _carries_output(choice, chat):
            rec.chunk_times.append(now)
            if counted:
                rec.chunk_usage.append(rec.completion_tokens)
            if rec.output_text is not None:  # --save-text, ladder identity
                rec.output_text += (choice.get("text") if not chat else
                                    (choice.get("delta") or {}).get("content")) or ""
    elif "error" in obj:
        err = obj["error"]
        rec.error = rec.error or f"stream_error: {err.get('message', err) if isinstance(err, dict) else err}"


def _on_answer(rec: RequestRecord, obj: dict, now: float, chat: bool) -> None:
    """A non-streaming answer: one JSON body, taken as one chunk arriving when it was read."""
    _on_usage(rec, obj.get("usage") or {})
    _on_spec(rec, obj)
    choice = (obj.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    rec.finish_reason = choice.get("finish_reason")
    rec.done = True
    if text or rec.completion_tokens:
        rec.chunk_times.append(now)
    if rec.output_text is not None:
        rec.output_text += text or ""


async def stream(target: Target, body: bytes, rec: RequestRecord, progress: Progress, timeout_s: float) -> None:
    """Send one request and record what comes back. Never raises except on cancellation."""
    chat = target.chat
    progress.in_flight += 1
    progress.peak_in_flight = max(progress.peak_in_flight, progress.in_flight)
    rec.t_send = progress.last_activity = perf_counter()
    waiting = len(body)
    progress.waiting_bytes += waiting
    try:
        async with asyncio.timeout(timeout_s):
            async with target.session.post(target.url, data=body) as resp:
                if resp.status != 200:
                    text = (await resp.text(errors="replace")).strip().replace("\n", " ")
                    kind = "overloaded" if resp.status == 429 else "http_error"
                    rec.error = f"{kind}: HTTP {resp.status}: {text[:160]}"
                    return
                ctype = resp.headers.get("Content-Type", "")
                if not rec.streamed:
                    _on_answer(rec, await resp.json(content_type=None), perf_counter(), chat)
                    return
                if not ctype.startswith("text/event-stream"):
                    body = (await resp.text(errors="replace")).strip().replace("\n", " ")
                    rec.error = (f"not_streaming: the server answered stream: true with {ctype or 'no content type'}, "
                                 f"not text/event-stream; does it support streaming? ({body[:80]!r})")
                    return
                parser = SSEParser()
                read = resp.content.readany
                while data := await read():
                    now = perf_counter()
                    if events := parser.feed(data):  # keep-alive comments alone are no sign of life
                        progress.last_activity = now
                        for event in events:
                            _on_event(rec, event, now, chat)
                        if waiting and rec.chunk_times:
                            progress.waiting_bytes -= waiting
                            waiting = 0
    except TimeoutError:
        rec.error = f"timeout: no complete response within {timeout_s:g} s"
    except aiohttp.ClientPayloadError as e:
        rec.error = f"truncated: the stream broke off: {e}"
    except aiohttp.ClientError as e:
        rec.error = f"connection_error: {type(e).__name__}: {e}"
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # an event that is not an OpenAI chunk
        rec.error = f"bad_event: {type(e).__name__}: {e}"
    finally:
        rec.t_end = progress.last_activity = perf_counter()
        progress.in_flight -= 1
        progress.waiting_bytes -= waiting


async def run_phase(target: Target, bodies: Sequence[bytes], records: Sequence[RequestRecord], concurrency: int,
                    progress: Progress, timeout_s: float, on_done: Callable[[RequestRecord], bool],
                    stop_after_s: float | None = None) -> None:
    """Run every request with at most `concurrency` in flight (closed loop). `on_done` returns whether the
    request failed. With stop_after_s, no request starts after that many seconds; those stay unsent.

    Dispatch lag is measured per request as t_send - t_due: t_due is when a slot became free (the phase
    start for the first wave), so it captures how late the client was to refill the slot.
    """
    sem = asyncio.Semaphore(concurrency)
    start = perf_counter()
    free_since = deque([start] * concurrency)

    async def one(body: bytes, rec: RequestRecord) -> None:
        await sem.acquire()
        rec.t_due = free_since.popleft()
        try:
            if stop_after_s is not None and perf_counter() - start > stop_after_s:
                return
            await stream(target, body, rec, progress, timeout_s)
        finally:
            free_since.append(perf_counter())
            sem.release()
        progress.num_failed += on_done(rec)

    await asyncio.gather(*(one(b, r) for b, r in zip(bodies, records, strict=True)))


async def run_sessions(target: Target, sessions: Sequence[Sequence[RequestRecord]], body: Callable[[int, int], bytes],
                       concurrency: int, progress: Progress, timeout_s: float,
                       on_done: Callable[[RequestRecord], bool], stop_after_s: float | None = None) -> None:
    """Multi-turn sessions, closed loop: `concurrency` workers, each taking the next session and sending its
    turns in order, each once the answer to the one before is complete; `body(session, turn)` builds a
    turn's request then, from the history so far. A failed turn ends its session: the turns after it
    cannot be sent without its reply, and fail as not sent. With stop_after_s, no session starts after
    that many seconds; its turns stay unsent."""
    start = perf_counter()
    queue = iter(range(len(sessions)))

    async def worker() -> None:
        for s in queue:  # one iterator shared by the workers: each session goes to one of them
            if stop_after_s is not None and perf_counter() - start > stop_after_s:
                return
            turns = sessions[s]
            for t, rec in enumerate(turns):
                rec.t_due = perf_counter()  # the turn is due once the answer before it is complete
                await stream(target, body(s, t), rec, progress, timeout_s)
                failed = on_done(rec)
                progress.num_failed += failed
                if failed:
                    for later in turns[t + 1:]:
                        later.error = f"not_sent: turn {rec.turn} of its session failed, so its reply is missing"
                    break

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sessions)))))


async def run_open_loop(target: Target, bodies: Sequence[bytes], records: Sequence[RequestRecord],
                        due: Sequence[float], max_concurrency: int | None, progress: Progress, timeout_s: float,
                        on_done: Callable[[RequestRecord], bool], stop_after_s: float | None = None) -> None:
    """Send request i at due[i] seconds after the start, whatever is still in flight (open loop); with
    max_concurrency, a request waits for a free slot, and that wait shows as lateness (t_send - t_due)."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    tasks: list[asyncio.Task] = []

    async def one(rec: RequestRecord, body: bytes) -> None:
        try:
            await stream(target, body, rec, progress, timeout_s)
        finally:
            if sem is not None:
                sem.release()
        progress.num_failed += on_done(rec)

    async def send(i: int, t_due: float) -> None:
        if sem is not None:
            await sem.acquire()
        records[i].t_due = t_due
        tasks.append(asyncio.create_task(one(records[i], bodies[i])))
        await asyncio.sleep(0)  # let it start: stream() takes t_send

    try:
        await arrivals.dispatch(due, send, perf_counter, asyncio.sleep, stop_after_s)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
