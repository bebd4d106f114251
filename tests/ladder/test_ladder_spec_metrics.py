"""Per-request speculative metrics, end to end: `ladder run` against a real `refengine serve` (tiny-qwen3,
ngram drafting, repetitive prompts so that drafts are accepted) reads each request's drafts from its usage,
and each rung's acceptance over its requests has the /metrics figure for the same window as its weighted
mean. Against a server that reports no per-request figures the rung keeps its /metrics deltas alone."""

import json
import math
import sys
from pathlib import Path

import pytest
from ladder_harness import load_records, load_rungs

from ladder.cli import main

REFENGINE = Path(sys.executable).parent / "refengine"
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
PROMPTS = [("chat", "the cat sat the cat sat the cat sat"), ("math", "1 2 3 4 1 2 3 4 1 2 3 4"),
           ("chat", "red blue red blue red blue red blue"), ("math", "2 4 6 8 2 4 6 8 2 4 6 8")]


def test_per_request_acceptance_has_metrics_figure_as_its_weighted_mean(tmp_path, ladder):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "output_len": 16 + 4 * i, "content_type": kind}) + "\n"
                            for i, (kind, p) in enumerate(PROMPTS)))
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 4 --speculative-config '{NGRAM}'"
    code, out, err, run = ladder("--serve-cmd", cmd, "--dataset", f"jsonl:{data}", "--ignore-eos", "--c", "1,2",
                                 "--prompts-per-rung", "4", "--warmup", "0", "--seed", "3")
    assert code == 0, (out, err)
    rungs = load_rungs(run)
    assert [r["status"] for r in rungs] == ["OK", "OK"]
    measured = [r for r in load_records(run) if r["phase"] == "measured"]
    assert len(measured) == 8 and all(r["spec"] and r["spec"]["num_spec_steps"] > 0 for r in measured)
    for rung in rungs:
        dist, metrics = rung["spec_requests"], rung["spec"]
        assert dist["num_requests"] == 4 and sum(dist["histogram"]["counts"]) == 4
        # the same window from both sides: the requests' usage, and /metrics' counter deltas
        assert math.isclose(dist["weighted_acceptance_length"], metrics["acceptance_length"]), (dist, metrics)
        assert math.isclose(dist["acceptance_rate"], metrics["acceptance_rate"])
        assert dist["p10"] <= dist["p50"] <= dist["p90"]
        mine = [r for r in measured if r["concurrency"] == rung["concurrency"]]
        lengths = sorted(1 + r["spec"]["num_accepted_tokens"] / r["spec"]["num_spec_steps"] for r in mine)
        assert lengths[0] <= dist["p10"] and dist["p90"] <= lengths[-1]
        assert 1 < dist["weighted_acceptance_length"] <= 4  # drafts were accepted: else this proves nothing
        # per content type: each type's requests alone, and together they are the rung's
        by_type = rung["by_content"]
        assert set(by_type) == {r["content_type"] for r in mine} and len(by_type) >= 1
        for kind, stats in by_type.items():
            own = [r for r in mine if r["content_type"] == kind]
            assert stats["num_requests"] == len(own) == stats["spec"]["num_requests"]
            assert math.isclose(stats["tpot_ms"]["mean"], sum(r["tpot_ms"] for r in own) / len(own))
            accepted = sum(r["spec"]["num_accepted_tokens"] for r in own)
            assert math.isclose(stats["spec"]["weighted_acceptance_length"],
                                1 + accepted / sum(r["spec"]["num_spec_steps"] for r in own))
        assert sum(s["num_requests"] for s in by_type.values()) == len(mine)
    assert "per request p10/p50/p90" in out and "math: tpot" in out
    # compare draws each rung's histogram of per-request acceptance lengths
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(run), "--out", str(tmp_path / "report.md"), "--plots", str(tmp_path / "plots")])
    assert exc.value.code == 0 and (tmp_path / "plots" / "acceptance.png").stat().st_size > 0
    assert "acceptance.png" in (tmp_path / "report.md").read_text()


def test_a_server_without_per_request_figures_keeps_the_metrics_deltas(fake_server, ladder):
    url = fake_server(spec_k=3, tokens_per_chunk=2)
    code, out, err, run = ladder("--base-url", url, "--input-len", "64", "--output-len", "8", "--c", "1",
                                 "--prompts-per-rung", "2", "--warmup", "0")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    assert rung["spec"]["acceptance_length"] > 1 and rung["spec_requests"] is None
    assert all(r["spec"] is None for r in load_records(run))


def test_per_request_figures_and_content_types_from_a_scripted_server(tmp_path, fake_server, ladder):
    """The same reading against the scripted server, whose every chunk is one verify of 3 drafts carrying 2
    tokens (the last chunk 1 when the length is odd): requests of 8 and 5 tokens accept 4 of 4 steps and 2 of
    3, so the step-weighted mean (the /metrics figure) and the mean over requests differ, and each content
    type has its own."""
    data = tmp_path / "typed.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{kind} prompt number {i} " * 12, "output_len": n,
                                        "content_type": kind}) + "\n"
                            for i, (kind, n) in enumerate([("chat", 8), ("math", 5), ("code", 5), ("chat", 8)])))
    url = fake_server(spec_k=3, tokens_per_chunk=2, spec_usage=True)
    code, out, err, run = ladder("--base-url", url, "--dataset", f"jsonl:{data}", "--ignore-eos", "--c", "2",
                                 "--prompts-per-rung", "8", "--warmup", "0", "--seed", "1")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    measured = load_records(run)
    dist, metrics = rung["spec_requests"], rung["spec"]
    assert all(r["spec"] for r in measured) and dist["num_requests"] == len(measured) == 8
    assert math.isclose(dist["weighted_acceptance_length"], metrics["acceptance_length"])
    lengths = [1 + r["spec"]["num_accepted_tokens"] / r["spec"]["num_spec_steps"] for r in measured]
    assert not math.isclose(dist["weighted_acceptance_length"], sum(lengths) / len(lengths))
    assert math.isclose(dist["mean_of_requests"], sum(lengths) / len(lengths))
    by_type = rung["by_content"]
    for kind, stats in by_type.items():
        own = [r for r in measured if r["content_type"] == kind]
        assert stats["num_requests"] == len(own) == stats["spec"]["num_requests"] > 0
        want = 2.0 if kind == "chat" else 1 + 2 / 3  # 8 tokens: 4 steps, 4 accepted; 5 tokens: 3 steps, 2
        assert math.isclose(stats["spec"]["weighted_acceptance_length"], want), (kind, stats)
    assert set(by_type) == {r["content_type"] for r in measured} and len(by_type) >= 2
