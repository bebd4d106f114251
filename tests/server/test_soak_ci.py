"""The soak harness (benchmarks/soak/) cut to CI size: 60 s of its mixed, hostile load on
`refengine serve --model tiny-qwen3` with eagle (async scheduling). Counts only: no 5xx, no leaked KV
block, /metrics agreeing with the client, every variant of the mix seen, a clean exit on SIGTERM.
Timing and memory thresholds need the long run (`make soak`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# alone: every variant of the mix must happen within the minute, and a malformed request that meets a full
# queue can be refused with 429 instead, so a core taken by another test can starve that variant.
@pytest.mark.alone
def test_a_minute_of_mixed_load_leaves_no_5xx_no_leak_and_metrics_equal_to_client_counts(tmp_path):
    out = tmp_path / "soak.json"
    args = [
        "--model", "tiny-qwen3", "--max-model-len", "1024", "--concurrency", "8", "--slow-clients", "1",
        "--duration", "60", "--sample-every", "15", "--burst-every", "15",
        "--max-num-seqs", "4", "--max-waiting-requests", "4", "--counts-only", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", *args], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    failed = [v for v in result["verdicts"] if not v["ok"]]
    assert not failed, failed
    assert len(result["verdicts"]) == 8
    tally = result["tally"]
    assert not tally["server_errors"] and not tally["transport_errors"]
    assert sum(tally["completed"].values()) > 0 and tally["refused_429"] > 0
    assert tally["aborted_by_client"] > 0 and sum(tally["malformed"].values()) > 0
    final = result["final_metrics"]
    assert final["refengine:kv_cache_free_blocks"] == final["refengine:kv_cache_total_blocks"]
    assert final["refengine:request_rejected_total[reason=queue_full]"] == tally["refused_429"]
