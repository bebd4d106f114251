"""Defects new users found (issue 32), each pinned by a test that failed before its fix."""

import json

import pytest
from ladder_harness import load_records, load_rungs

SMALL = ("--input-len", "32", "--output-len", "4")


def test_request_rate_inf_sizes_its_rung_without_prompts_per_rung(fake_server, ladder):
    """ceil(inf) raised OverflowError: an inf rung sends K·--max-concurrency, else K·32 requests."""
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--request-rate", "2,inf", *SMALL,
                                 "--prompts-per-concurrency", "1")
    assert code == 0, (out, err)
    assert [(r["request_rate"], r["num_measured"]) for r in load_rungs(run)] == [(2, 2), (float("inf"), 32)]
    code, _, _, run = ladder("--base-url", url, "--request-rate", "inf", "--max-concurrency", "3", *SMALL,
                             "--prompts-per-concurrency", "2")
    assert code == 0 and [r["num_measured"] for r in load_rungs(run)] == [6]


@pytest.mark.parametrize("rates", ["nan", "1,nan", "-inf"])
def test_a_rate_that_is_not_a_positive_number_is_one_line(ladder, rates):
    code, out, err, _ = ladder("--base-url", "http://127.0.0.1:9", "--request-rate", rates)
    assert code == 2 and err.count("\n") == 1 and "positive request rates" in err, (out, err)


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory):
    """SmolLM2's own tokenizer (from the embedded GGUF) as a tokenizer.json folder."""
    from refengine.model.gguf_loader import read_gguf
    from refengine.model.loader import embedded_smollm2_path
    from refengine.tokenizer.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    Tokenizer.from_gguf_vocab(read_gguf(embedded_smollm2_path()).vocab).save_hf_folder(folder)
    return folder


def test_the_cache_bust_tag_costs_the_same_tokens_whatever_it_draws(smollm2_tokenizer):
    """A hex nonce cost SmolLM2 6 to 11 tokens, beyond compare's ±2: two runs of one command were unlike."""
    from ladder.prompts import load_tokenizer
    from ladder.workload import new_nonce, with_nonce
    from refengine.model.tiny import CHATML_TEMPLATE, SPECIAL_TOKENS
    from refengine.tokenizer.tokenizer import Tokenizer

    smollm2 = load_tokenizer(smollm2_tokenizer)
    byte_level = Tokenizer.byte_level(151936, SPECIAL_TOKENS, "<|im_end|>", CHATML_TEMPLATE)  # tiny-qwen3's
    counts = {(len(smollm2.encode(text, add_special_tokens=False).ids),
               len(byte_level.encode(text, add_special_tokens=False)))
              for text in (with_nonce((("user", "able bird"),), new_nonce())[0][1] for _ in range(300))}
    assert len(counts) == 1, counts


def test_two_runs_of_one_command_compare_like_for_like(fake_server, ladder, smollm2_tokenizer, capsys):
    """The fake counts prompt tokens with SmolLM2's tokenizer; two runs of the default workload must pass
    compare's guard (input lengths within ±2, same prompt hashes)."""
    from ladder.cli import main

    url = fake_server(tokenizer=str(smollm2_tokenizer / "tokenizer.json"))
    args = ("--base-url", url, "--c", "1,2", "--input-len", "48", "--output-len", "4",
            "--prompts-per-concurrency", "2", "--save-text")
    (code_a, *_, a), (code_b, *_, b) = ladder(*args), ladder(*args)
    assert code_a == code_b == 0
    nonces = [json.loads((run / "manifest.json").read_text())["workload"]["cache_bust"]["nonce"] for run in (a, b)]
    assert nonces[0] != nonces[1]
    for run, nonce in zip((a, b), nonces):  # one tag per run, on every prompt
        assert all(r["prompt"][0][1].startswith(f"Run {nonce}\n") for r in load_records(run))
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(a), str(b)])
    assert exc.value.code == 0, capsys.readouterr().err


def test_dataset_prompts_carry_no_tag_and_are_never_sent_twice_in_a_run(fake_server, ladder, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question number {i}", "output_len": 4}) + "\n"
                            for i in range(12)))
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--dataset", f"jsonl:{data}", "--c", "1,2",
                                 "--prompts-per-concurrency", "2", "--save-text")
    assert code == 0, (out, err)
    prompts = [r["prompt"][0][1] for r in load_records(run)]
    assert len(prompts) == 1 + 2 + 2 + 4 and all(p.startswith("question number") for p in prompts)
    assert len(set(prompts)) == len(prompts)  # warmup included: no prompt twice
    workload = json.loads((run / "manifest.json").read_text())["workload"]
    assert workload["cache_bust"] is False and workload["dataset"]["num_reused"] == 0


def test_no_secret_of_the_serve_cmd_reaches_the_console_or_any_file_under_out(ladder):
    from ladder_harness import fake_cmd

    secrets = ("hf_SECRET_A1", "sk-SECRET_B2", "SECRET_C3", "SECRET_D4")
    cmd = (f"env HF_TOKEN={secrets[0]} " + fake_cmd({"echo_argv": True}, port="{port}")
           + f" --api-key {secrets[1]} --hf-token={secrets[2]} --token '{secrets[3]}'")
    code, out, err, run = ladder("--serve-cmd", cmd, "--c", "1", *SMALL, "--prompts-per-rung", "1")
    assert code == 0, (out, err)
    assert "<redacted>" in json.loads((run / "manifest.json").read_text())["endpoint"]["serve_cmd"]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "server.log", "requests.jsonl", "rungs.json"}
    for text in [out, err, *(p.read_text(errors="replace") for p in files)]:
        assert not [s for s in secrets if s in text]
    assert "--api-key <redacted>" in out and "args:" in (run / "server.log").read_text()  # the log is kept


@pytest.mark.parametrize("cmd, shown", [
    ("vllm serve m --api-key sk-1 --port 8000", "vllm serve m --api-key <redacted> --port 8000"),
    ("sh -c 'HF_TOKEN=hf_1 vllm serve m --hf-token=\"a b\"'", "sh -c 'HF_TOKEN=<redacted> vllm serve m --hf-token=\"<redacted>\"'"),
    ("env OPENAI_API_KEY=k x --token t --secret s", "env OPENAI_API_KEY=<redacted> x --token <redacted> --secret <redacted>"),
    # not secrets: flags that only mention tokens or keys, and a key flag followed by the next flag
    ("vllm serve m --max-num-batched-tokens 8192 --tokenizer /t --ssl-keyfile k.pem --max-tokens 4",
     "vllm serve m --max-num-batched-tokens 8192 --tokenizer /t --ssl-keyfile k.pem --max-tokens 4"),
    ("x --api-key --port 5", "x --api-key --port 5"),
])
def test_serve_cmd_redaction(cmd, shown):
    from ladder.redact import redact_cmd

    assert redact_cmd(cmd) == shown


def test_a_long_prompt_gets_a_longer_first_chunk_wait(fake_server, ladder, tmp_path):
    """25 KB of prompt waits up to 6 stall limits for its first chunk: a 1.5 s prefill with --stall-timeout 1
    is slow, not dead. Without /metrics counters nothing else could tell."""
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "word " * 5000, "output_len": 4}) + "\n")
    url = fake_server(slow_at=[0], slow_ttft=1.5)
    code, out, err, run = ladder("--base-url", url, "--dataset", f"jsonl:{data}", "--c", "1",
                                 "--prompts-per-rung", "1", "--warmup", "0", "--stall-timeout", "1")
    assert code == 0 and load_rungs(run)[0]["status"] == "OK", (out, err)


def test_a_silent_engine_whose_metrics_move_is_slow_not_dead(fake_server, ladder):
    url = fake_server(busy_metrics=True, gap=1.5)  # 1.5 s between chunks, 3 stall limits of 0.5 s
    code, out, err, run = ladder("--base-url", url, "--c", "1", *SMALL, "--prompts-per-rung", "1", "--warmup", "0",
                                 "--output-len", "3", "--stall-timeout", "0.5")
    assert code == 0 and load_rungs(run)[0]["status"] == "OK", (out, err)
    url = fake_server(busy_metrics=True, die_after=1, die_mode="stall")  # a stall freezes the counter too
    code, _, _, run = ladder("--base-url", url, "--c", "1", *SMALL, "--prompts-per-rung", "1", "--warmup", "1",
                             "--stall-timeout", "0.5")
    assert code == 3 and load_rungs(run)[0]["reason"].endswith("/metrics shows no progress")


def test_a_draining_server_is_reported_as_shutting_down_not_dead(fake_server, ladder):
    url = fake_server(drain_after=4)  # serves rung c=1 (4 requests), then drains
    code, out, err, run = ladder("--base-url", url, "--c", "1,2,4", *SMALL, "--prompts-per-concurrency", "3")
    rungs = load_rungs(run)
    assert code == 3 and [r["status"] for r in rungs] == ["OK", "VOID", "NOT_RUN"], (out, err)
    assert rungs[1]["reason"].startswith("shutting_down: the server is shutting down")
    assert rungs[2]["reason"] == rungs[1]["reason"] and "engine_dead" not in out


def test_an_interrupted_run_is_marked_in_the_manifest_and_in_compare(fake_server, tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import time

    from ladder.cli import main

    url = fake_server(gap=0.05)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", "from ladder.cli import main; main()", "run", "--out", str(out),
                             "--base-url", url, "--c", "1,2", *SMALL, "--output-len", "10",
                             "--prompts-per-concurrency", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (out / "rungs.json").exists() and time.monotonic() < deadline:  # rung c=1 done, c=2 running
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    result = json.loads((out / "manifest.json").read_text())["result"]
    assert result["interrupted"] is True and result["exit_code"] == 130
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(out)])
    report = capsys.readouterr().out
    assert exc.value.code == 0 and "**interrupted:** run stopped" in report and "| run (interrupted) |" in report


def _compare(capsys, *runs):
    from ladder.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", *map(str, runs)])
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def _set_flags(run, **flags):
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["flags"].update(flags)
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_compare_prints_the_goodput_slos_and_refuses_runs_whose_slos_differ(tmp_path, capsys):
    from run_fixtures import ok, write_run

    a = _set_flags(write_run(tmp_path, "a", [ok(1, 100.0)]), goodput={"ttft": 500.0})
    b = _set_flags(write_run(tmp_path, "b", [ok(1, 100.0)]), goodput={"ttft": 2000.0})
    code, out, err = _compare(capsys, a, b)
    assert code == 2 and "goodput SLOs: a = ttft:500, b = ttft:2000" in err
    import shutil

    code, out, _ = _compare(capsys, a, shutil.copytree(a, tmp_path / "a2"))
    assert code == 0 and "goodput SLOs (ms) ttft:500" in out


def test_compare_has_no_goodput_row_when_no_run_set_slos(tmp_path, capsys):
    from run_fixtures import ok, write_run

    a, b = (write_run(tmp_path, label, [ok(1, 100.0)]) for label in "ab")
    code, out, _ = _compare(capsys, a, b)
    assert code == 0 and "| goodput (req/s)" not in out and "| requests (req/s)" in out


def test_compare_names_a_different_prompt_count_not_the_tokenizer(tmp_path, capsys):
    import dataclasses

    from run_fixtures import WORKLOAD, ok, write_run

    other = {**WORKLOAD, "rung_prompt_hashes": {**WORKLOAD["rung_prompt_hashes"], "1": "x" * 64}}
    a = write_run(tmp_path, "a", [ok(1, 100.0)])
    b = write_run(tmp_path, "b", [dataclasses.replace(ok(1, 100.0), num_measured=8)], workload=other)
    code, _, err = _compare(capsys, a, b)
    assert code == 2 and "measured requests at c=1: a = 4, b = 8" in err and "tokenizer" not in err


def test_open_loop_request_lines_carry_their_rate_and_real_cap(fake_server, ladder):
    url = fake_server()
    code, _, _, run = ladder("--base-url", url, "--request-rate", "50,inf", *SMALL, "--prompts-per-rung", "3",
                             "--warmup", "1", "--max-concurrency", "2")
    assert code == 0
    lines = {(r["request_rate"], r["phase"], r["concurrency"]) for r in load_records(run)}
    assert lines == {(50, "warmup", 2), (50, "measured", 2), (float("inf"), "warmup", 2),
                     (float("inf"), "measured", 2)}
    code, _, _, run = ladder("--base-url", url, "--request-rate", "50", *SMALL, "--prompts-per-rung", "3")
    assert {(r["request_rate"], r["concurrency"]) for r in load_records(run)} == {(50, None)}  # uncapped
    code, _, _, run = ladder("--base-url", url, "--c", "2", *SMALL, "--prompts-per-rung", "2")
    assert {(r["request_rate"], r["concurrency"]) for r in load_records(run)} == {(None, 2)}


def test_the_out_of_a_failed_setup_is_accepted_by_overwrite(fake_server, ladder, tmp_path):
    import sys

    out = tmp_path / "failed-setup"
    dies = f"{sys.executable} -c 'import sys; print(\"no GPU\"); sys.exit(3)'"
    code, _, err, _ = ladder("--serve-cmd", dies, "--base-url", "http://127.0.0.1:9", "--out", str(out))
    assert code == 2 and "exited with code 3" in err and (out / "server.log").exists()
    args = ("--base-url", fake_server(), "--c", "1", *SMALL, "--prompts-per-rung", "1", "--out", str(out))
    code, _, err, _ = ladder(*args)
    assert code == 2 and "pass --overwrite" in err
    code, _, err, _ = ladder(*args, "--overwrite")
    assert code == 0, err
    assert not (out / "server.log").exists() and (out / "manifest.json").exists()


def test_a_tokenizer_that_is_not_the_servers_is_named_not_reported_as_overhead(fake_server, ladder, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ladder.prompts import WORDS

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)} | {"[UNK]": len(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    url = fake_server()  # 4/3 tokens a word + 7 for the template; this tokenizer counts 1 a word
    code, out, err, _ = ladder("--base-url", url, "--c", "1", "--input-len", "20", "--output-len", "4",
                               "--tokenizer", str(tmp_path / "tok.json"))
    assert code == 2 and "is it the server's tokenizer?" in err and "overhead of" not in err, (out, err)
    assert "counts 1.00 tokens a word where the server counts 1.40" in err
    assert "the server adds about 15 tokens" in err  # the template's 7 tokens and the cache-bust tag's


def test_the_end_table_shows_the_asked_percentiles_whole_on_80_columns():
    import dataclasses
    import io

    from rich.console import Console
    from run_fixtures import ok

    from ladder.display import Display
    from ladder.metrics import Summary

    slow = Summary(mean=1.0, percentiles={"p50": 123456.7, "p99.9": 987654.3})
    rung = ok(1, 100.0)
    rung = dataclasses.replace(rung, stats=dataclasses.replace(rung.stats, ttft_ms=slow, tpot_ms=slow, e2e_ms=slow))
    buf = io.StringIO()
    display = Display(Console(file=buf, width=80, highlight=False, soft_wrap=True), percentiles=(50.0, 99.9))
    display.rung_end(rung)
    display.finish()
    text = buf.getvalue()
    assert "latency per rung, ms: p50 / p99.9" in text and "…" not in text
    assert text.count("123456.7 / 987654.3") == 3, text


def test_make_demo_writes_only_gitignored_paths_and_demo_report_the_committed_ones():
    import os
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (root / "scripts" / "demo.sh").read_text()
    defaults = "\n".join(line for line in script.splitlines() if re.match(r"(RUNS|REPORT|PLOTS)=", line))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEMO_")}
    paths = subprocess.run(["bash", "-c", defaults + '\necho "$RUNS" "$REPORT" "$PLOTS"'], env=env, check=True,
                           capture_output=True, text=True).stdout.split()
    assert len(paths) == 3
    for path in paths:  # `make demo` leaves `git status` clean
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0, path
    plan = subprocess.run(["make", "-n", "demo-report"], cwd=root, env=env, capture_output=True, text=True).stdout
    assert "DEMO_REPORT=reports/demo.md DEMO_PLOTS=reports/demo" in plan and "scripts/demo.sh" in plan


def test_void_markers_of_runs_void_at_the_same_rung_do_not_overprint(tmp_path):
    from run_fixtures import ok, void, write_run

    from ladder import plots
    from ladder.runs import load_runs
    from ladder.table import TPOT

    runs = load_runs([write_run(tmp_path, label, [ok(1, 100.0), void(2)]) for label in "abc"])
    fig, ax = plots._pyplot().subplots()
    plots._against_c(ax, runs, TPOT, "p50", "TPOT")
    marks = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines if line.get_marker() == "X"]
    labels = [text.xy for text in ax.texts]
    assert len(marks) == len(set(marks)) == 3 and len(set(labels)) == 3


def test_tokens_per_chunk_above_one_without_speculation_is_explained(fake_server, ladder):
    url = fake_server(tokens_per_chunk=2)  # as a server that sends no chunk for a token without text
    code, out, _, run = ladder("--base-url", url, "--c", "1", *SMALL, "--prompts-per-rung", "1")
    (warning,) = json.loads((run / "manifest.json").read_text())["warnings"]
    assert code == 0 and warning.startswith("c=1: 2.00 tokens per chunk with no speculation reported") and warning in out
    url = fake_server(tokens_per_chunk=2, spec_k=3)  # a speculating server: tok/chunk is its acceptance
    code, _, _, run = ladder("--base-url", url, "--c", "1", *SMALL, "--prompts-per-rung", "1")
    assert code == 0 and json.loads((run / "manifest.json").read_text())["warnings"] == []
