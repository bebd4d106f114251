"""THE real-server test: `ladder run` end to end against a real `refengine serve` on tiny-qwen3 (a seeded
random 8-layer model that builds in milliseconds), a JSONL dataset and an open-loop --request-rate ladder.
Every request is accounted for, with exact counts; no number here depends on the machine's speed."""

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from ladder_harness import load_records, load_rungs

from ladder import rfc_json
from refengine.version import Build

REFENGINE = Path(sys.executable).parent / "refengine"


def test_jsonl_dataset_at_request_rates_against_refengine_serve(tmp_path, ladder):
    data = tmp_path / "requests.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Name three rivers.", "output_len": 5},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
         "output_len": 7},
        {"prompt": "Count to five.", "output_len": 6},
    ]) + "\n")
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 4"
    code, out, err, run = ladder("--serve-cmd", cmd, "--dataset", f"jsonl:{data}", "--ignore-eos",
                                 "--request-rate", "8,inf", "--max-concurrency", "3", "--prompts-per-rung", "5",
                                 "--warmup", "1", "--seed", "3")
    assert code == 0, (out, err)
    rungs = load_rungs(run)
    assert [(r["request_rate"], r["status"], r["num_ok"], r["num_measured"], r["num_unsent"]) for r in rungs] == [
        (8.0, "OK", 6, 5, 0), (float("inf"), "OK", 6, 5, 0)]
    assert all(1 <= r["peak_in_flight"] <= 3 for r in rungs)  # the cap held
    # The prefix cache's counters over each rung, from /metrics: the records repeat, so the later ones hit.
    assert all(r["prefix_cache"]["queries"] > 0 and 0 < r["prefix_cache"]["hit_rate"] < 1 for r in rungs), rungs
    records = load_records(run)
    assert [r["phase"] for r in records].count("measured") == 10 and len(records) == 12  # 2 x (1 + 5): none lost
    assert all(r["error"] is None and r["done"] for r in records)
    # ignore_eos: every request produced exactly its dataset output_len, as counted by the server
    assert sorted({r["max_tokens"] for r in records}) <= [5, 6, 7]
    assert all(r["completion_tokens"] == r["max_tokens"] == r["output_tokens"] for r in records)
    assert all(r["e2e_ms"] >= r["ttft_ms"] > 0 for r in records)
    manifest = rfc_json.loads((run / "manifest.json").read_text())  # inf is written "Infinity"
    assert manifest["workload"]["dataset"]["kind"] == "jsonl" and manifest["workload"]["dataset"]["num_records"] == 3
    assert manifest["workload"]["load"] == {"request_rate": [8.0, float("inf")], "burstiness": 1.0,
                                            "max_concurrency": 3}
    assert manifest["engine"]["engine"] == "refengine"


def test_random_prompts_are_sized_by_probes_that_fit_a_small_max_model_len(ladder):
    """tiny-qwen3's tokenizer is byte-level (about 6 tokens a word): the default probes of 128 and 64 words
    would be ~750 and ~380 tokens, over --max-model-len 256, and the server refuses them with a 400. The
    ladder shrinks them to what the server's max_model_len (from /v1/models) holds, says so in the manifest,
    and sizes the prompts as asked."""
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 2 --max-model-len 256"
    code, out, err, run = ladder("--serve-cmd", cmd, "--dataset", "random", "--input-len", "128", "--output-len", "4",
                                 "--c", "1", "--prompts-per-rung", "2", "--warmup", "0", "--seed", "3",
                                 # no nonce: the same probe texts every run (a 1-token probe that samples the
                                 # random model's EOS carries no output and stops the run)
                                 "--no-cache-bust")
    assert code == 0, (out, err)
    sizing = json.loads((run / "manifest.json").read_text())["workload"]["prompt_sizing"]
    assert sizing["method"] == "probe"
    assert sizing["probe_fit"]["max_model_len"] == 256 and sizing["probe_fit"]["words_asked"] == [128, 64]
    assert max(sizing["probe_tokens"]) < 256 and sizing["probe_words"][0] < 128
    records = load_records(run)
    assert len(records) == 2 and all(r["error"] is None and r["done"] for r in records)
    # sized to --input-len 128 from the fitted probes: within the ladder's own tolerance of it
    assert all(abs(r["prompt_tokens"] - 128) <= 128 * 0.1 for r in records), ([r["prompt_tokens"] for r in records], sizing)


def test_repeats_give_a_confidence_interval_per_metric(ladder):
    """--repeats 3 against the real server: one row per rung whose every metric has a mean, a 95% CI and a
    CV over the three repeats, the requests of all three in requests.jsonl, and refengine's build named."""
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 2 --max-model-len 256"
    code, out, err, run = ladder("--serve-cmd", cmd, "--input-len", "32", "--output-len", "4", "--c", "2",
                                 "--prompts-per-rung", "2", "--warmup", "0", "--seed", "3", "--no-cache-bust",
                                 "--repeats", "3", "--metrics-interval", "0.02")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    cis = rung["repeats"]["metrics"]
    assert rung["repeats"]["n"] == 3
    for path in ("output_throughput", "request_throughput", "ttft_ms.mean", "ttft_ms.p50", "tpot_ms.p99",
                 "e2e_ms.p90", "tokens_per_chunk.mean"):
        ci = cis[path]
        values = ci["values"]
        assert len(values) == 3 and ci["mean"] == pytest.approx(statistics.fmean(values))
        # Student's t with 2 degrees of freedom: 4.303 standard errors either side of the mean
        half = 4.303 * statistics.stdev(values) / math.sqrt(3)
        assert ci["ci95"] == pytest.approx([ci["mean"] - half, ci["mean"] + half])
        assert ci["cv"] == pytest.approx(statistics.stdev(values) / ci["mean"])
    assert rung["stats"]["output_throughput"] == cis["output_throughput"]["mean"]
    assert rung["stats"]["num_requests"] == 6 and rung["num_measured"] == 6
    records = load_records(run)
    assert sorted(r["repeat"] for r in records) == [0, 0, 1, 1, 2, 2]
    # The same prompts each repeat (--no-cache-bust), and every repeat starts cold: the server's prefix cache is
    # reset before each (vLLM's POST /reset_prefix_cache), so none finds what the one before it left.
    assert rung["repeats"]["prefix_cache_reset"] == ["reset"] * 3
    cached = [sum(r["cached_tokens"] for r in records if r["repeat"] == k) for k in range(3)]
    assert cached == [cached[0]] * 3, cached
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["engine_sources"]["engine_version"] == "server"
    # The server and the client run from one tree, so the engine names the client's build (in a copy of the tree
    # without .git, as the named mutations run, both say "no git commit").
    assert manifest["engine"]["engine_version"] == Build(**manifest["code"]).describe()
    # read between each repeat's first send and last end (a 20 ms interval leaves samples inside them)
    assert 1 <= rung["server_metrics"]["series"]["running"]["peak"] <= 2
