"""The ladder's options searched (issue 56): redaction over every form a secret can take in a server command,
trace replay over shuffled and tied timestamps, the sweep's search and the repeats' arithmetic at their
limits, the like-for-like guard over every workload kind, and /metrics ratios over intervals where nothing
was drafted, accepted, queried or hit."""

import asyncio
import json
import math
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import strategies as st
from run_fixtures import WORKLOAD, ok, write_run

from ladder.guard import workload_differences
from ladder.metrics import SPEC_COUNTERS, spec_acceptance
from ladder.redact import REDACTED, redact, redact_cmd, secrets_in
from ladder.repeats import interval
from ladder.runs import load_runs
from ladder.scrape import COUNTERS, Sample, per_interval
from ladder.search import RATE_RESOLUTION, highest
from ladder.trace import read_trace
from tests.property_budget import property_tests

# ---- redaction ---------------------------------------------------------------------------------------
SECRET_FLAGS = ["api-key", "api_key", "hf-token", "token", "secret", "password", "auth-token", "openai-api-key",
                "credentials", "HF_TOKEN"]
# a secret's characters: what keys and tokens are made of (base64url, hex, sk-... prefixes, : and / in some)
VALUES = st.text(string.ascii_letters + string.digits + "-_.+/:=@", min_size=6, max_size=24).map(lambda s: "S3k" + s)
FORMS = {
    "--flag V": "--{name} {value}",
    "--flag=V": "--{name}={value}",
    "-f V": "-{name} {value}",
    "--flag 'V'": "--{name} '{value}'",
    '--flag="V"': '--{name}="{value}"',
    "environment": "{env}={value}",
    "exported environment": "export {env}={value};",
    "--flag=-V": "--{name}={value}",  # the value starts with "-" (base64url keys may)
    "header": '-H "Authorization: Bearer {value}"',
    "header flag": "--header 'X-Api-Key: {value}'",
    "URL userinfo": "--endpoint http://bench:{value}@127.0.0.1:8000/v1",
}
# what must come through untouched: flags whose names merely contain a secret's word
PLAIN = "--max-tokens 5 --tokenizer tok/v1 --num-keys 3 --port 8000"


def check_every_form_of_a_secret_is_redacted(counts, form, name, value, before):
    """The value never reaches the recorded command or the server's log; the plain flags stay as they were."""
    env = name.upper().replace("-", "_")
    value = "-" + value if form == "--flag=-V" else value
    secret = FORMS[form].format(name=name, value=value, env=env)
    cmd = f"{secret} vllm serve m {PLAIN}" if before else f"vllm serve m {PLAIN} {secret}"
    recorded = redact_cmd(cmd)
    assert value not in recorded and REDACTED in recorded, recorded
    assert PLAIN in recorded
    log = f"INFO args: {cmd}\nINFO key {value} loaded"
    assert value not in redact(log, secrets_in(cmd))
    counts[form] += 1


test_every_form_of_a_secret_is_redacted, test_every_form_of_a_secret_is_redacted_slow = (
    pytest.mark.parametrize("form", list(FORMS))(t) for t in property_tests(
        check_every_form_of_a_secret_is_redacted, 8, 100,
        name=st.sampled_from(SECRET_FLAGS), value=VALUES, before=st.booleans(),
    )
)  # fmt: skip


# ---- trace replay ------------------------------------------------------------------------------------
trace_lines = st.lists(
    st.fixed_dictionaries({
        "timestamp": st.sampled_from([0, 0, 5, 250.5, 1000, 1000, 7000]),  # ties on purpose
        "input_length": st.integers(1, 1100),
        "output_length": st.integers(1, 64),
    }),
    min_size=1, max_size=12,
)  # fmt: skip


def check_a_replay_is_in_time_order_whatever_the_file_order(counts, lines, order, speedup):
    """Read from a file in any order, with ties: each request is due at its own time after the first's,
    in order, none before the start; the mean rate is (n - 1) / span, inf when all are due at once."""
    for i, line in enumerate(lines):
        line["hash_ids"] = list(range(i * 10, i * 10 + math.ceil(line["input_length"] / 512)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        rows = order.sample(lines, len(lines))
        path.write_text("".join(json.dumps(line) + "\n" for line in rows))
        trace = read_trace(path)
    due = trace.due_times(speedup)
    first = min(line["timestamp"] for line in lines)
    assert due == sorted(due) and due[0] == 0.0
    assert sorted(due) == sorted((line["timestamp"] - first) / 1e3 / speedup for line in lines)
    # each request keeps its own blocks: the file's rows, reordered
    assert sorted(r.hash_ids for r in trace.requests) == sorted(tuple(line["hash_ids"]) for line in rows)
    # tied requests keep the file's order (the replay sends them at one instant, in that order)
    file_order = [tuple(x["hash_ids"]) for x in rows]
    for a, b in zip(trace.requests, trace.requests[1:]):
        if a.timestamp_ms == b.timestamp_ms:
            assert file_order.index(a.hash_ids) < file_order.index(b.hash_ids)
            counts["ties"] += 1
    span = due[-1]
    assert trace.mean_rate(speedup) == ((len(lines) - 1) / span if span > 0 else math.inf)
    counts["out of order"] += [line["timestamp"] for line in rows] != sorted(line["timestamp"] for line in rows)


test_a_replay_is_in_time_order_whatever_the_file_order, test_a_replay_is_in_time_order_whatever_the_file_order_slow = property_tests(
    check_a_replay_is_in_time_order_whatever_the_file_order, 40, 400, variants=("ties", "out of order"),
    lines=trace_lines, order=st.randoms(use_true_random=False), speedup=st.sampled_from([0.5, 1.0, 3.0]),
)  # fmt: skip


# ---- the sweep's search and the repeats' arithmetic, at their limits -----------------------------------
def check_the_search_finds_the_capacity_within_its_limit(counts, capacity, start, limit, integer):
    """A load passes when it is at most `capacity` (a capacity search's one assumption). The search never
    runs a load past its limit or twice, and answers the highest load that passes, to one concurrency or
    within the rate resolution; None when even the start fails; the limit itself when it passes."""
    if integer:
        capacity, start, limit = int(capacity), max(1, int(start)), max(1, int(limit))

    async def passes(load: float) -> bool:
        return load <= capacity

    result = asyncio.run(highest(passes, start, limit, integer))
    loads = [load for load, _ in result.tried]
    assert len(set(loads)) == len(loads) and max(loads) <= limit
    first = min(start, limit)
    if capacity < first:
        assert result.answer is None
        counts["start fails"] += 1
    elif capacity >= limit:
        assert result.answer == limit
        counts["limit reached"] += 1
    else:
        assert result.answer <= capacity
        assert (capacity - result.answer < 1) if integer else (capacity - result.answer <= RATE_RESOLUTION * result.answer)
        counts["bisected"] += 1


test_the_search_finds_the_capacity_within_its_limit, test_the_search_finds_the_capacity_within_its_limit_slow = property_tests(
    check_the_search_finds_the_capacity_within_its_limit, 60, 600,
    variants=("start fails", "limit reached", "bisected"),
    capacity=st.floats(0.1, 300), start=st.sampled_from([1, 1, 2, 3.5]), limit=st.floats(1, 256),
    integer=st.booleans(),
)  # fmt: skip


def check_the_repeats_interval_holds_at_its_limits(counts, values):
    """Any number of repeats, equal values, zeros: the mean lies in the values' range, the interval around
    it (none for one repeat), the coefficient of variation None only where the mean is 0."""
    ci = interval(values)
    assert ci["n"] == len(values) and min(values) - 1e-9 <= ci["mean"] <= max(values) + 1e-9
    if len(values) == 1:
        assert ci["ci95"] is None and ci["half_width"] is None
        counts["one repeat"] += 1
    else:
        lo, hi = ci["ci95"]
        assert ci["half_width"] >= 0 and lo <= ci["mean"] <= hi
        counts["beyond the t table"] += len(values) > 31
    assert (ci["cv"] is None) == (ci["mean"] == 0)
    counts["equal"] += len(set(values)) == 1 and len(values) > 1


test_the_repeats_interval_holds_at_its_limits, test_the_repeats_interval_holds_at_its_limits_slow = property_tests(
    check_the_repeats_interval_holds_at_its_limits, 60, 600, variants=("one repeat", "beyond the t table", "equal"),
    values=st.one_of(
        st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=1, max_size=40),
        st.lists(st.floats(0, 1e4), min_size=1, max_size=40),
        st.lists(st.floats(0, 1e4), min_size=30, max_size=40),
    ),
)  # fmt: skip


# ---- the like-for-like guard over every workload kind ----------------------------------------------------
KINDS = {
    "random": {},
    "sharegpt": {"dataset": {"kind": "sharegpt", "num_records": 100, "max_input_len": 1024}},
    "trace": {"dataset": {"kind": "trace"}, "trace": {"speedup": 1.0, "schedule": "h-trace"}},
    "multi-turn": {"multi_turn": {"turns": 3, "reply": "full"}},
    "request rate": {"load": {"request_rate": [1.0, 2.0], "burstiness": 1.0, "max_concurrency": None}},
    "length distribution": {"length_dist": {"kind": "uniform", "range_ratio": 0.5}},
}
# a change to one key of a workload, and the name the guard gives its difference
CHANGES = {
    "seed": (lambda w: w | {"seed": 1}, "seed"),
    "output_len": (lambda w: w | {"output_len": 65}, "output_len"),
    "sampling": (lambda w: w | {"sampling": w["sampling"] | {"temperature": 0.7}}, "sampling"),
    "multi_turn": (lambda w: w | {"multi_turn": {"turns": 4, "reply": "full"}}, "multi_turn"),
    "trace": (lambda w: w | {"trace": {"speedup": 2.0, "schedule": "h-trace"}}, "trace"),
    "dataset": (lambda w: w | {"dataset": {"kind": "sharegpt", "num_records": 7}}, "dataset"),
    "load kind": (lambda w: w | {"load": {"concurrency": [1]} if "request_rate" in (w.get("load") or {})
                                 else {"request_rate": [1.0]}}, "load"),
}


def check_the_guard_sees_each_workload_difference(counts, kind, changes):
    """Two runs of one workload of any kind compare; changing any key the guard keeps, alone or with
    others, makes it name each of them."""
    workload = WORKLOAD | KINDS[kind]
    with tempfile.TemporaryDirectory() as tmp:
        same = load_runs([write_run(Path(tmp), label, [ok(1, 100.0)], workload=workload) for label in ("a", "b")])
        assert workload_differences(same) == []
        for i, together in enumerate([*([c] for c in sorted(CHANGES)), sorted(changes)]):
            changed = workload
            for change in together:
                changed = CHANGES[change][0](changed)
            runs = load_runs([write_run(Path(tmp), f"c{i}", [ok(1, 100.0)], workload=workload),
                              write_run(Path(tmp), f"d{i}", [ok(1, 100.0)], workload=changed)])
            found = [d.key for d in workload_differences(runs)]
            moved = [CHANGES[c][1] for c in together if CHANGES[c][0](workload) != workload]
            assert set(moved) <= set(found), (kind, together, found)
    counts[kind] += 1


_kinds = sorted(KINDS)
test_the_guard_sees_each_workload_difference, test_the_guard_sees_each_workload_difference_slow = (
    pytest.mark.parametrize("kind", _kinds)(t) for t in property_tests(
        check_the_guard_sees_each_workload_difference, 4, 40,
        changes=st.sets(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=3),
    )
)  # fmt: skip


# ---- /metrics ratios over intervals where nothing moved ----------------------------------------------
@st.composite
def counter_samples(draw) -> list[Sample]:
    """Samples of monotone counters whose increases are often zero: intervals with nothing drafted, nothing
    accepted, nothing queried or nothing hit."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    samples = [Sample(0, 0.0, dict(totals))]
    for tick in range(1, draw(st.integers(1, 8))):
        drafted, queried = draw(st.sampled_from([0, 0, 3, 8])), draw(st.sampled_from([0, 0, 16, 64]))
        totals["spec_draft_tokens"] += drafted
        totals["spec_accepted_tokens"] += draw(st.integers(0, drafted))
        totals["prefix_cache_queries"] += queried
        totals["prefix_cache_hits"] += draw(st.sampled_from([0, queried // 2, queried]))
        totals["preemptions"] += draw(st.integers(0, 1))
        samples.append(Sample(tick, float(tick), dict(totals)))
    return samples


def check_ratios_of_increases_hold_with_zeros(counts, samples):
    """An interval with a zero denominator has no ratio (never 0, never a division by zero); one with a zero
    numerator over a moving denominator has ratio 0; every ratio lies in [0, 1] and is its two increases'."""
    series = per_interval(samples)
    for rate, (num, den) in {"spec_acceptance_rate": ("spec_accepted_tokens", "spec_draft_tokens"),
                             "prefix_cache_hit_rate": ("prefix_cache_hits", "prefix_cache_queries")}.items():
        expected = []
        for prev, cur in zip(samples, samples[1:]):
            d_num, d_den = cur.values[num] - prev.values[num], cur.values[den] - prev.values[den]
            if d_den:
                expected.append(d_num / d_den)
                counts["zero numerator"] += d_num == 0
            else:
                counts["zero denominator"] += 1
        assert series[rate] == expected
    before = {name: 0.0 for name in SPEC_COUNTERS}
    after = {name: samples[-1].values["spec_draft_tokens"] if "draft" in name else 0.0 for name in SPEC_COUNTERS}
    after["vllm:spec_decode_num_accepted_tokens"] = samples[-1].values["spec_accepted_tokens"]
    phase = spec_acceptance(before, after)
    if samples[-1].values["spec_draft_tokens"] == 0:
        assert phase is None
    else:
        assert 0.0 <= phase.acceptance_rate <= 1.0


test_ratios_of_increases_hold_with_zeros, test_ratios_of_increases_hold_with_zeros_slow = property_tests(
    check_ratios_of_increases_hold_with_zeros, 60, 600, variants=("zero numerator", "zero denominator"),
    samples=counter_samples(),
)  # fmt: skip
