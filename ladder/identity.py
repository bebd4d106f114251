"""`ladder identity`: identical requests to two endpoints, and whether their outputs are identical.

Typical pairs: one engine with async scheduling on and off, or with speculation on and off. Both must
produce the same tokens at temperature 0, and at temperature > 0 too where the randomness is keyed by a
request seed (`--seed`: request i carries seed S + i) rather than by arrival order.

Token ids are compared where the server exposes them: `return_token_ids` (choices[].token_ids, vLLM and
refengine), else `return_tokens_as_token_ids` with logprobs (tokens spelled "token_id:N", vLLM and
refengine); otherwise the text is compared, which cannot see two tokenisations of the same text.
Each endpoint gets the same probe requests, so a server that keys randomness by arrival count sees the
measured requests at the same counts; at c > 1 arrival order is the client's and the network's, so only
seeded sampling is comparable there.
"""

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter

from ladder import prompts
from ladder.client import Progress, Target, stream
from ladder.config import SetupError
from ladder.endpoint import Endpoint
from ladder.records import RequestRecord
from ladder.redact import redact_url

CONTEXT = 4  # tokens (or 4x as many characters) shown either side of a divergence

IDS = "token_ids"  # choices[].token_ids
LOGPROB_IDS = "logprob token ids"  # logprobs tokens spelled "token_id:N"
TEXT = "text"


@dataclass(frozen=True)
class IdentityConfig:
    url_a: str
    url_b: str
    model: str | None
    concurrencies: tuple[int, ...]
    prompts: int
    max_tokens: int
    temperature: float
    seed: int | None
    chat: bool
    ignore_eos: bool
    prompt_words: int
    api_key: str | None
    timeout_s: float


@dataclass
class Completion:
    text: str = ""
    token_ids: list[int] | None = None
    error: str | None = None
    finish_reason: str | None = None
    silent_positions: list[int] = field(default_factory=list)  # ids that came without text: special tokens


@dataclass(frozen=True)
class Verdict:
    concurrency: int
    index: int
    identical: bool
    compared: str  # IDS / TEXT, or "error"
    length_a: int
    length_b: int
    position: int | None  # first divergence: token index (ids) or character index (text)
    context: str
    a: Completion = field(repr=False)
    b: Completion = field(repr=False)

    def line(self) -> str:
        head = f"c={self.concurrency} #{self.index}"
        unit = "tokens" if self.compared != TEXT else "chars"
        if self.compared == "error":
            return f"{head}  ERROR  {self.context}"
        if self.identical:
            return f"{head}  identical  ({self.length_a} {unit})"
        return (f"{head}  DIVERGED at {unit[:-1]} {self.position} (of {self.length_a} / {self.length_b} "
                f"{unit}): {self.context}")


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """The first index where a and b differ (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_context(a: Sequence, b: Sequence, position: int, width: int) -> str:
    """`common … | A: rest … B: rest …`, with `width` items either side of the divergence."""
    def show(items: Sequence) -> str:
        return repr("".join(items)) if isinstance(items, str) else " ".join(map(str, items)) or "(end)"
    return (f"after {show(a[max(0, position - width):position])} | A: {show(a[position:position + width])} "
            f"| B: {show(b[position:position + width])}")


def eos_note(seq_a: Sequence, seq_b: Sequence, pos: int, a: Completion, b: Completion) -> str:
    """Say so when the divergence is one side stopping at end-of-sequence while the other went on: engines
    treat EOS differently (with ignore_eos llama.cpp bans it, vLLM emits it and goes on), so the text up to
    there can look identical."""
    for name, seq, done, other in (("A", seq_a, a, "B"), ("B", seq_b, b, "A")):
        if pos == len(seq) and done.finish_reason == "stop":
            return (f"; the divergence falls on an end-of-sequence token: {name} stopped there "
                    f"(finish_reason stop) and {other} went on")
    # With ignore_eos, an engine that emits EOS and goes on (vLLM, refengine) sends a token without text
    # where one that bans EOS (llama.cpp) sends another token.
    silent = [name for name, done in (("A", a), ("B", b)) if pos in done.silent_positions]
    if len(silent) == 1 and seq_a is not a.text:
        name, other = silent[0], "B" if silent[0] == "A" else "A"
        return (f"; {name}'s token {pos} ({seq_a[pos] if name == 'A' else seq_b[pos]}) came without text: a special "
                f"token, with --ignore-eos most likely end-of-sequence, which {name} emitted and went on past while "
                f"{other} sampled another token (engines honour ignore_eos differently: vLLM and refengine emit EOS "
                f"and go on, llama.cpp bans it)")
    return ""


def compare(c: int, index: int, a: Completion, b: Completion) -> Verdict:
    if a.error or b.error:
        why = "; ".join(f"{side}: {c.error}" for side, c in (("A", a), ("B", b)) if c.error)
        return Verdict(c, index, False, "error", 0, 0, None, why, a, b)
    if a.token_ids is not None and b.token_ids is not None:
        seq_a, seq_b, mode, width = a.token_ids, b.token_ids, IDS, CONTEXT
    else:
        seq_a, seq_b, mode, width = a.text, b.text, TEXT, 4 * CONTEXT
    pos = first_divergence(seq_a, seq_b)
    context = ""
    if pos is not None:
        context = divergence_context(seq_a, seq_b, pos, width)
        text_pos = first_divergence(a.text, b.text)
        if mode == IDS and text_pos is not None:  # the text is what a person can read
            context += f"; text from char {text_pos}: {divergence_context(a.text, b.text, text_pos, 4 * CONTEXT)}"
        context += eos_note(seq_a, seq_b, pos, a, b)
    return Verdict(c, index, pos is None, mode, len(seq_a), len(seq_b), pos, context, a, b)


async def fetch(target: Target, body: dict, timeout_s: float) -> Completion:
    """One streamed request through the ladder's client; text and token ids joined over its chunks."""
    rec = RequestRecord(concurrency=0, phase="identity", index=0, output_text="", token_ids=[], silent_positions=[])
    await stream(target, json.dumps(body).encode(), rec, Progress(perf_counter()), timeout_s)
    error = rec.error or (None if rec.done else "truncated: the stream ended without [DONE]")
    return Completion(text=rec.output_text, token_ids=rec.token_ids or None, error=error,
                      finish_reason=rec.finish_reason, silent_positions=rec.silent_positions)


@dataclass
class Side:
    """One endpoint and how it is asked for token ids."""

    name: str
    endpoint: Endpoint
    model: str = ""
    mode: str = TEXT
    probes: int = 0

    def body(self, config: IdentityConfig, prompt: str, max_tokens: int, seed: int | None) -> dict:
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": config.temperature,
                      "stream": True, "stream_options": {"include_usage": True}}
        if config.ignore_eos:
            body["ignore_eos"] = True
        if seed is not None:
            body["seed"] = seed
        if self.mode == IDS:
            body["return_token_ids"] = True
        elif self.mode == LOGPROB_IDS:
            body.update(return_tokens_as_token_ids=True, logprobs=True if config.chat else 1)
            if config.chat:
                body["top_logprobs"] = 0
        if config.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def request(self, config: IdentityConfig, prompt: str, max_tokens: int, seed: int | None) -> Completion:
        return await fetch(self.endpoint.target, self.body(config, prompt, max_tokens, seed), config.timeout_s)

    async def setup(self, config: IdentityConfig) -> None:
        """Model, then the first way of getting token ids that the server answers with ids."""
        models = await self.endpoint.models()
        if not models and not config.model:
            raise SetupError(f"{self.name}: /v1/models lists no model; pass --model")
        self.model = config.model or models[0]["id"]
        for mode in (IDS, LOGPROB_IDS, TEXT):
            self.mode = mode
            probe = await self.probe(config)
            if mode == TEXT and probe.error:
                hint = "; a server that refuses ignore_eos needs --no-ignore-eos" if config.ignore_eos else ""
                raise SetupError(f"{self.name}: probe request failed: {probe.error}{hint}")
            if probe.token_ids:
                return

    async def probe(self, config: IdentityConfig) -> Completion:
        self.probes += 1
        return await self.request(config, "ping", 1, config.seed)


async def _rung(sides: Sequence[Side], config: IdentityConfig, c: int, first_seed: int | None) -> list[Verdict]:
    # NOTE: the same prompts at every c, so that prompt #i at c = 1 is each side's answer alone to #i under load
    rng = random.Random("ladder-identity")
    texts = [prompts.words_text(rng, config.prompt_words) for _ in range(config.prompts)]
    seeds = [None if first_seed is None else first_seed + i for i in range(len(texts))]

    async def run(side: Side) -> list[Completion]:
        sem = asyncio.Semaphore(c)

        async def one(text: str, seed: int | None) -> Completion:
            async with sem:
                return await side.request(config, text, config.max_tokens, seed)
        return await asyncio.gather(*(one(t, s) for t, s in zip(texts, seeds)))

    a, b = await asyncio.gather(*(run(side) for side in sides))
    return [compare(c, i, x, y) for i, (x, y) in enumerate(zip(a, b))]


async def run_identity(config: IdentityConfig, echo) -> list[Verdict]:
    async with Endpoint(config.url_a, config.api_key, config.chat) as ep_a, \
            Endpoint(config.url_b, config.api_key, config.chat) as ep_b:
        sides = [Side("A", ep_a), Side("B", ep_b)]
        for side in sides:
            await side.setup(config)
        # NOTE: equal probe counts, so that a server keying randomness by arrival count is in step
        while (behind := min(sides, key=lambda s: s.probes)).probes < max(s.probes for s in sides):
            await behind.probe(config)
        echo(f"A {ep_a.base_url} model={sides[0].model} compares {sides[0].mode}; "
             f"B {ep_b.base_url} model={sides[1].model} compares {sides[1].mode}")
        echo(f"c={','.join(map(str, config.concurrencies))}, {config.prompts} prompts per c, "
             f"max_tokens {config.max_tokens}, temperature {config.temperature:g}, "
             f"{'request seeds ' + str(config.seed) + '+i' if config.seed is not None else 'no request seed'}")
        verdicts: list[Verdict] = []
        for c in config.concurrencies:
            first_seed = None if config.seed is None else config.seed + len(verdicts)
            for verdict in await _rung(sides, config, c, first_seed):
                echo(verdict.line())
                verdicts.append(verdict)
        return verdicts


def summary(verdicts: Sequence[Verdict]) -> str:
    same = sum(v.identical for v in verdicts)
    errors = sum(v.compared == "error" for v in verdicts)
    diverged = [v for v in verdicts if not v.identical and v.compared != "error"]
    text = f"identical {same}/{len(verdicts)}"
    if diverged:
        text += f", diverged {len(diverged)} (" + ", ".join(
            f"c={v.concurrency} #{v.index} at {v.position}" for v in diverged[:8]) + (", …" if len(diverged) > 8 else "") + ")"
    if errors:
        text += f", errors {errors}"
    under_load = [v for v in diverged if v.concurrency > 1]
    if under_load:
        alone = {v.index: v for v in verdicts if v.concurrency == 1}
        text += "; under concurrency: " + ", ".join(_who_moved(v, alone.get(v.index)) for v in under_load[:8])
    return text


def _who_moved(v: Verdict, alone: Verdict | None) -> str:
    """Which side's batched answer left its own answer alone (the same prompt at c = 1), or how to find out."""
    if alone is None or not alone.identical:
        return f"rerun prompt #{v.index} at c = 1 (--c 1) to see which side moved"
    moved = [name for name, now, then in (("A", v.a, alone.a), ("B", v.b, alone.b))
             if (now.token_ids, now.text) != (then.token_ids, then.text)]
    return f"c={v.concurrency} #{v.index}: {' and '.join(moved) or 'neither'} moved from its c = 1 answer"


def write_json(path: Path, config: IdentityConfig, verdicts: Sequence[Verdict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = asdict(config)
    recorded["api_key"] = "<set>" if config.api_key else None  # a secret never reaches a file
    recorded["url_a"], recorded["url_b"] = redact_url(config.url_a), redact_url(config.url_b)
    path.write_text(json.dumps({"config": recorded, "verdicts": [asdict(v) for v in verdicts]}, indent=1) + "\n")
