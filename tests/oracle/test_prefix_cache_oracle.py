"""The prefix cache as an oracle variant that must bite: every method and front on the shared-prefix
workload with the cache on (and with a pool that forces evictions), token for token equal to the sync
no-spec baseline of that workload with the cache off, and INEFFECTIVE without hits (evictions)."""

import subprocess
import sys

import pytest

from refengine.oracle.arms import Arm, build_matrix
from refengine.oracle.judge import judge
from refengine.oracle.probe import ArmCounts
from refengine.oracle.prompts import SHARED_PREFIX_LEN, shared_prefix_prompts
from refengine.oracle.run import ArmResult, engine_kwargs
from refengine.oracle.run import Workload as OracleWorkload


def _result(arm: Arm, hits: int, evictions: int) -> ArmResult:
    counts = ArmCounts(1, 0, 0, 0, prefix_cache_hits=hits, num_evictions=evictions)
    return ArmResult(arm, 1, [[1, 2]], [[]], 1, 0, 0, counts, False, (4,))


def test_the_cache_arms_cover_every_method_and_front_against_a_cache_off_baseline():
    plain = build_matrix((None, "ngram", "eagle"), variants=False, adaptive=False)
    cached = build_matrix((None, "ngram", "eagle"), variants=False, prefix_cache="only")
    assert len(cached) == 2 * len(plain)
    assert {(a.front, a.method) for a in cached if a.evict} == {(a.front, a.method) for a in plain}
    assert all(a.prefix_cache and a.shared_prefix for a in cached)
    baseline = cached[0].baseline()
    assert (baseline.shared_prefix, baseline.prefix_cache, baseline.name) == (True, False, "sync/no-spec[shared_prefix]")
    assert cached[-1].sync_twin() == Arm("sync", "eagle", False, False, False, False, True, True, True)
    assert all(not a.prefix_cache for a in build_matrix((None,), variants=True, structured=True))


def test_the_shared_prefix_workload_shares_a_long_prefix_and_repeats_every_prompt():
    prompts = [(1, 2, 3), (4, 5)]
    shared = shared_prefix_prompts(prompts)
    assert len(shared) == 4 and shared[:2] == shared[2:]
    assert {p[:SHARED_PREFIX_LEN] for p in shared} == {(1, 2, 3, 4, 5) * 6 + (1, 2)}
    assert [p[SHARED_PREFIX_LEN:] for p in shared[:2]] == prompts


def test_only_arms_with_the_cache_on_use_it():
    workload = OracleWorkload(((1, 2, 3, 4, 5),), 4, 1, 0.0, 0, 2)
    on = Arm("sync", None, False, False, False, False, True, True)
    assert engine_kwargs(on, workload, 4)["enable_prefix_caching"] is True
    assert engine_kwargs(on.baseline(), workload, 4)["enable_prefix_caching"] is False


@pytest.mark.parametrize(
    "evict, hits, evictions, ineffective",
    [(False, 8, 0, ()), (False, 0, 0, ("prefix cache",)), (True, 8, 1, ()), (True, 8, 0, ("eviction",))],
)
def test_a_cache_arm_without_hits_or_evictions_is_ineffective(evict, hits, evictions, ineffective):
    arm = Arm("sync", None, False, False, False, False, True, True, evict)
    baseline = _result(arm.baseline(), 0, 0)
    verdict = judge(_result(arm, hits, evictions), baseline, None)
    assert verdict.ineffective == ineffective
    assert verdict.label == ("INEFFECTIVE" if ineffective else "IDENTICAL")


@pytest.mark.timeout(900)
def test_prefix_cache_arms_on_a_tiny_model_are_identical_and_bite(tmp_path):
    """Every front x method (the teachers included), greedy and seeded, one prompt set at c = 4: the
    cache arms and the evicting ones IDENTICAL, none INEFFECTIVE. The full matrix (c = 1, 2, 4, 8, crossed
    with chunking and preemption) is `make oracle`."""
    report = tmp_path / "oracle.md"
    proc = subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", "--model", "tiny-qwen3", "--c", "4", "--prompts", "4",
         "--max-tokens", "8", "--no-variants", "--no-structured", "--prefix-cache", "only", "--jobs", "2",
         "--write-report", "--report", str(report)],
        capture_output=True, text=True, timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout
    text = report.read_text()
    methods = ("no-spec", "mtp", "eagle", "eagle3", "dflash", "ngram", "draft_model", "teacher", "teacher-corrupt")
    for m in methods:
        assert f"| sync/{m}[prefix_cache] |" in text and f"| sync/{m}[prefix_cache,evict] |" in text, m
    assert "| async-d2/eagle[prefix_cache,evict] |" in text
