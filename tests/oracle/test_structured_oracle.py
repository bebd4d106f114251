"""The oracle's structured arms: a pinned subset on a tiny model in CI, and the judge's teeth for them."""

import subprocess
import sys

import pytest

from refengine.oracle.arms import Arm, build_matrix
from refengine.oracle.judge import judge
from refengine.oracle.probe import ArmCounts
from refengine.oracle.run import ArmResult


def test_structured_arms_are_one_per_method_and_front():
    arms = build_matrix((None, "eagle"), variants=True, structured=True)
    structured = [a for a in arms if a.structured]
    assert len(structured) == 6 and all(not (a.chunked or a.preempt or a.bad_words) for a in structured)
    assert {a.baseline() for a in structured} == {Arm("sync", None, False, False, False, True)}
    assert not any(a.structured for a in build_matrix((None,), variants=True))


def result(arm: Arm, tokens, *, cut=0, masked=0, ended=None) -> ArmResult:
    return ArmResult(arm, 1, tokens, [[] for _ in tokens], 3, 0, 0, ArmCounts(1, 0, 0, 0), False,
                     tuple(1 for _ in tokens), num_grammar_cut_drafts=cut, num_grammar_masked_rows=masked,
                     num_ended_by_grammar=len(tokens) if ended is None else ended)


def test_a_structured_arm_must_bite_and_end_by_its_grammar():
    arm = Arm("sync", None, False, False, False, True)
    for bitten in (result(arm, [[1, 2], [3]], masked=1), result(arm, [[1, 2], [3]], cut=1)):
        assert judge(bitten, bitten, None).ok
    toothless = result(arm, [[1, 2], [3]])
    assert judge(toothless, toothless, None).ineffective == ("structured",)
    unfinished = result(arm, [[1, 2], [3]], masked=3, ended=1)
    assert judge(unfinished, unfinished, None).ineffective == ("grammar end",)


@pytest.mark.timeout(900)
def test_pinned_structured_subset_on_a_tiny_model_is_identical():
    """No spec, eagle (random weights) and both teachers, at every front, greedy and seeded, c = 1 and 4:
    the structured arms equal their sync no-spec baseline token for token, are valid, end by their
    grammar and bite (the plain arms of the same methods run alongside as references)."""
    proc = subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", "--model", "tiny-qwen3", "--methods",
         "none,eagle,teacher,teacher-corrupt", "--c", "1,4", "--prompts", "4", "--max-tokens", "8", "--no-variants",
         "--structured", "--jobs", "2"],
        capture_output=True, text=True, timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout and "[structured]" in proc.stdout
