"""The oracle command over its whole matrix on a tiny model, and the comparison logic it rests on."""

import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from refengine.engine.outputs import StepRecord
from refengine.oracle.arms import Arm, build_matrix
from refengine.oracle.command import oracle_command
from refengine.oracle.judge import StepComparison, compare_steps, first_divergence, judge
from refengine.oracle.probe import ArmCounts
from refengine.oracle.prompts import token_prompts
from refengine.oracle.run import ArmResult, Workload
from refengine.oracle.runner import arm_runner, resolve_model


def result(arm, tokens, steps=None, accepted=5, drafted=10, random_init=False, counts=None, concurrency=1):
    # Prompts of 4 tokens: a record at position 5 follows the first output token.
    counts = counts or ArmCounts(peak_concurrency=concurrency, num_preemptions=1, num_preemptions_after_drafts=1,
                                 num_chunked_prefills=1)
    return ArmResult(arm, concurrency, tokens, steps or [[] for _ in tokens], 1, drafted, accepted, counts, random_init,
                     (4,) * len(tokens))


def test_matrix_skips_async_arms_of_sync_only_methods():
    arms = build_matrix((None, "ngram", "eagle"))
    assert all(a.front == "sync" for a in arms if a.method == "ngram")
    assert {a.front for a in arms if a.method == "eagle"} == {"sync", "async-d1", "async-d2"}
    assert len(arms) == 8 * (3 + 1 + 3) + 3  # and eagle's adaptive arm per front
    assert {a.front for a in arms if a.adaptive} == {"sync", "async-d1", "async-d2"}
    assert all(a.method == "eagle" and not (a.chunked or a.preempt or a.bad_words) for a in arms if a.adaptive)
    assert not any(a.adaptive for a in build_matrix((None, "eagle"), adaptive=False))  # tensor parallelism


def test_first_divergence_reports_request_position_and_tokens():
    assert first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) is None
    d = first_divergence([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]])
    assert (d.request, d.position, d.expected, d.actual) == (1, 1, 5, 6)
    d = first_divergence([[1, 2, 3]], [[1, 2]])
    assert (d.position, d.expected, d.actual) == (2, 3, None)


def test_judge_compares_tokens_in_full_and_steps_with_the_sync_twin():
    sync = Arm("sync", "eagle", False, False, False)
    async_arm = Arm("async-d2", "eagle", False, False, False)
    base = result(Arm("sync", None, False, False, False), [[1, 2]])
    twin = result(sync, [[1, 2]], [[StepRecord(5, (7, 8), 1)]])
    same = result(async_arm, [[1, 2]], [[StepRecord(5, (7, 8), 1)]])
    assert judge(same, base, twin).label == "IDENTICAL"
    other_drafts = result(async_arm, [[1, 2]], [[StepRecord(5, (7, 9), 1)]])
    assert "position 5" in judge(other_drafts, base, twin).step_mismatch
    # Drafts verified elsewhere (async preempts at other steps): noted, and the tokens still compared in
    # full, seeded ones too (position-keyed sampling makes spec on equal spec off).
    moved = result(async_arm, [[1, 3]], [[StepRecord(6, (8, 4), 0)]])
    verdict = judge(moved, base, twin)
    assert verdict.label == "MISMATCH" and verdict.divergence.position == 1
    assert any("placement" in n for n in verdict.notes)


@pytest.mark.parametrize("drafted, accepted, vacuous", [(10, 4, True), (10, 5, False), (1000, 9, True), (1000, 10, False)])
def test_vacuity_needs_five_tokens_or_one_percent_of_the_drafts(drafted, accepted, vacuous):
    base = result(Arm("sync", None, False, False, False), [[1, 2]])
    for method in ("ngram", "draft_model", "eagle", "teacher"):
        arm = result(Arm("sync", method, False, False, False), [[1, 2]], accepted=accepted, drafted=drafted)
        assert (judge(arm, base, None).label == "VACUOUS") == vacuous
    exempt = result(Arm("sync", "eagle", False, False, False), [[1, 2]], accepted=0, random_init=True)
    assert judge(exempt, base, None).label == "IDENTICAL"


def test_a_variant_without_evidence_is_ineffective_and_low_peak_fails():
    base = result(Arm("sync", None, False, False, True), [[1, 2]])
    arm = Arm("sync", None, True, True, True)
    none = ArmCounts(peak_concurrency=4, num_preemptions=2, num_preemptions_after_drafts=0, num_chunked_prefills=0)
    verdict = judge(result(arm, [[1, 2]], counts=none, concurrency=4), base, None, bad_words_changed=0)
    assert verdict.label == "INEFFECTIVE"
    assert verdict.ineffective == ("preemption", "chunked prefill", "bad_words")
    low = ArmCounts(peak_concurrency=3, num_preemptions=1, num_preemptions_after_drafts=1, num_chunked_prefills=1)
    assert judge(result(arm, [[1, 2]], counts=low, concurrency=4), base, None, 1).label == "LOW-CONCURRENCY"


@pytest.mark.parametrize("short, label", [(0, "INEFFECTIVE"), (1, "IDENTICAL")])
def test_an_adaptive_arm_must_verify_fewer_than_k_somewhere(short, label):
    base = result(Arm("sync", None, False, False, False), [[1, 2]])
    counts = ArmCounts(peak_concurrency=1, num_preemptions=0, num_preemptions_after_drafts=0, num_chunked_prefills=0,
                       num_short_verifies=short)
    arm = Arm("sync", "eagle", False, False, False, adaptive=True)
    verdict = judge(result(arm, [[1, 2]], counts=counts), base, None)
    assert verdict.label == label and verdict.ineffective == (("adaptive K",) if short == 0 else ())
    assert arm.name == "sync/eagle[adaptive]"


@pytest.mark.parametrize(
    "fed, accepted, ok",
    [((7, 8), 1, True), ((7,), 1, True), ((7,), 0, False), ((7, 8, 9), 1, True), ((7, 8, 9), 2, False)],
)
def test_steps_compare_the_common_prefix_of_drafts_at_a_position(fed, accepted, ok):
    """A smaller budget share feeds fewer of the same drafts; acceptance within the shorter prefix must agree."""
    arm = Arm("sync", "eagle", False, False, False)
    twin = result(arm, [[1, 2]], [[StepRecord(5, (7, 8), 1)]])
    assert (compare_steps(twin, result(arm, [[1, 2]], [[StepRecord(5, fed, accepted)]])).mismatch is None) == ok


def test_steps_are_compared_only_after_the_same_tokens():
    """Seeded arms whose drafts moved sample different tokens; past the first difference the drafter sees
    another context, so its drafts there are not evidence of anything."""
    arm = Arm("sync", "eagle", False, False, False)
    twin = result(arm, [[1, 2, 3, 4]], [[StepRecord(5, (7, 8), 1), StepRecord(7, (5, 5), 0)]])
    diverged = result(arm, [[1, 2, 9, 4]], [[StepRecord(5, (7, 8), 1), StepRecord(7, (6, 6), 0)]])
    assert compare_steps(twin, diverged) == StepComparison(None, 1)
    agreed = result(arm, [[1, 2, 3, 4]], [[StepRecord(5, (7, 8), 1), StepRecord(7, (6, 6), 0)]])
    assert "position 7" in compare_steps(twin, agreed).mismatch


@pytest.mark.parametrize(
    "device, message",
    [("tpu", "expected cpu or cuda[:N]"), pytest.param("cuda", "no CUDA device", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this host has a GPU"))],
)
def test_device_is_validated_before_anything_runs(device, message):
    result = CliRunner().invoke(oracle_command, ["--model", "tiny-llama", "--device", device])
    assert result.exit_code == 2 and message in result.output


def oracle(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", *args], capture_output=True, text=True, timeout=1700,
        cwd=cwd,
    )


@pytest.mark.timeout(300)
def test_worker_pool_returns_the_in_process_results_in_order():
    """Tokens, per-step records and counters come back from the workers unchanged, in the order given."""
    model = resolve_model("tiny-llama")
    prompts = tuple(map(tuple, token_prompts(model.config.vocab_size, 2, seed=0)))
    workload = Workload(prompts, 6, 2, 0.8, 0, 3, bad_words_token_ids=((prompts[0][1],),))
    arms = build_matrix((None, "eagle"))[::5]  # every front, both methods, each variant flag
    in_process, finished_here = run_arms(model, arms, workload, jobs=1)
    pooled, finished_there = run_arms(model, arms, workload, jobs=2)
    assert [r.arm for r in pooled] == arms
    assert sorted(finished_here, key=arms.index) == sorted(finished_there, key=arms.index) == arms
    assert pooled == in_process


def run_arms(model, arms, workload, jobs):
    finished = []
    with arm_runner("tiny-llama", model, 4, jobs) as runner:
        results = runner.run([(arm, workload) for arm in arms], lambda w, r: finished.append(r.arm))
    return results, finished


@pytest.mark.timeout(300)
def test_jobs_leave_the_report_unchanged(tmp_path):
    """--jobs 2 writes the report --jobs 1 writes, apart from the date, the elapsed time and the host line
    (which names the worker processes)."""
    reports = []
    for jobs in ("1", "2"):
        (tmp_path / jobs).mkdir()
        proc = oracle("--model", "tiny-llama", "--methods", "none,eagle", "--c", "2", "--prompts", "2",
                      "--max-tokens", "6", "--jobs", jobs, "--prefix-cache", "off", "--write-report", cwd=tmp_path / jobs)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "0 failed arm(s)" in proc.stdout
        # one warning per process about the random eagle head, not one per arm; runs and arms told apart
        warned = (proc.stdout + proc.stderr).count("runs with randomly initialised head weights")
        assert 1 <= warned <= int(jobs), proc.stderr[-2000:]
        judged = int(proc.stdout.split("failed arm(s) of ")[1].split(" ")[0])
        runs = int(proc.stdout.split("[run 1/")[1].split("]")[0])
        assert f"= {judged} arms to judge, in {runs} engine runs" in proc.stdout and runs > judged
        text = (tmp_path / jobs / "reports" / "oracle.md").read_text()
        reports.append([line for line in text.splitlines() if not line.startswith(("**Result:", "- c = "))])
    assert reports[0] == reports[1]
    assert "2 worker processes" in (tmp_path / "2" / "reports" / "oracle.md").read_text()


@pytest.mark.timeout(300)
def test_merge_combines_c_slices_into_one_report(tmp_path):
    """Two --c slices written apart, then merged: one header, a log line per slice, both slices' tables
    in c order, and the arm counts summed; merging a slice with itself is refused."""
    for c in ("2", "1"):
        proc = oracle("--model", "tiny-llama", "--methods", "none,teacher", "--c", c, "--prompts", "2",
                      "--max-tokens", "6", "--no-variants", "--prefix-cache", "off", "--write-report", "--report", f"slices/c{c}.md", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    slices = [str(tmp_path / "slices" / f"c{c}.json") for c in ("2", "1")]
    merged = CliRunner().invoke(oracle_command, ["merge", *slices, "--out", str(tmp_path / "oracle.md")])
    assert merged.exit_code == 0, merged.output
    text = (tmp_path / "oracle.md").read_text()
    one = (tmp_path / "slices" / "c1.md").read_text()
    arms_per_slice = int(one.split("failed arm(s) of ")[1].split(" ")[0])
    assert f"**Result: 0 failed arm(s) of {2 * arms_per_slice} " in text and "c = 1, 2" in text
    assert text.index("### c=1, greedy") < text.index("### c=1, temperature") < text.index("### c=2, greedy")
    assert text.count("\n- c = ") == 2 and text.count("# Token-identity oracle") == 1
    twice = CliRunner().invoke(oracle_command, ["merge", slices[0], slices[0], "--out", str(tmp_path / "x.md")])
    assert twice.exit_code == 2 and "two slices ran the same c" in twice.output and not (tmp_path / "x.md").exists()


@pytest.mark.timeout(1800)
def test_full_matrix_on_a_tiny_model_is_identical(tmp_path):
    """Every front x method (the teachers included) x chunking x preemption x bad_words arm, every front x
    method structured-output arm (a JSON schema, a regex, a choice set), and every front x Eagle-type method
    (teachers included) adaptive-verification arm, greedy and seeded: 0 failed arms (no
    MISMATCH, VACUOUS, INEFFECTIVE, LOW-CONCURRENCY or WRONG; a structured arm must also bite, end by its
    grammar and validate)."""
    report = tmp_path / "oracle.md"
    proc = oracle("--model", "tiny-qwen3", "--c", "1,4", "--prompts", "4", "--max-tokens", "8", "--jobs", "2", "--prefix-cache", "off",
                  "--write-report", "--report", str(report))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout
    methods = ("no-spec", "mtp", "eagle", "eagle3", "dflash", "ngram", "draft_model", "teacher", "teacher-corrupt")
    text = report.read_text()
    assert all(f"| sync/{m}[structured] |" in text for m in methods), text[:4000]
    # Adaptive verification: every Eagle-type method and teacher, every front (each also proved it
    # verified fewer than k drafts somewhere, or it would be INEFFECTIVE).
    adaptive = ("mtp", "eagle", "eagle3", "dflash", "teacher", "teacher-corrupt")
    assert all(f"| {f}/{m}[adaptive] |" in text for m in adaptive for f in ("sync", "async-d1", "async-d2")), text[:4000]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pinned_smollm2_subset_is_identical():
    """Every engine method at depth 1 and 2 with the trained heads, c = 1 and 4, greedy, 4 prompts x 16 tokens
    on the embedded model (ngram and the 1-layer self-draft each accept about 10 tokens at c = 1, over the
    vacuity bar of 5),
    two worker processes. The teachers and the variants run on the tiny model above; the full matrix is
    `make oracle`. Slow (about 3.5 minutes on two cores): `make test-slow` runs it, and CI keeps the trained
    heads' losslessness in tests/train/test_shipped_heads.py."""
    proc = oracle("--model", "smollm2", "--methods", "none,ngram,draft_model,eagle,eagle3,mtp,dflash", "--c", "1,4",
                  "--prompts", "4", "--max-tokens", "16", "--no-variants", "--no-seeded", "--no-structured", "--prefix-cache", "off", "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout
