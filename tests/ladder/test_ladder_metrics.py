"""Every metric formula, checked exactly against hand-computed values from fed timestamps."""

import json

import pytest

from ladder.client import _on_event
from ladder.metrics import (
    parse_counters,
    request_fields,
    request_metrics,
    rung_stats,
    spec_acceptance,
    summarize,
    token_itls,
)
from ladder.records import RequestRecord, failure, output_tokens


def rec(t_send, times, n, *, usage=(), prompt=None, t_end=None, done=True) -> RequestRecord:
    return RequestRecord(concurrency=1, phase="measured", index=0, t_send=t_send, chunk_times=list(times),
                         chunk_usage=list(usage), completion_tokens=n, prompt_tokens=prompt,
                         t_end=t_end if t_end is not None else times[-1], done=done)


def test_single_token_chunks():
    m = request_metrics(rec(10.0, [10.5, 10.75, 11.0, 11.5], 4))
    assert m.ttft == 0.5
    assert m.e2e == 1.5
    assert m.tpot == (1.5 - 0.5) / 3
    assert m.chunk_gaps == [0.25, 0.25, 0.5]
    assert m.tokens_per_chunk == 1.0
    assert m.token_itls is None  # no continuous usage


def test_multi_token_chunks_split_gaps_per_token():
    m = request_metrics(rec(0.0, [1.0, 1.375, 1.625], 8, usage=[3, 6, 8]))
    assert m.ttft == 1.0
    assert m.e2e == 1.625
    assert m.tpot == 0.625 / 7  # pinned (E2E - TTFT) / (N - 1), even when the first chunk has 3 tokens
    assert m.chunk_gaps == [0.375, 0.25]
    assert m.tokens_per_chunk == 8 / 3
    assert m.token_itls == [0.125] * 5


def test_token_itl_carries_the_gap_of_a_chunk_whose_usage_did_not_advance():
    assert token_itls([0.0, 0.25, 0.75], [2, 2, 6]) == [0.1875] * 4


def test_one_token_has_no_tpot():
    m = request_metrics(rec(0.0, [0.5], 1))
    assert m.tpot is None and m.chunk_gaps == [] and m.e2e == m.ttft == 0.5


def test_summary_mean_and_linear_percentiles():
    s = summarize([1.0, 2.0, 3.0, 4.0], [50, 90, 99], scale=1e3)
    assert s.mean == 2500.0
    assert s.percentiles == {"p50": 2500.0, "p90": pytest.approx(3700.0), "p99": pytest.approx(3970.0)}


def test_rung_stats_exact():
    a = rec(0.0, [1.0, 2.0, 3.0], 3, prompt=10, t_end=3.5)
    b = rec(1.0, [1.5, 2.0, 2.5, 3.0, 3.5], 10, prompt=20, t_end=4.0)
    s = rung_stats([a, b], [50, 90])
    assert s.num_requests == 2
    assert s.duration_s == 4.0  # first send 0.0 -> last stream close 4.0
    assert s.request_throughput == 0.5
    assert s.output_throughput == 13 / 4
    assert s.total_throughput == (30 + 13) / 4
    assert s.per_user_tok_s == (1 / 1.0 + 1 / (2.0 / 9)) / 2  # median of 1/tpot over two requests
    assert (s.input_tokens.min, s.input_tokens.mean, s.input_tokens.max) == (10, 15.0, 20)
    assert (s.output_tokens.min, s.output_tokens.mean, s.output_tokens.max) == (3, 6.5, 10)
    assert s.ttft_ms.mean == 750.0 and s.ttft_ms.percentiles == {"p50": 750.0, "p90": 950.0}
    assert s.e2e_ms.mean == 2750.0
    assert s.tpot_ms.mean == pytest.approx((1000.0 + 2000.0 / 9) / 2)
    assert s.chunk_gap_ms.mean == pytest.approx((1000 * 2 + 500 * 4) / 6)  # pooled: long requests weigh more
    assert s.tokens_per_chunk.mean == (1.0 + 2.0) / 2
    assert s.itl_token_ms is None  # request a has no continuous usage


def test_per_user_rate_is_the_median_of_the_request_rates_not_their_mean():
    # tpot 1.0, 0.5 and 0.1 s: rates 1, 2 and 10 tok/s; median 2, mean 4.33 (two requests cannot tell them apart)
    records = [rec(0.0, [1.0, 1.0 + 9 * tpot], 10) for tpot in (1.0, 0.5, 0.1)]
    assert rung_stats(records, [50]).per_user_tok_s == pytest.approx(2.0)


def test_goodput_is_the_rate_of_requests_meeting_every_slo():
    fast = [rec(0.0, [0.1, 0.2, 0.3], 3, t_end=0.3), rec(0.0, [0.2, 0.3, 0.4], 3, t_end=4.0)]
    slow_first = rec(0.0, [0.6, 0.7, 0.8], 3, t_end=0.8)  # misses ttft:500
    slow_decode = rec(0.0, [0.1, 1.1, 2.1], 3, t_end=2.1)  # tpot 1000 ms misses tpot:100
    s = rung_stats([*fast, slow_first, slow_decode], [50], {"ttft": 500.0, "tpot": 100.0})
    assert s.goodput_fraction == 0.5 and s.goodput == 2 / 4.0  # two good requests over a 4 s window
    assert rung_stats(fast, [50]).goodput is None  # no --goodput, no number


def test_per_request_fields_come_from_the_rung_metric_functions_exactly():
    r = rec(10.0, [10.5, 10.75, 11.0, 11.5], 4)
    assert request_fields(r) == {"ttft_ms": 500.0, "tpot_ms": 1000.0 / 3, "e2e_ms": 1500.0,
                                 "itl_ms": [250.0, 250.0, 500.0], "output_tokens": 4}
    s = rung_stats([r], [50])
    assert (s.ttft_ms.mean, s.tpot_ms.mean, s.e2e_ms.mean) == (500.0, 1000.0 / 3, 1500.0)
    assert set(request_fields(None).values()) == {None}  # a failed request has no metrics


def test_rung_stats_without_prompt_usage_has_no_total_throughput():
    s = rung_stats([rec(0.0, [1.0, 2.0], 2)], [50])
    assert s.total_throughput is None and s.input_tokens is None


@pytest.mark.parametrize("r, allow, expected", [
    (rec(0, [1, 2], 2), False, None),
    (rec(0, [1, 2], None), False, "no_usage"),
    (rec(0, [1, 2], None), True, None),  # --allow-chunk-count: N = 2 chunks
    (rec(0, [1, 2], 3), False, "length_mismatch"),
    (rec(0, [1, 2], 2, done=False), False, "truncated"),
    (RequestRecord(1, "measured", 0, done=True), False, "zero_tokens"),
])
def test_failure_rules(r, allow, expected):
    got = failure(r, output_len=2, ignore_eos=True, allow_chunk_count=allow)
    assert (got.split(":")[0] if got else None) == expected


def test_without_ignore_eos_a_natural_stop_is_fine_but_never_more_than_max_tokens():
    assert failure(rec(0, [1], 1), output_len=2, ignore_eos=False, allow_chunk_count=False) is None
    assert failure(rec(0, [1, 2], 1), output_len=2, ignore_eos=True, allow_chunk_count=False).startswith(
        "length_mismatch: 1 output tokens, 2 requested with ignore_eos")
    assert failure(rec(0, [1, 2, 3], 3), output_len=2, ignore_eos=False, allow_chunk_count=False) == (
        "length_mismatch: 3 output tokens, more than max_tokens 2")


def test_missing_usage_counts_chunks_only_when_allowed():
    assert output_tokens(rec(0, [1, 2, 3], None)) == 3


def events(*objs) -> list[bytes]:
    return [o if isinstance(o, bytes) else json.dumps(o).encode() for o in objs]


def test_role_only_prelude_is_not_the_first_token_and_usage_chunk_not_the_last():
    r = RequestRecord(1, "measured", 0)
    stream = events(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"reasoning_content": "hmm"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
        b"[DONE]")
    for t, e in enumerate(stream):
        _on_event(r, e, float(t), chat=True)
    assert r.chunk_times == [1.0, 2.0, 3.0]
    assert (r.prompt_tokens, r.completion_tokens, r.done, r.num_events) == (7, 3, True, 7)
    assert r.chunk_usage == []


def test_continuous_usage_is_recorded_per_token_bearing_chunk():
    r = RequestRecord(1, "measured", 0)
    u = lambda n: {"prompt_tokens": 5, "completion_tokens": n}  # noqa: E731
    for t, e in enumerate(events(
            {"choices": [{"text": ""}], "usage": u(0)}, {"choices": [{"text": "ab"}], "usage": u(2)},
            {"choices": [{"text": "c"}], "usage": u(3)}, {"choices": [], "usage": u(3)}, b"[DONE]")):
        _on_event(r, e, float(t), chat=False)
    assert r.chunk_times == [1.0, 2.0] and r.chunk_usage == [2, 3] and r.completion_tokens == 3


def test_in_stream_error_event_fails_the_request():
    r = RequestRecord(1, "measured", 0)
    _on_event(r, b'{"error": {"message": "engine stopped"}}', 0.0, chat=True)
    assert r.error == "stream_error: engine stopped"


def test_spec_acceptance_from_counter_deltas():
    text = ('# HELP vllm:spec_decode_num_drafts_total x\n# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{model_name="a"} 10\n'
            'vllm:spec_decode_num_drafts_total{model_name="b"} 20\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="a"} 120.0\n'
            'vllm:spec_decode_num_accepted_tokens_total 60 1700000000\n'
            'vllm:spec_decode_num_accepted_tokens_created 1.7e9\n')
    before = parse_counters(text)
    assert before == {"vllm:spec_decode_num_drafts_total": 30.0,
                      "vllm:spec_decode_num_draft_tokens_total": 120.0,
                      "vllm:spec_decode_num_accepted_tokens_total": 60.0}
    after = {"vllm:spec_decode_num_drafts_total": 50.0, "vllm:spec_decode_num_draft_tokens_total": 200.0,
             "vllm:spec_decode_num_accepted_tokens_total": 100.0}
    s = spec_acceptance(before, after)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (20.0, 80.0, 40.0)
    assert s.acceptance_rate == 0.5 and s.acceptance_length == 3.0
    assert spec_acceptance({}, after) is None
    assert spec_acceptance(after, after) is None  # no drafts in the window
