"""The shared-prefix workload (--prefix-len, --num-prefixes) and the prefix-cache hit rate read from
/metrics: n/a against the scripted server, which has no such counters; a number against refengine."""

import json
import sys
from pathlib import Path

from ladder_harness import load_records, load_rungs

REFENGINE = Path(sys.executable).parent / "refengine"


def test_prompts_share_one_of_the_prefixes_and_the_hit_rate_is_na_without_counters(fake_server, ladder):
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--c", "1,2", "--input-len", "24", "--output-len", "4",
                                 "--prefix-len", "40", "--num-prefixes", "2", "--prompts-per-rung", "6",
                                 "--save-text")
    assert (code, err) == (0, ""), out
    records = load_records(run)
    texts = [r["prompt"][0][1] for r in records]
    nonce = json.loads((run / "manifest.json").read_text())["workload"]["cache_bust"]["nonce"]
    # The run's cache-bust tag leads every prompt, so the shared prefixes after it stay shared.
    tag = f"Run {nonce}\n"
    assert all(t.startswith(tag) for t in texts)
    prefixes = {t[len(tag):].split("\n", 1)[0] for t in texts}
    suffixes = [t[len(tag):].split("\n", 1)[1] for t in texts]
    assert len(prefixes) == 2 and len(set(suffixes)) == len(suffixes)  # shared prefixes, own suffixes
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["workload"]["prompt_sizing"]["shared_prefix"] == {"prefix_len": 40, "num_prefixes": 2}
    assert all(r["prefix_cache"] is None for r in load_rungs(run))
    assert out.count("cache hits n/a") == 2  # one line per rung


def test_a_shared_prefix_ladder_against_refengine_reads_its_hit_rate(ladder):
    cmd = f"{REFENGINE} serve --model tiny-qwen3 --port {{port}} --max-num-seqs 2 --max-model-len 512"
    code, out, err, run = ladder("--serve-cmd", cmd, "--c", "1,2", "--input-len", "64", "--output-len", "4",
                                 "--prefix-len", "96", "--prompts-per-rung", "4", "--warmup", "1", "--seed", "3")
    assert code == 0, (out, err)
    rungs = load_rungs(run)
    assert [(r["status"], r["num_measured"]) for r in rungs] == [("OK", 4), ("OK", 4)]
    # Every measured prompt starts with the prefix the warmup (and the rung before) already cached.
    for r in rungs:
        assert r["prefix_cache"]["queries"] > 0 and r["prefix_cache"]["hit_rate"] > 0.5, r["prefix_cache"]
    assert all(rec["error"] is None for rec in load_records(run))
    assert "cache hits n/a" not in out and out.count("cache hits ") == 2
    # --input-len is the suffix after the shared prefix: a prompt is measured against prefix + suffix.
    assert "for --input-len 64 (" not in out, out
