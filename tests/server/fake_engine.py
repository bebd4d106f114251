"""A fake AsyncLLM: the contract of docs/contracts.md over a toy model, for the server tests.

Like the real front end, it runs its engine loop on its own thread and hands each request's deltas to
the request's event loop; it admits requests while busy, accounts KV blocks (so a test can see them
come back after aborts), emits several tokens per step as accepted drafts would, and dies on a fault
injected after N steps (--fault-after-steps or REFENGINE_FAULT_AFTER_STEPS reach it as the real
runner's fault_after_steps does).

The toy model is a pure function of (prompt, sampling params): `reference_output` is the "offline
LLM.generate" that streams must match.
"""

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from refengine.entrypoints.engine_client import (
    EngineDeadError,
    EngineInfo,
    EngineStats,
    GenerationRequest,
    Message,
    RequestDelta,
    TokenLogprobs,
)
from refengine.sample.splitmix import splitmix64
from refengine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

EOS, IM_START, IM_END = 0, 1, 2
SPECIALS = {"<|endoftext|>": EOS, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
BYTE_OFFSET = 3
VOCAB_SIZE = BYTE_OFFSET + 256


class FakeTokenizer:
    """Bytes are tokens (id = byte + 3); three special tokens below them."""

    vocab_size = VOCAB_SIZE

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        rest = text
        while rest:
            special = next((s for s in SPECIALS if rest.startswith(s)), None)
            if special is not None:
                ids.append(SPECIALS[special])
                rest = rest[len(special) :]
            else:
                ids.extend(b + BYTE_OFFSET for b in rest[0].encode())
                rest = rest[1:]
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        out = bytearray()
        for t in token_ids:
            if t >= BYTE_OFFSET:
                out.append(t - BYTE_OFFSET)
            elif not skip_special_tokens:
                out += names[t].encode()
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        if messages[0].role == "assistant":
            raise ValueError("the conversation cannot start with an assistant message")
        text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


LETTERS = [BYTE_OFFSET + c for c in b"abcdefghij klmnopqrstuvwxyz "]


def _key(prompt_ids: Sequence[int], params: SamplingParams) -> int:
    seed = None if params.temperature == 0 else params.seed
    digest = hashlib.sha256(repr((list(prompt_ids), seed, params.temperature)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def reference_output(prompt_ids: Sequence[int], params: SamplingParams) -> tuple[list[int], str]:
    """The toy model's whole output and finish reason; EOS has a 1-in-40 chance per position."""
    key = _key(prompt_ids, params)
    tokens: list[int] = []
    for i in range(params.max_tokens):
        r = splitmix64(key + i)
        may_stop = not params.ignore_eos and i >= params.min_tokens
        if may_stop and r % 40 == 0:
            return [*tokens, EOS], "stop"
        tokens.append(LETTERS[r % len(LETTERS)])
    return tokens, "length"


def _logprobs(token_ids: list[int], num_top: int) -> list[TokenLogprobs]:
    out = []
    for t in token_ids:
        lp = -0.1 * (t % 7)
        top = [(t, lp)] + [((t + j) % VOCAB_SIZE, lp - j) for j in range(1, num_top)]
        out.append(TokenLogprobs(t, lp, top[:num_top]))
    return out


@dataclass
class _Seq:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue[RequestDelta | EngineDeadError]"
    plan: list[int]
    finish_reason: str
    num_out: int = 0
    num_steps: int = 0
    num_blocks: int = 0


class FakeAsyncLLM:
    def __init__(
        self,
        *,
        model_name: str = "fake-model",
        max_model_len: int = 512,
        num_blocks: int = 512,
        block_size: int = 16,
        max_num_seqs: int = 16,
        num_speculative_tokens: int = 3,
        step_interval: float = 0.002,
        fault_after_steps: int | None = None,
        drafter_random_init: bool = False,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.engine_info = EngineInfo(
            numerics="batch_invariant",
            dtype="float32",
            weight_format="fake",
            spec_method="ngram" if num_speculative_tokens else None,
            num_speculative_tokens=num_speculative_tokens,
            async_scheduling=False,
            async_scheduling_source="auto",
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            num_blocks=num_blocks,
        )
        self.fault_after_steps = fault_after_steps
        self.k = num_speculative_tokens
        self.step_interval = step_interval
        self.drafter_random_init = drafter_random_init
        self.requests_seen: list[GenerationRequest] = []
        self._lock = threading.Lock()
        self._waiting: deque[_Seq] = deque()
        self._running: dict[str, _Seq] = {}
        self._free_blocks = num_blocks
        self._num_steps = 0
        self._counters = dict.fromkeys(["prompt", "generation", "drafts", "draft_tokens", "accepted"], 0)
        self._accepted_per_pos = [0] * num_speculative_tokens
        self._dead_reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-engine-loop", daemon=True)
        self._thread.start()

    # ---- the AsyncLLM surface ------------------------------------------------------------------

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[RequestDelta, None]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        plan, reason = reference_output(request.prompt_token_ids, request.sampling_params)
        seq = _Seq(request, asyncio.get_running_loop(), asyncio.Queue(), plan, reason)
        with self._lock:
            self.requests_seen.append(request)
            self._waiting.append(seq)
        finished = False
        try:
            while True:
                item = await seq.queue.get()
                if isinstance(item, EngineDeadError):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._abort(request.request_id)

    def stats(self) -> EngineStats:
        with self._lock:
            c = self._counters
            return EngineStats(
                num_requests_running=len(self._running),
                num_requests_waiting=len(self._waiting),
                num_prompt_tokens=c["prompt"],
                num_generation_tokens=c["generation"],
                num_preemptions=0,
                num_free_blocks=self._free_blocks,
                num_blocks=self.engine_info.num_blocks,
                spec_num_drafts=c["drafts"],
                spec_num_draft_tokens=c["draft_tokens"],
                spec_num_accepted_tokens=c["accepted"],
                spec_num_accepted_tokens_per_pos=list(self._accepted_per_pos),
                drafter_random_init=self.drafter_random_init,
            )

    def inject_fault(self) -> None:
        """Makes the next step with work raise, as the fault hook does after N steps."""
        with self._lock:
            self.fault_after_steps = self._num_steps

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # ---- the engine loop (its own thread) ------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.engine_info.block_size)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            self._waiting = deque(s for s in self._waiting if s.request.request_id != request_id)
            seq = self._running.pop(request_id, None)
            if seq is not None:
                self._free_blocks += seq.num_blocks

    def _loop(self) -> None:
        while not self._stop.wait(self.step_interval):
            try:
                self._step()
            except Exception as e:  # the engine's death: record it once, fail everyone in flight
                self._die(f"{type(e).__name__}: {e}")
                return

    def _die(self, reason: str) -> None:
        logger.error("engine loop died: %s", reason)
        with self._lock:
            self._dead_reason = reason
            victims = [*self._waiting, *self._running.values()]
            self._waiting.clear()
            self._running.clear()
        for seq in victims:
            self._post(seq, EngineDeadError(reason))

    def _post(self, seq: _Seq, item: RequestDelta | EngineDeadError) -> None:
        try:
            seq.loop.call_soon_threadsafe(seq.queue.put_nowait, item)
        except RuntimeError:  # that request's event loop is closed: nobody is listening
            self._abort(seq.request.request_id)

    def _step(self) -> None:
        outputs: list[tuple[_Seq, RequestDelta]] = []
        with self._lock:
            # Like the runner, only steps with work count towards the injected fault.
            if self._waiting or self._running:
                self._num_steps += 1
                if self.fault_after_steps is not None and self._num_steps > self.fault_after_steps:
                    raise RuntimeError(f"injected fault after {self.fault_after_steps} steps")
            while self._waiting and len(self._running) < self.engine_info.max_num_seqs:
                seq = self._waiting[0]
                need = self._blocks_for(len(seq.request.prompt_token_ids) + 1)
                if need > self._free_blocks:
                    break
                self._waiting.popleft()
                self._free_blocks -= need
                seq.num_blocks = need
                self._running[seq.request.request_id] = seq
                self._counters["prompt"] += len(seq.request.prompt_token_ids)
            for seq in list(self._running.values()):
                delta = self._advance(seq)
                if delta is not None:
                    outputs.append((seq, delta))
        for seq, delta in outputs:
            self._post(seq, delta)

    def _advance(self, seq: _Seq) -> RequestDelta | None:
        """One step of one running request; called with the lock held."""
        accepted = (seq.num_steps * 7 + len(seq.request.prompt_token_ids)) % (self.k + 1) if self.k else 0
        n = min(1 + accepted, len(seq.plan) - seq.num_out)
        need = self._blocks_for(len(seq.request.prompt_token_ids) + seq.num_out + n) - seq.num_blocks
        if need > self._free_blocks:
            return None  # no room this step; try again next step
        self._free_blocks -= max(need, 0)
        seq.num_blocks += max(need, 0)
        seq.num_steps += 1
        if self.k:
            self._counters["drafts"] += 1
            self._counters["draft_tokens"] += self.k
            self._counters["accepted"] += accepted
            for pos in range(accepted):
                self._accepted_per_pos[pos] += 1
        new = seq.plan[seq.num_out : seq.num_out + n]
        seq.num_out += n
        self._counters["generation"] += n
        finished = seq.num_out == len(seq.plan)
        if finished:
            del self._running[seq.request.request_id]
            self._free_blocks += seq.num_blocks
        wanted = seq.request.logprobs
        return RequestDelta(
            token_ids=new,
            text=self.tokenizer.decode(new, skip_special_tokens=True),
            logprobs=None if wanted is None else _logprobs(new, wanted),
            finished=finished,
            finish_reason=seq.finish_reason if finished else None,  # type: ignore[arg-type]
            num_prompt_tokens=len(seq.request.prompt_token_ids),
            num_output_tokens=seq.num_out,
        )


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
