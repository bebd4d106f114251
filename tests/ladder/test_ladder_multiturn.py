"""--multi-turn sessions: each turn resends the session's history with the reply to every earlier turn, the
turns of a session go in order, sessions interleave up to c, and the metrics come by turn index as well.
Against a real `refengine serve --model tiny-qwen3` (its prefix cache serves the history: hits read from
/metrics and from each answer's cached_tokens) and against the scripted server (no cache counters: n/a)."""

import json
import re
import sys
from itertools import groupby
from pathlib import Path

import pytest
from ladder_harness import load_records, load_rungs

from ladder.cli import main

REFENGINE = Path(sys.executable).parent / "refengine"
BLOCK_SIZE = 16  # refengine serve's default KV block: the prefix cache hits in whole blocks
TAG = re.compile(r"Run( [a-z]{4}){6}\n")  # the cache-bust tag: "Run" and six four-letter words


def sessions(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """The records of each (phase, session), in the order they were written."""
    key = lambda r: (r["phase"], r["session"])  # noqa: E731
    return {k: list(g) for k, g in groupby(sorted(records, key=key), key=key)}


def compare(capsys, *runs: Path) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["compare", *map(str, runs)])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    return out


def test_sessions_resend_their_history_with_the_server_replies_and_hit_the_prefix_cache(ladder, capsys):
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 2"
    code, out, err, run = ladder("--serve-cmd", cmd, "--multi-turn", "3", "--c", "2", "--prompts-per-rung", "3",
                                 "--warmup", "1", "--input-len", "96", "--output-len", "4", "--seed", "3",
                                 "--save-text")
    assert code == 0, (out, err)
    records = load_records(run)
    by_session = sessions(records)
    # exact counts: 1 warmup session and 3 measured ones, each of exactly 3 turns, in turn order
    assert sorted(by_session) == [("measured", 0), ("measured", 1), ("measured", 2), ("warmup", 0)]
    assert all([r["turn"] for r in turns] == [1, 2, 3] for turns in by_session.values())
    assert all(r["error"] is None for r in records)
    tags = []
    for turns in by_session.values():
        for before, after in zip(turns, turns[1:]):
            assert after["t_send"] >= before["t_end"]  # a turn goes once the answer before it is complete
            # the history: the turn before, its real reply, then the new user message
            assert after["prompt"][:-2] == before["prompt"]
            assert after["prompt"][-2] == ["assistant", before["output_text"]] and after["prompt"][-1][0] == "user"
            # the server's cache serves every whole block of the turn before
            assert after["cached_tokens"] >= before["prompt_tokens"] // BLOCK_SIZE * BLOCK_SIZE, (before, after)
        # one cache-bust tag per session, at the front of its first message, so the history stays a prefix
        (tag,) = {TAG.match(r["prompt"][0][1]).group(0) for r in turns}
        assert not any(TAG.search(content) for r in turns for _, content in r["prompt"][1:])
        tags.append(tag)
    assert len(set(tags)) == len(tags)  # no two sessions share a tag
    (rung,) = load_rungs(run)
    assert rung["peak_in_flight"] == 2 and rung["num_measured"] == 9
    assert {t: s["num_requests"] for t, s in rung["turns"].items()} == {"1": 3, "2": 3, "3": 3}
    assert rung["turns"]["1"]["cached_tokens"]["max"] < rung["turns"]["3"]["cached_tokens"]["min"]
    assert rung["prefix_cache"]["hit_rate"] > 0, rung["prefix_cache"]  # from /metrics
    assert "ttft by turn p50 1: " in out
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["workload"]["multi_turn"] == {"turns": 3, "reply": "server"}
    assert manifest["workload"]["cache_bust"] == {"per_session": True}
    report = compare(capsys, run)
    assert "### TTFT by turn" in report
    # one row per turn, each with a number (a busy host may footnote a flag after it)
    assert len(re.findall(r"^\| TTFT \(ms\)\[\^\d+\] \| 2 \| [123] \| [\d,.]+( [A-Z_]+\[\^\d+\])* \|$", report,
                          re.M)) == 3, report


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "A1?"}, {"from": "gpt", "value": "a1."},
                                  {"from": "human", "value": "A2?"}, {"from": "gpt", "value": "a2."},
                                  {"from": "human", "value": "A3?"}, {"from": "gpt", "value": "a3."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "B1?"}, {"from": "gpt", "value": "b1."}]},
    {"id": "c", "conversations": [{"from": "human", "value": "C1?"}, {"from": "gpt", "value": "c1."},
                                  {"from": "human", "value": "C2?"}, {"from": "gpt", "value": "c2."}]},
    {"id": "d", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "D1?"},
                                  {"from": "gpt", "value": "d1."}, {"from": "human", "value": "D2?"}]},
]


def test_sharegpt_conversations_are_sessions_as_they_stand_and_the_hit_rate_is_na(fake_server, ladder, capsys,
                                                                                    tmp_path):
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(SHAREGPT))
    code, out, err, run = ladder("--base-url", fake_server(), "--dataset", f"sharegpt:{data}", "--multi-turn", "2",
                                 "--multi-turn-reply", "dataset", "--output-len", "4", "--c", "2",
                                 "--prompts-per-rung", "2", "--warmup", "0", "--save-text")
    assert (code, err) == (0, ""), out
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["workload"]["dataset"]["num_records"], manifest["workload"]["dataset"]["num_usable"]) == (4, 2)
    by_session = sessions(load_records(run))
    assert len(by_session) == 2
    seen = set()
    for turns in by_session.values():
        assert [r["turn"] for r in turns] == [1, 2]
        # the conversation's human turns in order, each followed by the dataset's own reply
        letter = turns[0]["prompt"][0][1][0]
        seen.add(letter)
        assert turns[1]["prompt"] == [["user", f"{letter}1?"], ["assistant", f"{letter.lower()}1."],
                                      ["user", f"{letter}2?"]]
    assert seen == {"A", "C"}  # B has one turn only, D does not start with a human turn
    (rung,) = load_rungs(run)
    assert rung["prefix_cache"] is None and "cache hits n/a" in out  # no cache counters: n/a, never 0
    assert rung["turns"]["2"]["cached_tokens"] is None
    report = compare(capsys, run)
    # The client audit's flag (HOST_CONTENTION) reports the machine's load, which a test must not depend on.
    assert re.search(r"^\| cached tokens, mean \(tok\)\[\^\d+\] \| 2 \| 2 \| n/a( HOST_CONTENTION\[\^\d+\])? \|$",
                     report, re.M), report


def test_a_failed_turn_ends_its_session(fake_server, ladder):
    """The reply of a failed turn is missing, so its session's later turns are never sent (and fail)."""
    code, out, err, run = ladder("--base-url", fake_server(fail_at=[1]), "--multi-turn", "3", "--c", "1",
                                 "--prompts-per-rung", "2", "--warmup", "0", "--input-len", "32", "--output-len", "4")
    assert code == 1, (out, err)
    by_session = sessions(load_records(run))
    first, second = by_session[("measured", 0)], by_session[("measured", 1)]
    assert [r["t_send"] is not None for r in first] == [True, True, False]
    assert first[1]["error"].startswith("http_error") and first[2]["error"].startswith("not_sent: turn 2")
    assert all(r["error"] is None for r in second + first[:1])
    (rung,) = load_rungs(run)
    assert (rung["status"], rung["num_ok"], rung["num_failed"]) == ("VOID", 4, 2)


@pytest.mark.parametrize(("args", "message"), [
    (["--multi-turn", "0"], "Invalid value for '--multi-turn': 0 is not in the range x>=1."),
    (["--multi-turn", "-1"], "Invalid value for '--multi-turn': -1 is not in the range x>=1."),
    (["--multi-turn", "2", "--request-rate", "1"], "--multi-turn runs closed loop"),
    (["--multi-turn-reply", "dataset"], "--multi-turn-reply applies only with --multi-turn"),
    (["--multi-turn", "2", "--prefix-len", "64"], "give one of them"),
    (["--multi-turn", "2", "--dataset", "jsonl:{tmp}/x.jsonl"], "not from --dataset jsonl"),
], ids=["zero", "negative", "rate", "reply-alone", "prefix", "jsonl"])
def test_bad_multi_turn_input_is_a_one_line_error(args, message, capsys, tmp_path):
    (tmp_path / "x.jsonl").write_text('{"prompt": "hi", "output_len": 4}\n')
    with pytest.raises(SystemExit) as exc:
        # a port nothing listens on: every refusal comes before the first request
        main(["run", "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"),
              *(a.format(tmp=tmp_path) for a in args)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ladder: error: ") and message in err, err
