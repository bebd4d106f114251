"""Defects new users found (issue 55), each pinned by a test that failed before its fix."""

import json
import signal
import subprocess
import sys
import time

import pytest
from ladder_harness import fake_cmd, load_records, load_rungs
from run_fixtures import WORKLOAD, ok, write_run

from ladder.cli import main

SMALL = ("--input-len", "32", "--output-len", "4")


def _strict(text: str):
    """RFC 8259 JSON: Python's strict parser refuses Infinity and NaN, as JavaScript, Go and serde do."""
    def refuse(token: str):
        raise ValueError(f"not RFC 8259 JSON: bare {token}")
    return json.loads(text, parse_constant=refuse)


def _compare(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["compare", *map(str, args)])
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def test_sigint_keeps_the_finished_requests_and_marks_the_rung_partial(tmp_path, capsys):
    """Ctrl-C in a rung: every finished request stays in requests.jsonl, the rung (and the run) is marked
    partial, the server the ladder started is stopped, exit 130; compare flags the rung."""
    out = tmp_path / "run"
    cmd = fake_cmd({"gap": 0.05}, port="{port}")  # 10 tokens: about 0.5 s a request
    proc = subprocess.Popen([sys.executable, "-c", "from ladder.cli import main; main()", "run", "--out", str(out),
                             "--serve-cmd", cmd, "--c", "2", "--input-len", "32", "--output-len", "10",
                             "--prompts-per-rung", "40", "--metrics-interval", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.5)  # the warmup (0.5 s) and a few measured requests done, most of the 40 still to come
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "ladder: interrupted" in err and "Traceback" not in err, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["result"]["interrupted"] is True and manifest["result"]["partial_rungs"] == ["c=2"]
    records = load_records(out)
    finished = [r for r in records if r["phase"] == "measured" and r["error"] is None]
    assert 1 <= len(finished) < 40, len(finished)
    assert all(r["output_tokens"] == 10 for r in finished)
    (rung,) = load_rungs(out)
    assert rung["status"] == "OK" and "PARTIAL" in rung["flags"] and rung["num_measured"] == len(finished)
    code, report, _ = _compare(capsys, out)
    assert code == 0 and "PARTIAL" in report and "interrupted" in report
    from test_ladder_integration import _port_open
    assert not _port_open(manifest["endpoint"]["base_url"])  # the server the ladder started is gone


def test_a_password_in_base_url_is_redacted_everywhere(fake_server, ladder):
    url = fake_server().replace("http://", "http://bench:pw0rdXYZ@")
    code, out, err, run = ladder("--base-url", url, "--c", "1", *SMALL, "--prompts-per-concurrency", "1")
    assert code == 0, (out, err)
    assert "pw0rdXYZ" not in out + err
    for path in run.iterdir():
        assert "pw0rdXYZ" not in path.read_text(), path.name
    assert json.loads((run / "manifest.json").read_text())["endpoint"]["base_url"].startswith("http://bench:<redacted>@")


def test_the_server_metrics_mean_is_over_the_requests_own_window(fake_server, ladder):
    """Tick 0 (before the first request) and the closing sample (after the last) read 0 running; a rung
    that held 4 requests nearly all the time reports about 4."""
    url = fake_server(gap=0.05)
    code, out, err, run = ladder("--base-url", url, "--c", "4", "--input-len", "32", "--output-len", "8",
                                 "--prompts-per-rung", "4", "--warmup", "0", "--metrics-interval", "0.05")
    assert code == 0, (out, err)
    running = load_rungs(run)[0]["server_metrics"]["series"]["running"]
    assert running["peak"] == 4 and running["mean"] >= 3.6, running


def test_a_stop_token_without_text_and_no_stream_raise_no_speculation_warning(fake_server, ladder):
    """A real model's EOS counts in usage but has no text: tokens per chunk stays 1 without speculation.
    --no-stream has one answer, no chunks: tokens per chunk is n/a, and no warning either."""
    url = fake_server(stop_after=6, stop_eos=True)
    code, out, err, run = ladder("--base-url", url, "--c", "1", "--input-len", "32", "--output-len", "12",
                                 "--no-ignore-eos", "--prompts-per-concurrency", "2")
    assert code == 0, (out, err)
    assert [r["output_tokens"] for r in load_records(run)] == [6, 6, 6]  # the EOS is counted
    assert load_rungs(run)[0]["stats"]["tokens_per_chunk"]["mean"] == 1.0
    assert "tokens per chunk" not in out + err
    code, out, err, run = ladder("--base-url", url, "--c", "1", *SMALL, "--no-stream", "--prompts-per-concurrency", "1")
    assert code == 0, (out, err)
    assert load_rungs(run)[0]["stats"]["tokens_per_chunk"] is None and "tokens per chunk" not in out + err


def test_request_rate_inf_is_never_late_and_every_file_is_strict_json(fake_server, ladder, capsys):
    """At inf every request is due at t = 0: waiting for the --max-concurrency cap is not lateness. The
    result files are RFC 8259 JSON (inf written as "Infinity") and read back as inf."""
    url = fake_server(gap=0.02)
    code, out, err, run = ladder("--base-url", url, "--request-rate", "inf", "--max-concurrency", "1", *SMALL,
                                 "--prompts-per-rung", "4", "--metrics-interval", "0.05")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    assert "LATE" not in rung["flags"] and rung["lateness"] is None and "LATE" not in out
    for name in ("manifest.json", "rungs.json"):
        _strict((run / name).read_text())
    for name in ("requests.jsonl", "metrics.jsonl"):
        lines = (run / name).read_text().splitlines()
        assert lines and all(_strict(line) for line in lines)
    assert _strict((run / "rungs.json").read_text())[0]["request_rate"] == "Infinity"
    from ladder.runs import load_run
    assert list(load_run(run).rungs) == [float("inf")]
    code, report, _ = _compare(capsys, run)
    assert code == 0 and "| inf |" in report


def test_sweep_says_when_the_answer_is_its_search_limit(fake_server, capsys, tmp_path):
    url = fake_server()
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--out", str(tmp_path / "sweep"), "--base-url", url,
              "--max-c", "2", "--goodput", "e2el:60000", *SMALL, "--prompts-per-concurrency", "1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "2 concurrent requests (limit reached: --max-c 2 passed" in out, out


@pytest.mark.parametrize(("args", "says"), [
    (["--num-prompts", "8"], "vllm bench serve's --num-prompts is --prompts-per-rung (or"),
    (["--random-input-len", "8"], "vllm bench serve's --random-input-len is --input-len here"),
    (["--max-concurrency", "4"], "a closed loop of 4 in flight is --c 4 here"),
])
def test_vllm_flag_names_get_ours(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--base-url", "http://127.0.0.1:9", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err and "--num-prefixes" not in err and err.count("\n") == 1, err


def test_compare_of_closed_against_open_loop_names_the_load_not_a_float_rung(tmp_path, capsys):
    closed = write_run(tmp_path, "closed", [ok(2, 100.0)], workload={**WORKLOAD, "load": {"concurrency": [2]}})
    rate = ok(2, 100.0)
    object.__setattr__(rate, "request_rate", 2.0)
    opened = write_run(tmp_path, "open", [rate], workload={
        **WORKLOAD, "rung_prompt_hashes": {"2.0": "h2" * 32},
        "load": {"request_rate": [2.0], "burstiness": 1.0, "max_concurrency": None}})
    code, out, err = _compare(capsys, closed, opened)
    assert code == 2 and "load: closed = concurrency, open = request rate" in err
    assert "c=2.0" not in err and "unknown" not in err and "--tokenizer" not in err, err


def test_kv_usage_is_one_unit_in_the_table_and_the_plot():
    from ladder.compare import SERVER_SERIES
    from ladder.plots import time_series

    xs, series = time_series([{"t": 1.0, "values": {"kv_usage": 0.25}}])
    ((label, ys),) = [(lab, y) for name, lab, y in series if name == "kv_usage"]
    title, unit, _, scale = SERVER_SERIES["kv_usage"]
    assert label == f"{title} ({unit})" == "KV cache usage (%)" and ys == [25.0] == [scale * 0.25]


def test_llamacpp_reports_the_per_slot_context_it_really_has():
    """llama.cpp pads each slot's context to a multiple of 256 (384 -> 512, its own /props n_ctx)."""
    from ladder.peers import llamacpp

    keys = llamacpp.engine_keys(["--gguf", "x.gguf", "--port", "1", "--ctx-per-slot", "384"])
    assert keys["max_model_len"] == 512 == llamacpp.slot_context(384)
    assert llamacpp.slot_context(512) == 512 and llamacpp.slot_context(600) == 768


def test_trace_replay_without_a_tokenizer_says_how_far_the_lengths_missed(fake_server, ladder, tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": 0, "input_length": 120, "output_length": 3, "hash_ids": [1]},
             {"timestamp": 10, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]},
             {"timestamp": 20, "input_length": 60, "output_length": 3, "hash_ids": [3]}]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, err, run = ladder("--base-url", fake_server(), "--dataset", f"trace:{trace}")
    assert code == 0, (out, err)
    misses = [100 * (r["prompt_tokens"] - line["input_length"]) / line["input_length"]
              for r, line in zip(load_records(run), lines)]
    worst = max(misses, key=abs)
    (warning,) = [w for w in json.loads((run / "manifest.json").read_text())["warnings"] if "trace" in w]
    assert f"by up to {worst:+.0f}%" in warning and "--tokenizer" in warning and warning in out


def test_refengine_reports_its_kv_dtype_where_the_ladder_reads_it():
    from ladder.engine_info import from_server
    from refengine.engine.outputs import EngineInfo
    from refengine.entrypoints.metrics import cache_config_info

    info = EngineInfo(numerics="batch_invariant", dtype="float32", weight_format="F32", spec_method=None,
                      num_speculative_tokens=0, async_scheduling=True, async_scheduling_source="default",
                      max_num_seqs=4, block_size=16, num_blocks=64)
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()

    class One:
        def collect(self):
            yield cache_config_info(info, ["model_name"], ["m"])

    registry.register(One())
    text = generate_latest(registry).decode()
    assert from_server({}, text, {})["kv_dtype"] == "float32"


def test_a_bare_run_says_how_big_it_is(capsys):
    from ladder.config import RunConfig
    from ladder.runner import size_note, workload_size

    bare = RunConfig(base_url=None, serve_cmd=None, concurrencies=(1, 2, 4, 8, 16, 32))  # the defaults
    assert workload_size(bare) == (693, 354816) and "hours" not in size_note(bare) and " h or more" in size_note(bare)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "hours" in capsys.readouterr().out


def test_identity_points_at_c1_after_a_divergence_under_concurrency():
    from ladder.identity import Completion, compare, summary

    same, moved = Completion(text="a b", token_ids=[1, 2]), Completion(text="a c", token_ids=[1, 3])
    assert "c = 1" not in summary([compare(1, 0, same, moved)])
    text = summary([compare(1, 0, same, same), compare(4, 2, same, moved)])
    assert "rerun prompt #2 at c = 1 (--c 1) to see which side moved" in text, text
    text = summary([compare(1, 2, same, same), compare(4, 2, same, moved)])
    assert "c=4 #2: B moved from its c = 1 answer" in text, text
