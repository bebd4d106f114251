"""ladder against the scripted fake server: exact counts, VOID rungs, engine death, --serve-cmd.

Load-request serials with `--prompts-per-concurrency 3` (warmup = c): rung c=1 is 0-3 (warmup 0),
rung c=2 is 4-11 (warmup 4-5), rung c=4 is 12-27. Timings are checked only within loose bounds.
"""

import json
import socket
import time

import pytest
from ladder_harness import fake_cmd, load_records, load_rungs

from ladder.config import RunConfig
from ladder.runner import resolve_target

FAST = ("--input-len", "64", "--output-len", "10", "--prompts-per-concurrency", "3")


def test_ok_ladder_counts_tokens_per_chunk_and_acceptance_exact(fake_server, ladder):
    url = fake_server(ttft=0.05, gap=0.01, tokens_per_chunk=3, spec_k=4)
    code, out, err, run = ladder("--base-url", url, "--c", "1,2", *FAST, "--metadata", "dtype=bf16")
    assert (code, err) == (0, "")
    rungs = load_rungs(run)
    assert [(r["concurrency"], r["status"], r["num_ok"]) for r in rungs] == [(1, "OK", 4), (2, "OK", 8)]
    for r in rungs:
        st = r["stats"]
        assert st["num_requests"] == 3 * r["concurrency"]
        # The rung really ran at c. The client audit's flags (CLIENT_BOUND, HOST_CONTENTION) report the
        # machine's load, which a test must not depend on: a loaded make test raised HOST_CONTENTION here.
        assert r["peak_in_flight"] == r["concurrency"]
        assert set(r["flags"]) <= {"CLIENT_BOUND", "HOST_CONTENTION"}
        assert st["output_tokens"] == {"min": 10, "mean": 10.0, "max": 10}
        assert st["tokens_per_chunk"]["mean"] == 10 / 4  # chunks of 3, 3, 3, 1
        assert abs(st["input_tokens"]["mean"] - 64) <= 2  # calibrated through two probes
        assert r["spec"]["acceptance_length"] == 1 + 6 / 4 and r["spec"]["acceptance_rate"] == 6 / 16
        assert r["prefix_cache"] is None  # the scripted server has no prefix-cache counters: n/a, not 0
        # The role prelude is sent at once and must not count: TTFT is at least the scripted 50 ms.
        assert 50 <= st["ttft_ms"]["percentiles"]["p50"] < 1000
        assert 10 <= st["chunk_gap_ms"]["percentiles"]["p50"] < 500
        assert st["itl_token_ms"]["mean"] < st["chunk_gap_ms"]["mean"]  # 3 tokens share most gaps
        assert st["e2e_ms"]["mean"] >= st["ttft_ms"]["mean"] + 25  # three 10 ms gaps, less timer slack
    records = load_records(run)
    assert len(records) == 4 + 8
    assert all(r["chunk_usage"] == [3, 6, 9, 10] and r["num_events"] == 7 for r in records)  # +prelude, usage, DONE
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["model"] == "fake-model" and manifest["result"] == {"exit_code": 0, "engine_dead": None}
    assert manifest["engine"]["engine"] == "fake" and manifest["engine"]["max_model_len"] == 4096
    # normalised for ladder compare, and each key says where it came from
    assert manifest["engine"]["dtype"] == "bfloat16" and manifest["metadata"] == {"dtype": "bf16"}
    assert manifest["engine_sources"]["dtype"] == "metadata"
    assert manifest["engine_sources"]["max_model_len"] == "server"
    assert manifest["workload"]["continuous_usage_stats"] is True
    nonce = manifest["workload"]["cache_bust"]["nonce"]
    assert len(nonce.split()) == 6  # six four-letter words: the same tokens whatever it draws
    # a second run: another nonce (no prefix cache can serve it), the same requests as far as compare goes
    _, _, _, again = ladder("--base-url", url, "--c", "1,2", *FAST)
    other = json.loads((again / "manifest.json").read_text())["workload"]
    assert other["cache_bust"]["nonce"] != nonce
    assert other["rung_prompt_hashes"] == manifest["workload"]["rung_prompt_hashes"]
    assert manifest["workload"]["rung_prompt_hashes"]["1"] == rungs[0]["prompt_hash"]
    assert len((run / "rungs.csv").read_text().splitlines()) == 3
    assert "latency per rung, ms: p50 / p90 / p99" in out and "c=2" in out and "Definitions" not in out  # definitions only with --explain
    assert "6 measured ok (+2 warmup)" in out  # warmup requests are not counted as measured


def test_one_failed_request_voids_its_rung_only(fake_server, ladder):
    url = fake_server(fail_at=[7])
    code, out, _, run = ladder("--base-url", url, "--c", "1,2,4", *FAST)
    rungs = load_rungs(run)
    assert code == 1
    assert [r["status"] for r in rungs] == ["OK", "VOID", "OK"]
    void = rungs[1]
    assert (void["num_ok"], void["num_failed"], void["reason"]) == (7, 1, "http_error")
    assert "HTTP 500" in void["errors"][0]
    assert not {"stats", "audit", "spec"} & set(void)
    assert "VOID" in out


def test_a_failed_warmup_request_voids_its_rung(fake_server, ladder):
    url = fake_server(fail_at=[4])  # the first warmup request of rung c=2
    code, _, _, run = ladder("--base-url", url, "--c", "1,2", *FAST)
    rungs = load_rungs(run)
    assert code == 1
    assert [r["status"] for r in rungs] == ["OK", "VOID"]
    assert (rungs[1]["num_ok"], rungs[1]["num_failed"], rungs[1]["reason"]) == (7, 1, "http_error")
    assert rungs[1]["failed_phases"] == {"warmup": 1}


def test_one_failed_canary_of_a_live_server_is_not_engine_death(fake_server, ladder):
    url = fake_server(fail_at=[1], canary_fail_at=[0])  # a request fails, then the first canary after it
    code, out, _, run = ladder("--base-url", url, "--c", "1,2", *FAST)
    rungs = load_rungs(run)
    assert code == 1  # VOID, not 3: 2 of 3 canaries must fail before the engine counts as dead
    assert [(r["status"], r.get("reason")) for r in rungs] == [("VOID", "http_error"), ("OK", None)]
    assert "failed=1 (measured 1)" in out


def test_probes_and_canaries_that_sample_a_special_token_are_answers(fake_server, ladder):
    """A 1-token probe or canary whose one token is special (skipped from the text) comes back with usage
    completion_tokens 1 and no text: the server answered. CI saw a random tiny model do this on one
    nonce in five, which failed the whole run as "probe request failed: zero_tokens"."""
    url = fake_server(silent_one_token=True, fail_at=[1])  # a failed request, so the canary runs too
    code, out, err, run = ladder("--base-url", url, "--c", "1,2", *FAST)
    assert code == 1, (out, err)  # VOID (the failed request), not 2 (probe) nor 3 (a dead engine)
    assert [(r["status"], r.get("reason")) for r in load_rungs(run)] == [("VOID", "http_error"), ("OK", None)]


def test_goodput_halves_when_half_the_requests_miss_the_ttft_slo(fake_server, ladder):
    # the slow half answers after 2.5 s, beyond the 2 s SLO whatever the load; the fast half after 50 ms,
    # which leaves nearly 2 s of slack for a loaded machine
    url = fake_server(ttft=0.05, gap=0.01, slow_at=[1, 3], slow_ttft=2.5)
    code, out, _, run = ladder("--base-url", url, "--c", "2", "--input-len", "64", "--output-len", "10",
                               "--prompts-per-rung", "4", "--warmup", "0", "--goodput", "ttft:2000 e2el:60000")
    (rung,) = load_rungs(run)
    assert code == 0 and rung["stats"]["goodput_fraction"] == 0.5 and "goodput" in out
    records = load_records(run)
    assert len(records) == 4 and [r["phase"] for r in records] == ["measured"] * 4  # --warmup 0 is honoured
    # per-request fields, one-sided: the scripted server never answers faster than its script
    for r in records:
        assert r["output_tokens"] == 10 and len(r["itl_ms"]) == 9
        assert r["ttft_ms"] >= 50 and r["e2e_ms"] >= r["ttft_ms"] and r["tpot_ms"] > 0
        assert min(r["itl_ms"]) >= 5  # 10 ms scripted gaps, less timer slack
    assert sorted(r["ttft_ms"] >= 2500 for r in records) == [False, False, True, True]


def test_a_429_is_reported_as_overloaded(fake_server, ladder):
    url = fake_server(overload_at=[1])
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST)
    (rung,) = load_rungs(run)
    assert (code, rung["status"], rung["reason"]) == (1, "VOID", "overloaded")
    assert rung["errors"][0].startswith("overloaded: HTTP 429")


def test_a_server_that_does_not_stream_is_named_by_its_content_type(fake_server, ladder):
    url = fake_server(plain_json=True)
    code, _, err, _ = ladder("--base-url", url, "--c", "1", *FAST)
    assert code == 2 and "application/json" in err and "does it support streaming?" in err
    assert "[DONE]" not in err


def test_truncated_and_short_streams_void_with_their_reasons(fake_server, ladder):
    url = fake_server(truncate_at=[1], short_at=[2])
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST)
    (rung,) = load_rungs(run)
    assert code == 1
    assert (rung["status"], rung["reason"], rung["num_failed"]) == ("VOID", "truncated, length_mismatch", 2)
    assert rung["errors"][1] == "length_mismatch: 9 output tokens, 10 requested with ignore_eos"


@pytest.mark.parametrize("mode, cause", [("500", "canary failed 2 of 2 tries: http_error: HTTP 500"),
                                         ("exit", "/health unreachable")])
def test_engine_death_voids_the_rung_and_skips_the_rest(fake_server, ladder, mode, cause):
    url = fake_server(die_after=6, die_mode=mode)
    code, out, _, run = ladder("--base-url", url, "--c", "1,2,4,8", *FAST)
    rungs = load_rungs(run)
    assert code == 3
    assert [r["status"] for r in rungs] == ["OK", "VOID", "NOT_RUN", "NOT_RUN"]
    assert rungs[1]["reason"].startswith("engine_dead: " + cause)
    assert rungs[2]["reason"] == rungs[3]["reason"] == rungs[1]["reason"]
    assert json.loads((run / "manifest.json").read_text())["result"]["exit_code"] == 3


def test_engine_death_between_rungs_leaves_the_finished_rung_ok(fake_server, ladder):
    url = fake_server(exit_after_done=4)  # exits right after rung c=1's last request
    code, _, _, run = ladder("--base-url", url, "--c", "1,2", *FAST)
    rungs = load_rungs(run)
    assert code == 3
    assert [r["status"] for r in rungs] == ["OK", "NOT_RUN"]
    assert rungs[1]["reason"].startswith("engine_dead: /health unreachable")


def test_request_timeout_voids_the_rung_but_the_engine_lives(fake_server, ladder):
    url = fake_server(gap=0.5)
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST, "--timeout", "0.3")
    (rung,) = load_rungs(run)
    assert (code, rung["status"], rung["reason"]) == (1, "VOID", "timeout")
    assert rung["errors"] == ["timeout: no complete response within 0.3 s"]


@pytest.mark.parametrize("pings", [False, True])
def test_stall_is_engine_death_even_while_the_server_pings(fake_server, ladder, pings):
    url = fake_server(die_after=6, die_mode="stall", pings=pings)
    t0 = time.monotonic()
    code, _, _, run = ladder("--base-url", url, "--c", "1,2,4", *FAST, "--stall-timeout", "1")
    rungs = load_rungs(run)
    assert code == 3
    assert [r["status"] for r in rungs] == ["OK", "VOID", "NOT_RUN"]
    assert rungs[1]["reason"].startswith("engine_dead: stall: no chunk for")
    assert time.monotonic() - t0 < 30


def _port_open(url: str) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) == 0


def test_serve_cmd_runs_against_the_started_server_and_stops_it(ladder):
    code, out, err, run = ladder("--serve-cmd", fake_cmd({"tokens_per_chunk": 2}, port="{port}"),
                               "--c", "1", *FAST)
    assert code == 0, (out, err)
    base_url = json.loads((run / "manifest.json").read_text())["endpoint"]["base_url"]
    assert not _port_open(base_url)
    assert (run / "server.log").exists()


def test_serve_cmd_process_death_is_engine_death(ladder):
    cmd = fake_cmd({"die_after": 6, "die_mode": "exit", "gap": 0.01}, port="{port}")
    code, _, _, run = ladder("--serve-cmd", cmd, "--c", "1,2,4", *FAST)
    rungs = load_rungs(run)
    assert code == 3
    assert [r["status"] for r in rungs] == ["OK", "VOID", "NOT_RUN"]
    assert "engine_dead" in rungs[1]["reason"]


def test_serve_cmd_that_exits_before_answering_is_a_usage_error(ladder):
    code, out, err, _ = ladder("--serve-cmd", "sh -c 'echo loading; exit 7'", "--base-url",
                               "http://127.0.0.1:9")
    assert code == 2
    assert err.startswith("ladder: error: the server command exited with code 7") and "loading" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("cmd", ["no-such-server-program --port 1", "sh -c 'unbalanced"])
def test_serve_cmd_that_cannot_start_is_a_usage_error(ladder, cmd):
    code, _, err, _ = ladder("--serve-cmd", cmd, "--base-url", "http://127.0.0.1:9")
    assert code == 2 and err.startswith("ladder: error: cannot start --serve-cmd") and err.count("\n") == 1


def test_embedded_default_serves_refengine_on_a_free_port():
    base_url, cmd = resolve_target(RunConfig(base_url=None, serve_cmd=None))
    port = base_url.rsplit(":", 1)[1]
    assert cmd.endswith(f"refengine serve --model smollm2 --port {port}")


def test_missing_usage_needs_allow_chunk_count_and_a_tokenizer(fake_server, ladder, tmp_path):
    url = fake_server(usage="none", continuous=False)
    code, _, err, _ = ladder("--base-url", url, "--c", "1", *FAST)
    assert code == 2 and "--allow-chunk-count" in err
    code, _, err, _ = ladder("--base-url", url, "--c", "1", *FAST, "--allow-chunk-count")
    assert code == 2 and "--tokenizer" in err
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST, "--allow-chunk-count",
                             "--tokenizer", str(tmp_path / "tok.json"))
    (rung,) = load_rungs(run)
    assert code == 0 and rung["stats"]["output_tokens"]["mean"] == 10
    assert rung["stats"]["input_tokens"] is None and rung["stats"]["total_throughput"] is None


def test_tokenizer_mode_sizes_to_the_servers_prompt_tokens_and_warns_when_it_cannot(fake_server, ladder, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ladder.prompts import WORDS

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)} | {"[UNK]": len(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    url = fake_server()  # counts 4/3 tokens per word + 7 for the template: not this tokenizer's 1 per word
    code, out, _, run = ladder("--base-url", url, "--c", "1", *FAST, "--tokenizer", str(tmp_path / "tok.json"))
    manifest = json.loads((run / "manifest.json").read_text())
    sizing = manifest["workload"]["prompt_sizing"]
    assert code == 0 and sizing["method"] == "tokenizer"
    assert sizing["overhead_tokens"] == (64 + 7) * 4 // 3 + 7 - 64  # template and tag ("Run" and six words)
    (warning,) = manifest["warnings"]
    assert warning.startswith("c=1: the server counted") and "--input-len 64" in warning and warning in out


def test_save_text_keeps_prompt_and_output_and_no_cache_bust_keeps_prompts_exact(fake_server, ladder):
    url = fake_server()
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST, "--save-text", "--no-cache-bust")
    records = load_records(run)
    assert code == 0 and len(records) == 4
    assert all(r["output_text"] == "é日本 wö€é日本 wö€" for r in records)  # the fake's 10 tokens, in order
    assert all(len(r["prompt"]) == 1 and r["prompt"][0][0] == "user" for r in records)
    assert not records[0]["prompt"][0][1].startswith("Run ")  # no tag
    assert json.loads((run / "manifest.json").read_text())["workload"]["cache_bust"] is False
    code, _, _, again = ladder("--base-url", url, "--c", "1", *FAST, "--save-text", "--no-cache-bust")
    assert [r["prompt"] for r in load_records(again)] == [r["prompt"] for r in records]  # exactly reproduced
    _, _, _, busted = ladder("--base-url", url, "--c", "1", *FAST, "--save-text")
    nonce = json.loads((busted / "manifest.json").read_text())["workload"]["cache_bust"]["nonce"]
    assert all(r["prompt"][0][1].startswith(f"Run {nonce}\n") for r in load_records(busted))
    _, _, _, plain = ladder("--base-url", url, "--c", "1", *FAST)
    assert all(r["prompt"] is None and r["output_text"] is None for r in load_records(plain))


def test_max_duration_stops_sending_and_counts_the_unsent(fake_server, ladder):
    url = fake_server(gap=0.12)  # each request streams for at least 1.08 s
    code, out, _, run = ladder("--base-url", url, "--c", "1", "--input-len", "64", "--output-len", "10",
                               "--prompts-per-rung", "6", "--warmup", "2", "--max-duration", "1")
    (rung,) = load_rungs(run)
    assert code == 0 and (rung["num_measured"], rung["num_unsent"]) == (1, 5)
    assert rung["stats"]["num_requests"] == 1 and "5 unsent (--max-duration)" in out
    # the second warmup request starts after 1 s and is still sent; unsent requests are not results
    assert [r["phase"] for r in load_records(run)] == ["warmup", "warmup", "measured"]


def test_server_rejecting_continuous_usage_gets_requests_without_it(fake_server, ladder):
    url = fake_server(reject_continuous=True, tokens_per_chunk=2)
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST)
    (rung,) = load_rungs(run)
    assert code == 0
    assert rung["stats"]["itl_token_ms"] is None and rung["stats"]["tokens_per_chunk"]["mean"] == 2.0
    assert json.loads((run / "manifest.json").read_text())["workload"]["continuous_usage_stats"] is False


def test_the_manifest_records_the_usage_the_server_sent_not_what_was_asked(fake_server, ladder):
    url = fake_server(continuous=False)  # accepts continuous_usage_stats, never sends it (as llama.cpp)
    code, _, _, run = ladder("--base-url", url, "--c", "1", *FAST)
    workload = json.loads((run / "manifest.json").read_text())["workload"]
    assert code == 0 and workload["continuous_usage_requested"] is True
    assert workload["continuous_usage_stats"] is False


def test_pings_split_writes_and_completions_backend(fake_server, ladder):
    url = fake_server(pings=True, split_writes=True, tokens_per_chunk=2)
    for backend in ("openai-chat", "openai"):
        code, _, _, run = ladder("--base-url", url + "/v1", "--backend", backend, "--c", "2", *FAST)
        (rung,) = load_rungs(run)
        assert (code, rung["status"], rung["stats"]["tokens_per_chunk"]["mean"]) == (0, "OK", 2.0)


def test_sigterm_stops_the_started_server_too(tmp_path):
    """A ladder ended by SIGTERM (or by SIGINT while a shell ignores it in the background) stops its server."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = fake_cmd({"gap": 0.5}, port="{port}")
    proc = subprocess.Popen([sys.executable, "-c", "from ladder.cli import main; main()", "run", "--out", str(out),
                             "--serve-cmd", cmd, "--c", "1", *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    base_url = json.loads((out / "manifest.json").read_text())["endpoint"]["base_url"]
    assert _port_open(base_url)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "ladder: interrupted" in err
    assert not _port_open(base_url)
