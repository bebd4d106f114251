"""The workload of a run: model, server capabilities and every request body, built before any clock starts.

Random prompts are seeded per (seed, load, phase). Dataset requests are dealt from one seeded shuffle of
the usable records, rung after rung in ladder order and each rung's warmup first, so no record is sent twice
in a run (its earlier answer would sit in a prefix cache) until the pool runs out.

A trace (`--dataset trace:FILE`, ladder.trace) is one rung: its requests, built from their hash ids' blocks
of seeded words, and the times they are due. With --multi-turn a phase's requests are the turns of its
sessions, in order; their bodies are built as they are sent (ladder.multiturn), since each carries the
replies before it.

With cache busting (the default for random prompts and traces, off for datasets, whose texts a model could
echo) every prompt starts with a per-run tag, so a server's prefix cache never serves a prompt from an
earlier run; it is the same for every prompt of the run, so prefixes the prompts share stay shared (a
session draws its own, ladder.multiturn). The request hash that `ladder compare` checks leaves the tag out.
"""

import functools
import hashlib
import json
import random
import secrets
from dataclasses import asdict, dataclass, replace

from ladder import content_types, datasets, engine_info, prompts, shared_prefix, trace
from ladder.client import Messages, request_body
from ladder.config import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, RunConfig, SetupError
from ladder.endpoint import Endpoint
from ladder.lengths import LengthDist
from ladder.records import RequestRecord, probe_failure

# Probes that might not fit the server's max_model_len are fitted from one short probe of this many words,
# to this share of it (random words vary in length, so the probes' tokens vary around the estimate).
PROBE_FIT_WORDS = 16
PROBE_FIT_SHARE = 0.9

# The cache-bust tag: "Run" and NONCE_WORDS words drawn from these, then a newline. Each word has four
# letters and is one token after a space in BPE vocabularies (SmolLM2's, GPT-2's, Llama's, Qwen's) and four
# bytes in a byte-level one, so every tag costs the same tokens whatever it draws: two runs of one command
# then have the same prompt lengths (a hex nonce cost 6 to 11 tokens, depending on its digits).
NONCE_VOCAB = tuple("""
able away ball bear bird body born busy camp case coat cook corn dead deep draw dust east else face fall fear
fill fire food four game give good half hard heat high hole hour idea join keep knee land lead life line live
loud make meal meet mind move neck next open pick poem pull rain rest ring roll rope safe same seat
""".split())
NONCE_WORDS = 6  # 36 bits


@dataclass(frozen=True)
class Request:
    messages: tuple[tuple[str, str], ...]  # without the nonce; a turn of a session: its new user message
    max_tokens: int
    session: int | None = None  # --multi-turn: the session within its phase (0-based)
    turn: int | None = None  # --multi-turn: the turn within its session (1-based)
    reply: str | None = None  # --multi-turn-reply dataset: the reply the history carries after this turn
    input_len: int | None = None  # a trace: the prompt tokens its line asks for (input_length)
    content_type: str | None = None  # chat, code, math: where its prompt came from (ladder.content_types)


@dataclass(frozen=True)
class RungWorkload:
    warmup: list[Request]
    measured: list[Request]
    warmup_bodies: list[bytes]  # empty for --multi-turn: a turn's body is built when it is sent
    measured_bodies: list[bytes]
    prompt_hash: str  # of the measured requests, nonce excluded
    due: list[float] | None = None  # a trace: when each measured request is due, seconds after the start


@dataclass(frozen=True)
class Workload:
    model: str
    model_info: dict
    server_engine: dict  # engine keys as the server reports them (engine_info.from_server)
    continuous_usage: bool  # requested; the manifest later records what the server actually sent
    sizing: dict
    dataset: dict  # kind, source, num_records, num_usable
    nonce: str | None
    rungs: dict[int | float, RungWorkload]


def request_hash(requests: list[Request]) -> str:
    # NOTE: a session's turns add their place and reply; single requests hash as they always have.
    return hashlib.sha256(json.dumps([[r.messages, r.max_tokens] + ([r.session, r.turn, r.reply] if r.turn else [])
                                      for r in requests]).encode()).hexdigest()


def new_nonce() -> str:
    return " ".join(secrets.choice(NONCE_VOCAB) for _ in range(NONCE_WORDS))


def with_nonce(messages: tuple[tuple[str, str], ...], nonce: str | None) -> Messages:
    if nonce is None:
        return messages
    (role, content), *rest = messages
    return [(role, f"Run {nonce}\n{content}"), *rest]


def deal(pool: tuple, seed: int, counts: list[int]) -> tuple[list[list], int]:
    """Consecutive hands of the given sizes from one seeded shuffle of the pool: no record twice in a run
    until the pool runs out, then a fresh shuffle. Returns the hands and how many records came again."""
    rng = random.Random(f"ladder-deal:{seed}")
    order: list = []
    hands = []
    for count in counts:
        hand = []
        for _ in range(count):
            if not order:
                order = rng.sample(pool, len(pool))
            hand.append(order.pop())
        hands.append(hand)
    return hands, max(0, sum(counts) - len(pool))


TOKENIZER_TOLERANCE = 0.1  # tokens per word: the share by which --tokenizer may differ from the server


async def _check_tokenizer(tok, path, probe, rng: random.Random, words: tuple[int, int], first: RequestRecord) -> None:
    """Before an overhead is blamed, check that --tokenizer counts like the server: a second probe gives the
    server's tokens per word, free of its overhead. A tokenizer that is not the server's makes any
    "overhead" meaningless, so that is the error then, with the overhead the server really adds."""
    second = await probe(prompts.words_text(rng, words[1]))
    if first.prompt_tokens is None or second.prompt_tokens is None:
        return
    server = prompts.fit(words, (first.prompt_tokens, second.prompt_tokens))
    ours = len(tok.encode(" ".join(prompts.WORDS), add_special_tokens=False).ids) / len(prompts.WORDS)
    if abs(ours - server.tokens_per_word) > TOKENIZER_TOLERANCE * server.tokens_per_word:
        raise SetupError(f"--tokenizer {path} counts {ours:.2f} tokens a word where the server counts "
                         f"{server.tokens_per_word:.2f}: is it the server's tokenizer? (the server adds about "
                         f"{server.overhead_tokens:.0f} tokens around a prompt, from two probes)")


class Builder:
    """Builds bodies for one run: the options every request of the run shares."""

    def __init__(self, config: RunConfig, model: str, continuous: bool, nonce: str | None):
        self.config, self.model, self.continuous, self.nonce = config, model, continuous, nonce

    def body(self, req: Request) -> bytes:
        return self.messages_body(with_nonce(req.messages, self.nonce), req.max_tokens)

    def messages_body(self, messages: Messages, max_tokens: int) -> bytes:
        return request_body(messages, model=self.model, chat=self.config.chat, max_tokens=max_tokens,
                            temperature=self.config.temperature, continuous_usage=self.continuous,
                            ignore_eos=self.config.eos_ignored, stream=self.config.stream,
                            extra=self.config.body_extra)


def _checks(config: RunConfig, kind: str) -> None:
    """Flags that do not go with the dataset, refused before anything is read or sent."""
    if kind != "random" and config.prefix_len is not None:
        raise SetupError(f"--prefix-len builds random prompts; --dataset {kind} brings its own")
    if kind != "random" and config.input_len is not None:
        raise SetupError(f"--input-len sizes random prompts; --dataset {kind} brings its own (see --max-input-len)")
    if config.multi_turn and config.prefix_len is not None:
        raise SetupError("--prefix-len shares one prefix across requests, --multi-turn shares each session's "
                         "history across its turns: give one of them")
    if kind == "trace" and config.max_input_len is not None:
        raise SetupError("--max-input-len filters a dataset; a trace is replayed whole")
    if config.max_input_len is not None and config.tokenizer is None:
        raise SetupError("--max-input-len counts prompt tokens: it needs --tokenizer")
    if config.max_total_len is not None and kind in ("random", "trace"):
        raise SetupError(f"--max-total-len filters a dataset's requests; --dataset {kind} sizes its own")
    if config.max_total_len is not None and config.tokenizer is None:
        raise SetupError("--max-total-len counts prompt tokens: it needs --tokenizer")


def as_sessions(requests: list[Request], turns: int, replies: list[str] | None) -> list[Request]:
    """Consecutive runs of `turns` requests as sessions, each turn carrying its dataset reply when given."""
    return [replace(r, session=i // turns, turn=i % turns + 1, reply=replies[i] if replies else None)
            for i, r in enumerate(requests)]


async def prepare(config: RunConfig, ep: Endpoint) -> Workload:
    """Model, server capabilities and every request body, all before any clock starts."""
    kind, path = datasets.parse_spec(config.dataset)
    _checks(config, kind)
    pool: tuple = ()
    dataset_info: dict = {"kind": kind}
    if kind == "trace":  # read the file before touching the server
        replay = trace.read_trace(path)
        dataset_info = {"kind": kind, "source": replay.source, "num_records": len(replay.requests),
                        "num_usable": len(replay.requests)}
    elif kind != "random":
        data = (content_types.load_mix(config.multi_turn) if kind == "mix"
                else datasets.load(kind, path, config.multi_turn))
        tok = prompts.load_tokenizer(config.tokenizer) if config.tokenizer is not None else None
        count = (lambda text: len(tok.encode(text, add_special_tokens=False).ids)) if tok else None
        pool = datasets.select(data, count, config.output_len, config.max_input_len, config.max_total_len)
        dataset_info = {"kind": kind, "source": data.source, "num_records": data.num_records,
                        "num_usable": len(pool), "max_input_len": config.max_input_len,
                        "max_total_len": config.max_total_len}

    models = await ep.models()
    if not models and not config.model:
        raise SetupError("/v1/models lists no model; pass --model")
    model = config.model or models[0]["id"]
    info = next((m for m in models if m.get("id") == model), {})
    server_engine = engine_info.from_server(info, await ep.optional_text("/metrics"),
                                            await ep.optional_json("/props"))
    nonce = new_nonce() if config.busts_cache else None

    rng = random.Random(f"ladder-probe:{config.seed}")
    continuous = True

    async def probe(text: str) -> RequestRecord:
        """The record of a 1-token request for `text` (the nonce added)."""
        nonlocal continuous
        while True:
            msgs = with_nonce((("user", text),), nonce)
            body = request_body(msgs, model=model, chat=config.chat, max_tokens=1,
                                temperature=config.temperature, continuous_usage=continuous)
            rec = await ep.probe(body, config.timeout_s)
            # NOTE: a server that rejects continuous_usage_stats gets requests without it.
            if continuous and (rec.error or "").startswith("http_error: HTTP 400"):
                continuous = False
                continue
            err = probe_failure(rec)
            if err:
                raise SetupError(f"probe request to {ep.base_url + ep.path} failed: {err}")
            if rec.completion_tokens is None and not config.allow_chunk_count:
                raise SetupError("the server sends no usage.completion_tokens; pass --allow-chunk-count "
                                 "to count one token per chunk")
            return rec

    # every phase of the run in the order it is sent: each rung's warmup, then its measured requests (or,
    # with --multi-turn, sessions)
    plan = [(load, phase, count) for load in config.loads
            for phase, count in (("warmup", config.num_warmup(load)), ("measured", config.num_prompts(load)))]
    # NOTE: a trace's probes are about one block long: its prompts are sized block by block.
    input_len = config.input_len or (trace.BLOCK_TOKENS if kind == "trace" else DEFAULT_INPUT_LEN)
    words = (max(16, input_len), max(8, input_len // 2))
    first_text = prompts.words_text(rng, words[0] if config.synthetic else 8)  # a dataset's probe checks usage only
    probe_fit: dict | None = None
    max_model_len = server_engine.get("max_model_len")
    limit = PROBE_FIT_SHARE * (max_model_len - 1) if isinstance(max_model_len, int) else None  # 1 token out
    if config.synthetic and limit is not None and len(first_text.encode()) > limit:
        # A text has hardly more tokens than UTF-8 bytes, so only a probe this long risks a refusal as too
        # long (a byte-level tokenizer counts every byte). Fit it: a short probe bounds the tokens per word
        # from above (the template's tokens counted in), and the probes shrink to the most words that fit.
        short = await probe(prompts.words_text(random.Random(f"ladder-probe-fit:{config.seed}"), PROBE_FIT_WORDS))
        if short.prompt_tokens is not None:
            fitted = max(PROBE_FIT_WORDS, int(limit * PROBE_FIT_WORDS // short.prompt_tokens))
            if fitted < words[0]:
                probe_fit = {"max_model_len": max_model_len, "words_asked": list(words),
                             "short_probe": {"words": PROBE_FIT_WORDS, "tokens": short.prompt_tokens}}
                words = (fitted, max(8, fitted // 2))
                first_text = prompts.words_text(rng, words[0])
    first = await probe(first_text)
    sizing: dict = {"method": "dataset"}
    due = None
    if config.synthetic:
        if config.tokenizer is not None:
            # NOTE: --input-len is the server's prompt_tokens in both modes, so the tokenizer sizes the text
            # to input_len minus what the server adds around it (chat template, BOS, nonce), measured once
            # from the probe; a server without prompt usage is taken to add nothing.
            tok = prompts.load_tokenizer(config.tokenizer)
            overhead = 0
            if first.prompt_tokens is not None:
                overhead = first.prompt_tokens - len(tok.encode(first_text, add_special_tokens=False).ids)
            if input_len - overhead < 1:
                await _check_tokenizer(tok, config.tokenizer, probe, rng, words, first)
                raise SetupError(f"--input-len {input_len} is below the server's prompt overhead of {overhead} tokens")
            sizer = prompts.tokenizer_sizer(tok, input_len - overhead)
            text_sizer = lambda n: prompts.tokenizer_sizer(tok, n)  # noqa: E731
            size_for = lambda n: prompts.tokenizer_sizer(tok, max(1, n - overhead))  # noqa: E731
            sizing = {"method": "tokenizer", "tokenizer": str(config.tokenizer), "overhead_tokens": overhead}
        else:
            if first.prompt_tokens is None:
                raise SetupError("the server reports no usage.prompt_tokens, so prompts cannot be sized; "
                                 "pass --tokenizer PATH")
            second = await probe(prompts.words_text(rng, words[1]))
            cal = prompts.fit(words, (first.prompt_tokens, second.prompt_tokens))
            num_words = cal.words_for(input_len)
            sizer = prompts.calibrated_sizer(num_words)
            # A text of n tokens of its own, without a second template overhead (a prefix, a trace's block).
            text_sizer = lambda n: prompts.calibrated_sizer(max(1, round(n / cal.tokens_per_word)))  # noqa: E731
            size_for = lambda n: prompts.calibrated_sizer(max(1, cal.words_for(n)))  # noqa: E731
            overhead = round(cal.overhead_tokens)
            sizing = {"method": "probe", "words": num_words, **asdict(cal)}
        if probe_fit is not None:
            sizing["probe_fit"] = probe_fit  # the probes were shrunk to fit the server's max_model_len
        output_len = config.output_len or DEFAULT_OUTPUT_LEN

        shared = None
        if config.prefix_len is not None:
            shared = shared_prefix.shared_prefixes(config.seed, config.num_prefixes, text_sizer(config.prefix_len))
            sizing["shared_prefix"] = {"prefix_len": config.prefix_len, "num_prefixes": config.num_prefixes}
            sizer = shared.sizer(sizer)
        dist = LengthDist(config.length_dist, config.range_ratio)

        def requests(load: int | float, phase: str, count: int) -> list[Request]:
            if not config.range_ratio:
                texts = prompts.rung_prompts(config.seed, load, phase, count, sizer)
                return [Request((("user", t),), output_len) for t in texts]
            rng = random.Random(f"ladder-lengths:{config.seed}:{load}:{phase}")
            lengths = [(dist.draw(rng, input_len, 1), dist.draw(rng, output_len, 2)) for _ in range(count)]
            text_rng = random.Random(f"ladder:{config.seed}:{load}:{phase}")
            sized = [(size_for(n_in) if shared is None else shared.sizer(size_for(n_in)), n_out) for n_in, n_out in lengths]
            return [Request((("user", s(text_rng)),), n_out) for s, n_out in sized]

        def sessions(load: int | float, phase: str, count: int) -> list[Request]:
            """`count` sessions of --multi-turn turns, each turn a random prompt, and with
            --multi-turn-reply dataset a reply of seeded words of about --output-len tokens."""
            turns = config.multi_turn
            replies = None
            if config.multi_turn_reply == "dataset":
                reply_rng = random.Random(f"ladder-reply:{config.seed}:{load}:{phase}")
                replies = [text_sizer(output_len)(reply_rng) for _ in range(count * turns)]
            return as_sessions(requests(load, phase, count * turns), turns, replies)

        if kind == "trace":
            (load,) = config.loads
            block = functools.cache(lambda h, n: text_sizer(n)(random.Random(f"ladder-trace:{config.seed}:{h}")))
            sizing["trace"] = {"block_tokens": trace.BLOCK_TOKENS, "overhead_tokens": overhead,
                               "speedup": config.trace_speedup}
            phases = {(load, "warmup"): [], (load, "measured"): [
                Request((("user", trace.prompt_text(r, block, overhead)),), r.output_length, input_len=r.input_length)
                for r in replay.requests]}
            due = replay.due_times(config.trace_speedup)
        else:
            make = sessions if config.multi_turn else requests
            phases = {(load, phase): make(load, phase, count) for load, phase, count in plan}
    else:
        hands, dataset_info["num_reused"] = deal(pool, config.seed, [count for _, _, count in plan])
        phases = {(load, phase): _dataset_requests(config, hand) for (load, phase, _), hand in zip(plan, hands)}

    build = Builder(config, model, continuous, nonce)

    def bodies(requests: list[Request]) -> list[bytes]:
        # NOTE: a session's turn is built when it is sent, from the history (and the replies) so far.
        return [] if config.multi_turn else [build.body(r) for r in requests]

    rungs = {}
    for load in config.loads:
        warmup, measured = phases[load, "warmup"], phases[load, "measured"]
        rungs[load] = RungWorkload(warmup, measured, bodies(warmup), bodies(measured), request_hash(measured), due)
    return Workload(model, info, server_engine, continuous, sizing, dataset_info, nonce, rungs)


def _dataset_requests(config: RunConfig, hand: list) -> list[Request]:
    """A hand of dataset records as requests; with --multi-turn each record is a session, its turns in order,
    each with the dataset's reply when --multi-turn-reply dataset asks for it."""
    if not config.multi_turn:
        return [Request(r.messages, r.output_len, content_type=r.content_type) for r in hand]
    dataset_reply = config.multi_turn_reply == "dataset"
    return [Request(q.messages, q.output_len, session=s, turn=t + 1, reply=q.reply if dataset_reply else None)
            for s, session in enumerate(hand) for t, q in enumerate(session)]
