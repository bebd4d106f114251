"""The workload of a run: model, server capabilities and every request body, built before any clock starts.

Each rung's requests come from the dataset, seeded per (seed, load, phase), so a rung's measured requests
depend neither on the other rungs nor on the warmup count. With cache busting (the default) every prompt
starts with a per-run nonce, so a server's prefix cache never serves a prompt from an earlier run; the
request hash that `ladder compare` checks leaves the nonce out.
"""

import hashlib
import json
import random
import secrets
from dataclasses import asdict, dataclass

from ladder import datasets, engine_info, prompts
from ladder.client import Messages, request_body
from ladder.config import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, RunConfig, SetupError
from ladder.endpoint import Endpoint
from ladder.lengths import LengthDist
from ladder.records import RequestRecord, probe_failure

# Probes that might not fit the server's max_model_len are fitted from one short probe of this many words,
# to this share of it (random words vary in length, so the probes' tokens vary around the estimate).
PROBE_FIT_WORDS = 16
PROBE_FIT_SHARE = 0.9


@dataclass(frozen=True)
class Request:
    messages: tuple[tuple[str, str], ...]  # without the nonce
    max_tokens: int


@dataclass(frozen=True)
class RungWorkload:
    warmup: list[Request]
    measured: list[Request]
    warmup_bodies: list[bytes]
    measured_bodies: list[bytes]
    prompt_hash: str  # of the measured requests, nonce excluded


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
    return hashlib.sha256(json.dumps([[r.messages, r.max_tokens] for r in requests]).encode()).hexdigest()


def with_nonce(messages: tuple[tuple[str, str], ...], nonce: str | None) -> Messages:
    if nonce is None:
        return messages
    (role, content), *rest = messages
    return [(role, f"[{nonce}] {content}"), *rest]


def _sample(pool: tuple, seed: int, load: int | float, phase: str, count: int) -> list:
    rng = random.Random(f"ladder:{seed}:{load}:{phase}")
    return rng.sample(pool, count) if count <= len(pool) else rng.choices(pool, k=count)


class Builder:
    """Builds bodies for one run: the options every request of the run shares."""

    def __init__(self, config: RunConfig, model: str, continuous: bool, nonce: str | None):
        self.config, self.model, self.continuous, self.nonce = config, model, continuous, nonce

    def body(self, req: Request) -> bytes:
        return request_body(with_nonce(req.messages, self.nonce), model=self.model, chat=self.config.chat,
                            max_tokens=req.max_tokens, temperature=self.config.temperature,
                            continuous_usage=self.continuous, ignore_eos=self.config.eos_ignored,
                            stream=self.config.stream, extra=self.config.body_extra)


async def prepare(config: RunConfig, ep: Endpoint) -> Workload:
    """Model, server capabilities and every request body, all before any clock starts."""
    kind, path = datasets.parse_spec(config.dataset)
    if kind != "random" and config.input_len is not None:
        raise SetupError(f"--input-len sizes random prompts; --dataset {kind} brings its own (see --max-input-len)")
    if config.max_input_len is not None and config.tokenizer is None:
        raise SetupError("--max-input-len counts prompt tokens: it needs --tokenizer")
    pool: tuple[datasets.DatasetRequest, ...] = ()
    dataset_info: dict = {"kind": kind}
    if kind != "random":  # read and filter the file before touching the server
        data = datasets.load(kind, path)
        tok = prompts.load_tokenizer(config.tokenizer) if config.tokenizer is not None else None
        count = (lambda text: len(tok.encode(text, add_special_tokens=False).ids)) if tok else None
        pool = datasets.select(data, count, config.output_len, config.max_input_len)
        dataset_info = {"kind": kind, "source": data.source, "num_records": data.num_records,
                        "num_usable": len(pool), "max_input_len": config.max_input_len}

    models = await ep.models()
    if not models and not config.model:
        raise SetupError("/v1/models lists no model; pass --model")
    model = config.model or models[0]["id"]
    info = next((m for m in models if m.get("id") == model), {})
    server_engine = engine_info.from_server(info, await ep.optional_text("/metrics"),
                                            await ep.optional_json("/props"))
    nonce = secrets.token_hex(4) if config.cache_bust else None

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

    input_len = config.input_len or DEFAULT_INPUT_LEN
    words = (max(16, input_len), max(8, input_len // 2))
    first_text = prompts.words_text(rng, words[0] if kind == "random" else 8)  # a dataset's probe checks usage only
    probe_fit: dict | None = None
    max_model_len = server_engine.get("max_model_len")
    limit = PROBE_FIT_SHARE * (max_model_len - 1) if isinstance(max_model_len, int) else None  # 1 token out
    if kind == "random" and limit is not None and len(first_text.encode()) > limit:
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
    if kind == "random":
        if config.tokenizer is not None:
            # NOTE: --input-len is the server's prompt_tokens in both modes, so the tokenizer sizes the text
            # to input_len minus what the server adds around it (chat template, BOS, nonce), measured once
            # from the probe; a server without prompt usage is taken to add nothing.
            tok = prompts.load_tokenizer(config.tokenizer)
            overhead = 0
            if first.prompt_tokens is not None:
                overhead = first.prompt_tokens - len(tok.encode(first_text, add_special_tokens=False).ids)
            if input_len - overhead < 1:
                raise SetupError(f"--input-len {input_len} is below the server's prompt overhead of {overhead} tokens")
            sizer = prompts.tokenizer_sizer(tok, input_len - overhead)
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
            size_for = lambda n: prompts.calibrated_sizer(max(1, cal.words_for(n)))  # noqa: E731
            sizing = {"method": "probe", "words": num_words, **asdict(cal)}
        if probe_fit is not None:
            sizing["probe_fit"] = probe_fit  # the probes were shrunk to fit the server's max_model_len
        output_len = config.output_len or DEFAULT_OUTPUT_LEN

        dist = LengthDist(config.length_dist, config.range_ratio)

        def requests(load: int | float, phase: str, count: int) -> list[Request]:
            if not config.range_ratio:
                texts = prompts.rung_prompts(config.seed, load, phase, count, sizer)
                return [Request((("user", t),), output_len) for t in texts]
            rng = random.Random(f"ladder-lengths:{config.seed}:{load}:{phase}")
            lengths = [(dist.draw(rng, input_len, 1), dist.draw(rng, output_len, 2)) for _ in range(count)]
            text_rng = random.Random(f"ladder:{config.seed}:{load}:{phase}")
            return [Request((("user", size_for(n_in)(text_rng)),), n_out) for n_in, n_out in lengths]
    else:
        def requests(load: int | float, phase: str, count: int) -> list[Request]:
            return [Request(r.messages, r.output_len) for r in _sample(pool, config.seed, load, phase, count)]

    build = Builder(config, model, continuous, nonce)
    rungs = {}
    for load in config.loads:
        measured = requests(load, "measured", config.num_prompts(load))
        warmup = requests(load, "warmup", config.num_warmup(load))
        rungs[load] = RungWorkload(warmup, measured, [build.body(r) for r in warmup],
                                   [build.body(r) for r in measured], request_hash(measured))
    return Workload(model, info, server_engine, continuous, sizing, dataset_info, nonce, rungs)
