"""--dataset trace:FILE, a timed Mooncake trace replayed as one open-loop rung against a real
`refengine serve --model tiny-qwen3`: every request at its timestamp over --trace-speedup, its prompt built
of its hash ids' 512-token blocks, so that requests naming the same ids share those blocks in the server's
prefix cache. Bad traces are one-line errors."""

import json
import sys
from pathlib import Path

import pytest
from ladder_harness import load_records, load_rungs

from ladder.cli import main

REFENGINE = Path(sys.executable).parent / "refengine"
TRACE = [  # request 1 shares block 7 with request 0; request 2 is request 0 again; request 3 shares nothing
    {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
    {"timestamp": 1100, "input_length": 600, "output_length": 3, "hash_ids": [7, 9]},
    {"timestamp": 1200, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
    {"timestamp": 1300, "input_length": 300, "output_length": 4, "hash_ids": [10]},
]


def write_trace(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_a_trace_replays_at_its_timestamps_and_its_shared_blocks_hit_the_cache(ladder, tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl", TRACE)
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 2"
    # One request in flight at a time: each finds the blocks of the ones before it published.
    code, out, err, run = ladder("--serve-cmd", cmd, "--dataset", f"trace:{trace}", "--trace-speedup", "2",
                                 "--max-concurrency", "1")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    # the trace is the rung: its 4 requests, no warmup, keyed by its mean rate (3 gaps in 0.15 s)
    assert (rung["status"], rung["num_ok"], rung["num_measured"], rung["request_rate"]) == ("OK", 4, 4, 20.0)
    records = load_records(run)
    assert [r["phase"] for r in records] == ["measured"] * 4
    # due at the timestamps, from the first, over the speedup
    due = [r["t_due"] - records[0]["t_due"] for r in records]
    assert due == pytest.approx([0.0, 0.05, 0.1, 0.15], abs=1e-5)
    assert [(r["max_tokens"], r["output_tokens"]) for r in records] == [(3, 3), (3, 3), (3, 3), (4, 4)]
    for rec, line in zip(records, TRACE):  # sized to input_length as the server counts it
        assert abs(rec["prompt_tokens"] - line["input_length"]) <= 0.1 * line["input_length"], rec
    cached = [r["cached_tokens"] for r in records]
    assert cached[1] >= 480 and cached[2] >= 560, cached  # block 7, then blocks 7 and 8, from the cache
    assert cached[3] < 64, cached  # block 10 is new: only the tag and the template are shared
    assert rung["prefix_cache"]["hits"] >= sum(cached) > 0, rung["prefix_cache"]  # /metrics agrees
    trace_info = json.loads((run / "manifest.json").read_text())["workload"]["trace"]
    assert (trace_info["num_requests"], trace_info["speedup"], trace_info["span_s"]) == (4, 2.0, 0.15)


LINE = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


@pytest.mark.parametrize(("lines", "args", "message"), [
    (None, [], "--dataset trace: cannot read"),
    (["{not json"], [], "trace.jsonl:1: not JSON"),
    ([LINE, {"timestamp": 5, "input_length": 600}], [], "trace.jsonl:2: expected an object with timestamp, "
                                                         "input_length, output_length, hash_ids"),
    ([{**LINE, "timestamp": -1}], [], "timestamp must be a number of milliseconds >= 0, got -1"),
    ([{**LINE, "output_length": 0}], [], "output_length must be a positive integer, got 0"),
    ([{**LINE, "hash_ids": [1, "x"]}], [], "hash_ids must be a list of integers"),
    ([{**LINE, "hash_ids": [1]}], [], "input_length 600 takes 2 blocks of 512 tokens, but hash_ids names 1"),
    ([], [], "holds no request"),
    ([LINE], ["--trace-speedup", "0"], "Invalid value for '--trace-speedup': 0.0 is not in the range x>0."),
    ([LINE], ["--trace-speedup", "-1"], "Invalid value for '--trace-speedup': -1.0 is not in the range x>0."),
    ([LINE], ["--c", "2"], "a trace sets its own requests and arrival times: drop --c"),
    ([LINE], ["--multi-turn", "2"], "drop --multi-turn"),
], ids=["missing", "not-json", "missing-field", "negative-time", "zero-output", "bad-ids", "ids-vs-length",
        "empty", "speedup-0", "speedup-negative", "c", "multi-turn"])
def test_bad_trace_input_is_a_one_line_error(lines, args, message, capsys, tmp_path):
    trace = tmp_path / "trace.jsonl"
    if lines is not None:
        write_trace(trace, lines)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), "--dataset", f"trace:{trace}",
              *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ladder: error: ") and message in err, err


def test_trace_speedup_without_a_trace_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--trace-speedup", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == "ladder: error: --trace-speedup applies only with --dataset trace:PATH\n"
