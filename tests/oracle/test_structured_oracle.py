"""The oracle's structured arms: the matrix holds them and the judge has teeth for them (they run in CI with
the full tiny-model matrix, tests/oracle/test_oracle.py)."""



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
