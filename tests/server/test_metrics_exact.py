"""/metrics after a known workload on the real engine, served by the app and HTTP server `refengine
serve` runs, with ngram drafting on repetitive prompts, so that accepted drafts make steps emit several
tokens at once:
- every counter equals what the clients saw (tokens streamed or returned, usage, finish reasons), and
  the spec-decode counters equal the engine's own per-step records (the step recorder);
- every exported family has the type, unit, range and labels of vLLM's definition (the table below).

The engine runs in this process so that its step records can be read; one server serves the module."""

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, fields

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from real_server import serve_real, tiny_engine, wait_for_idle_pool
from sse_client import parse_events, streamed_token_ids

from refengine.engine.outputs import EngineInfo
from refengine.spec_decode.config import SpeculativeConfig

K = 3
NGRAM = SpeculativeConfig.from_json(f'{{"method": "ngram", "num_speculative_tokens": {K}}}')
PROMPTS = ["one two three one two three one two three", "the cat sat the cat sat the cat sat", "1 2 3 4 1 2 3 4 1 2 3 4"]
MODEL_LABEL = "tiny-qwen3"


@dataclass(frozen=True)
class Seen:
    """One request as its client saw it."""

    request_id: str
    token_ids: list[int]
    largest_delta: int  # the most tokens one chunk carried (the whole answer when not streamed)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    latency_s: float
    spec: dict | None  # usage.speculative_decoding


async def send(client: httpx.AsyncClient, i: int, stop_token: int | None) -> Seen:
    chat, stream = i % 2 == 0, i % 4 < 2
    prompt = PROMPTS[i % len(PROMPTS)]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict = {"max_tokens": 60 + 10 * i, "return_token_ids": True, "ignore_eos": True, "temperature": 0.0}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    if i % 3 == 2:
        body |= {"temperature": 0.8, "seed": i}
    if stop_token is not None:
        body |= {"stop_token_ids": [stop_token], "max_tokens": 200}
    start = time.perf_counter()
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            events, done = parse_events((await response.aread()).decode())
        latency = time.perf_counter() - start
        assert done
        ids = streamed_token_ids(events)
        largest = max(len(c.get("token_ids", [])) for e in events for c in e["choices"])
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        usage, request_id = events[-1]["usage"], events[0]["id"]
        (finish_reason,) = finish
    else:
        response = await client.post(path, json=body)
        latency = time.perf_counter() - start
        assert response.status_code == 200, response.text
        answer = response.json()
        ids, usage, request_id = answer["choices"][0]["token_ids"], answer["usage"], answer["id"]
        largest, finish_reason = len(ids), answer["choices"][0]["finish_reason"]
    return Seen(request_id, ids, largest, usage["prompt_tokens"], usage["completion_tokens"], finish_reason, latency,
                usage.get("speculative_decoding"))


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def workload():
    """The known workload: a greedy probe, then 8 requests 4 at a time (chat and completions, streamed
    and whole, greedy and seeded), two of them stopped by a token the probe showed comes up. /metrics
    is scraped throughout, so the gauges are seen while the pool is in use."""
    engine = tiny_engine(speculative_config=NGRAM, record_steps=True)
    with serve_real(engine) as url:

        async def run():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                probe = await send(client, 1, None)
                stop_token = probe.token_ids[12]
                tasks = [asyncio.create_task(send(client, i, stop_token if i in (3, 4) else None)) for i in range(8)]
                busy = []
                while not all(t.done() for t in tasks):
                    busy.append((await client.get("/metrics")).text)
                    await asyncio.sleep(0.02)
                return [probe, *[t.result() for t in tasks]], busy

        seen, scrapes = asyncio.run(run())
        wait_for_idle_pool(url)
        final = httpx.get(f"{url}/metrics").text
        records = {s.request_id: engine.engine.step_recorder.take_step_records(s.request_id) for s in seen}
    return seen, scrapes, final, records


def value(fams: dict, name: str, part: str = "", **labels: str) -> float:
    """A sample's value: a gauge's, a counter's (its sample carries the _total suffix), or a histogram's
    `part` (_sum, _count)."""
    names = (name + part,) if part else (name, name + "_total")
    (sample,) = [
        s for s in fams[name].samples if s.name in names and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sample.value


def test_counters_equal_what_the_clients_saw_with_multi_token_steps(workload):
    seen, _, final, records = workload
    fams = families(final)
    # Drafts were accepted and a delta carried several tokens: otherwise this test proves nothing.
    assert max(s.largest_delta for s in seen if s.largest_delta < len(s.token_ids)) > 1
    for s in seen:
        assert len(s.token_ids) == s.completion_tokens, s
    assert value(fams, "vllm:generation_tokens") == sum(len(s.token_ids) for s in seen)
    assert value(fams, "vllm:prompt_tokens") == sum(s.prompt_tokens for s in seen)
    reasons = Counter(s.finish_reason for s in seen)
    assert set(reasons) == {"length", "stop"}
    for reason, count in reasons.items():
        assert value(fams, "vllm:request_success", finished_reason=reason) == count, reason
    steps = [r for rs in records.values() for r in rs]
    assert value(fams, "vllm:spec_decode_num_drafts") == len(steps)
    assert value(fams, "vllm:spec_decode_num_draft_tokens") == sum(len(r.draft_token_ids) for r in steps)
    accepted = sum(r.num_accepted for r in steps)
    assert accepted > 0
    assert value(fams, "vllm:spec_decode_num_accepted_tokens") == accepted
    longest = max(len(r.draft_token_ids) for r in steps)
    for position in range(longest):
        at_position = sum(r.num_accepted > position for r in steps)
        assert value(fams, "vllm:spec_decode_num_accepted_tokens_per_pos", position=str(position)) == at_position


def test_each_requests_usage_carries_its_own_drafts_and_their_sum_is_metrics(workload):
    """usage.speculative_decoding (vLLM's per-request names) on every request, streamed and whole, chat and
    completions: its counts are the request's own steps (the step recorder), and over all requests they sum
    to /metrics' spec-decode counters, position by position."""
    seen, _, final, records = workload
    fams = families(final)
    assert all(s.spec is not None for s in seen), [s.request_id for s in seen if s.spec is None]
    for s in seen:
        steps, spec = records[s.request_id], s.spec
        accepted = [r.num_accepted for r in steps]
        assert spec["num_spec_steps"] == len(steps) and spec["num_accepted_draft_tokens"] == sum(accepted), s
        assert spec["num_draft_tokens"] == sum(len(r.draft_token_ids) for r in steps), s
        assert spec["acceptance_histogram"] == [accepted.count(j) for j in range(spec["num_spec_tokens"] + 1)], s
        assert spec["num_accepted_tokens_per_pos"] == [sum(a > p for a in accepted) for p in range(spec["num_spec_tokens"])]
        assert math.isclose(spec["mean_acceptance_length"], 1 + sum(accepted) / len(steps))
        assert math.isclose(spec["draft_acceptance_rate"], sum(accepted) / spec["num_draft_tokens"])
    for field, counter in (("num_spec_steps", "vllm:spec_decode_num_drafts"),
                           ("num_draft_tokens", "vllm:spec_decode_num_draft_tokens"),
                           ("num_accepted_draft_tokens", "vllm:spec_decode_num_accepted_tokens")):
        assert sum(s.spec[field] for s in seen) == value(fams, counter), field
    for position in range(K):
        total = sum(s.spec["num_accepted_tokens_per_pos"][position] for s in seen
                    if position < len(s.spec["num_accepted_tokens_per_pos"]))
        assert total == value(fams, "vllm:spec_decode_num_accepted_tokens_per_pos", position=str(position))


@dataclass(frozen=True)
class Family:
    """vLLM's definition of one metric family: its Prometheus type, labels besides model_name, and
    what its values are (the range every sample must lie in)."""

    type: str
    labels: tuple[str, ...] = ()
    low: float = 0.0
    high: float = math.inf
    integral: bool = True


# vLLM's metric definitions (vllm/v1/metrics/loggers.py), and refengine's own under refengine:.
FAMILIES = {
    "vllm:num_requests_running": Family("gauge"),
    "vllm:num_requests_waiting": Family("gauge"),
    # A fraction, despite the name: 1 means the pool is full.
    "vllm:kv_cache_usage_perc": Family("gauge", high=1.0, integral=False),
    "vllm:prompt_tokens": Family("counter"),
    "vllm:generation_tokens": Family("counter"),
    "vllm:num_preemptions": Family("counter"),
    "vllm:request_success": Family("counter", ("finished_reason",)),
    "vllm:spec_decode_num_drafts": Family("counter"),
    "vllm:spec_decode_num_draft_tokens": Family("counter"),
    "vllm:spec_decode_num_accepted_tokens": Family("counter"),
    # One series per draft position, numbered from 0.
    "vllm:spec_decode_num_accepted_tokens_per_pos": Family("counter", ("position",)),
    # Prefix caching, in tokens: queries are the admitted prompts' tokens, hits those found cached.
    "vllm:prefix_cache_queries": Family("counter"),
    "vllm:prefix_cache_hits": Family("counter"),
    # Latencies in seconds.
    "vllm:time_to_first_token_seconds": Family("histogram", integral=False),
    "vllm:e2e_request_latency_seconds": Family("histogram", integral=False),
    "refengine:kv_cache_free_blocks": Family("gauge"),
    "refengine:kv_cache_total_blocks": Family("gauge"),
    "refengine:spec_decode_num_grammar_cut_tokens": Family("counter"),
    "refengine:drafter_random_init": Family("gauge", high=1.0),
    "refengine:engine_dead": Family("gauge", high=1.0),
    "refengine:prefix_cache_evictions": Family("counter"),
    # How the engine was configured: one series of value 1, labelled with EngineInfo's fields and the build
    # (refengine.version) (the text format spells an info family as a gauge named *_info).
    "refengine:engine_info": Family("gauge", (*(f.name for f in fields(EngineInfo)), "version"), low=1.0, high=1.0),
    # vLLM's KV cache configuration (vllm/config/cache.py's metrics_info), one series of value 1
    "vllm:cache_config_info": Family("gauge", ("cache_dtype", "block_size", "num_gpu_blocks", "enable_prefix_caching"),
                                     low=1.0, high=1.0),
    "refengine:request_failure": Family("counter"),
    "refengine:request_rejected": Family("counter", ("reason",)),
    "refengine:request_aborted": Family("counter", ("reason",)),
    "refengine:requests_in_flight": Family("gauge"),
}
LABEL_VALUES = {
    "finished_reason": {"stop", "length", "abort"},
    "position": {str(p) for p in range(K)},
    "reason": {"queue_full", "shutting_down", "client_disconnect", "timeout", "shutdown"},
}


# prometheus_client exports, beside each Counter and Histogram it keeps, a *_created gauge: the Unix time
# the series began (the collector-made counters have none). The table names those series too.
CREATED = {"vllm:request_success", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"}


def check_families(text: str) -> dict:
    fams = families(text)
    table = {**FAMILIES, **{f"{n}_created": Family("gauge", FAMILIES[n].labels, integral=False) for n in CREATED}}
    assert set(fams) == set(table), "an exported family is missing from the table, or the other way round"
    for name, fam in fams.items():
        want = table[name]
        assert fam.type == want.type, name
        for sample in fam.samples:
            labels = dict(sample.labels)
            assert labels.pop("model_name") == MODEL_LABEL, sample
            if want.type == "histogram":
                labels.pop("le", None)
            else:
                assert want.low <= sample.value <= want.high, sample
                assert not want.integral or sample.value == int(sample.value), sample
            assert set(labels) == set(want.labels), sample
            for label, label_value in labels.items():
                assert label_value in LABEL_VALUES.get(label, {label_value}), sample
    return fams


def test_every_family_has_vllms_type_unit_range_and_labels(workload):
    seen, scrapes, final, _ = workload
    busy = 0
    for text in [*scrapes, final]:
        fams = check_families(text)
        usage = value(fams, "vllm:kv_cache_usage_perc")
        free, total = value(fams, "refengine:kv_cache_free_blocks"), value(fams, "refengine:kv_cache_total_blocks")
        assert usage == pytest.approx(1 - free / total), "kv_cache_usage_perc is not the used fraction of the pool"
        busy += usage > 0 and value(fams, "vllm:num_requests_running") > 0
    assert busy, "no scrape saw the pool in use"
    fams = check_families(final)
    positions = {s.labels["position"] for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert "0" in positions
    # Seconds: the server's time for a request lies within the time its client waited for it.
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert value(fams, name, "_count") == len(seen)
        assert 0 < value(fams, name, "_sum") <= sum(s.latency_s for s in seen), name
