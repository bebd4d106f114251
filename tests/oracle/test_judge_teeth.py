"""The judge's teeth on real engine runs (tiny-qwen3): each way an arm can pass without testing anything
fails it. Forced preemption switched off leaves a preempt arm INEFFECTIVE; a teacher that never matches
is VACUOUS; an arm that never runs c requests at once fails; a bad_words arm whose words never come up is
INEFFECTIVE; and the absolute checks catch output that no baseline comparison would."""

import dataclasses

import pytest
from click.testing import CliRunner

from refengine.oracle import run
from refengine.oracle.absolute import (
    banned_occurrences,
    detokenize,
    greedy_argmax_mismatches,
    stop_string_violations,
    stop_violations,
)
from refengine.oracle.arms import Arm
from refengine.oracle.command import oracle_command, with_stop
from refengine.oracle.judge import bad_words_changes, judge
from refengine.oracle.probe import SchedulerProbe
from refengine.oracle.prompts import token_prompts
from refengine.oracle.run import Workload, run_arm
from refengine.oracle.runner import resolve_model
from refengine.sample.sampler import RowParams
from refengine.sampling_params import SamplingParams

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def model():
    return resolve_model("tiny-qwen3")


def workload(model, concurrency: int, num_prompts: int, temperature: float = 0.0) -> Workload:
    prompts = tuple(map(tuple, token_prompts(model.config.vocab_size, num_prompts, seed=0)))
    return Workload(prompts, 8, concurrency, temperature, 0, 3)


def teacher_arm(model, arm: Arm, w: Workload):
    """The teacher arm with its baseline run first, as the oracle does."""
    baseline = run_arm(model, arm.baseline(), w, BLOCK_SIZE)
    w = dataclasses.replace(w, teacher_outputs=tuple(map(tuple, baseline.tokens)))
    return run_arm(model, arm, w, BLOCK_SIZE), baseline


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_forced_preemption_bites_at_c1_and_is_ineffective_when_switched_off(model, monkeypatch, temperature):
    """At c = 1 a pool never runs short, so only the forced eviction preempts; the resumed request
    re-prefills past its verified drafts and still emits the baseline's tokens and accepts every draft."""
    arm = Arm("async-d2", "teacher", False, True, False)
    w = workload(model, 1, 2, temperature)
    forced, baseline = teacher_arm(model, arm, w)
    verdict = judge(forced, baseline, None)
    assert forced.counts.num_preemptions_after_drafts == 2  # each request once
    assert verdict.label == "IDENTICAL", verdict

    def unforced(scheduler, *, spec, force_preemption):
        return SchedulerProbe(scheduler, spec=spec, force_preemption=False)

    monkeypatch.setattr(run, "SchedulerProbe", unforced)
    verdict = judge(teacher_arm(model, arm, w)[0], baseline, None)
    assert verdict.label == "INEFFECTIVE" and verdict.ineffective == ("preemption",)


def test_a_teacher_that_never_matches_is_vacuous(model, monkeypatch):
    arm = Arm("sync", "teacher-corrupt", False, False, False)
    monkeypatch.setattr(run, "CORRUPT_INDEX", 0)  # every first draft wrong: nothing is ever accepted
    result, baseline = teacher_arm(model, arm, workload(model, 2, 2))
    assert result.num_draft_tokens > 0 and result.num_accepted_tokens == 0
    assert judge(result, baseline, None).label == "VACUOUS"


def test_corrupted_teacher_accepts_exactly_the_scripted_drafts(model):
    arm = Arm("async-d1", "teacher-corrupt", True, True, False)
    result, baseline = teacher_arm(model, arm, workload(model, 2, 3, 0.8))
    records = [r for steps in result.steps for r in steps]
    assert records and {r.num_accepted for r in records if -1 not in r.draft_token_ids} == {1}
    assert judge(result, baseline, None).label == "IDENTICAL"


def test_an_arm_that_never_runs_c_requests_at_once_fails(model):
    """Two prompts at c = 4: the engine could run four, the workload never asks it to."""
    w = workload(model, 4, 2)
    result = run_arm(model, Arm("sync", None, False, False, False), w, BLOCK_SIZE)
    assert result.counts.peak_concurrency == 2
    assert judge(result, result, None).label == "LOW-CONCURRENCY"


def test_the_command_refuses_fewer_prompts_than_c():
    out = CliRunner().invoke(oracle_command, ["--model", "tiny-qwen3", "--c", "1,4", "--prompts", "3"])
    assert out.exit_code == 2 and "--prompts 3 is fewer than c = 4" in out.output and "Traceback" not in out.output


def test_bad_words_that_never_come_up_are_ineffective(model):
    w = workload(model, 2, 2)
    plain = run_arm(model, Arm("sync", None, False, False, False), w, BLOCK_SIZE)
    arm = Arm("sync", None, False, False, True)
    for banned, changed in ((((plain.tokens[0][2],),), 1), (((model.config.vocab_size - 1,),), 0)):
        result = run_arm(model, arm, dataclasses.replace(w, bad_words_token_ids=banned), BLOCK_SIZE)
        assert bad_words_changes(result, plain, w.prompts, banned) >= changed
        expected = "IDENTICAL" if changed else "INEFFECTIVE"
        assert judge(result, result, None, bad_words_changes(result, plain, w.prompts, banned)).label == expected


def test_absolute_checks_catch_what_every_arm_would_share(model):
    assert banned_occurrences([1, 2], [3, 4, 5], [(2, 3), (5,), (9,)]) == [
        "banned [2, 3] at output position 0", "banned [5] at output position 2"]
    assert banned_occurrences([2, 3], [4], [(2, 3)]) == []  # wholly inside the prompt: not the output's
    prompt = token_prompts(model.config.vocab_size, 1, seed=0)[0]
    plain = run_arm(model, Arm("sync", None, False, False, False), workload(model, 1, 1), BLOCK_SIZE)
    out = plain.tokens[0]
    greedy = RowParams(0.0, 0, 1.0, 0, (), (), rng_key=0)
    assert greedy_argmax_mismatches(model, prompt, out, greedy) == (len(out), [])
    wrong = [*out[:3], (out[3] + 1) % model.config.vocab_size, *out[4:]]
    checked, mismatches = greedy_argmax_mismatches(model, prompt, wrong, greedy)
    assert checked == len(out) and mismatches[0].startswith("output position 3")
    # With the argmax banned, or a stop below min_tokens, the runner-up is what greedy must emit.
    banned = dataclasses.replace(greedy, bad_words_token_ids=((out[0],),))
    assert greedy_argmax_mismatches(model, prompt, out, banned)[1][0].startswith("output position 0")
    early_stop = dataclasses.replace(greedy, min_tokens=1, stop_token_ids=(out[0],))
    assert greedy_argmax_mismatches(model, prompt, out, early_stop)[1][0].startswith("output position 0")


@pytest.mark.parametrize(
    "output, expected",
    [
        ([1, 2, 3, 4, 5, 6], []),
        ([1, 2, 3, 4, 9], []),  # the stop after min_tokens ends the request
        ([1, 2, 3], ["3 tokens without a stop, max_tokens 6"]),
        ([1, 9], ["stop token 9 at output position 1, min_tokens 3"]),
        ([1, 2, 3, 9, 5], ["stop token at output position 3 but 5 tokens"]),
    ],
)
def test_stop_violations(output, expected):
    assert stop_violations(output, SamplingParams(max_tokens=6, min_tokens=3, stop_token_ids=[9])) == expected


def test_every_arm_stops_request_0_after_min_tokens(model):
    """The oracle's stop: a token the request emits early without it, so the mask below min_tokens is
    what keeps it going; with the stop the arm is still judged IDENTICAL and passes its absolute checks."""
    w = workload(model, 2, 2, temperature=0.8)
    unstopped = run_arm(model, Arm("sync", None, False, False, False), w, BLOCK_SIZE)
    stopped_w = with_stop(w, unstopped, model.tokenizer)
    assert stopped_w.stop_token_id == unstopped.tokens[0][1] and stopped_w.min_tokens == 4
    base = run_arm(model, Arm("sync", None, False, False, False), stopped_w, BLOCK_SIZE)
    arm = run_arm(model, Arm("async-d2", "eagle", True, True, False), stopped_w, BLOCK_SIZE)
    assert base.tokens[0][1] != unstopped.tokens[0][1]  # masked at position 1, below min_tokens
    # Request 1 met its stop string, so the check that the text is cut exactly there ran.
    assert stopped_w.stop_string and stopped_w.stop_string in detokenize(model.tokenizer, base.tokens[1])
    assert judge(arm, base, None).label == "IDENTICAL" and not base.violations


def test_stop_string_violations(model):
    tok = model.tokenizer
    ids = tok.encode("one two three four", add_special_tokens=False)
    upto_three = tok.encode("one two three", add_special_tokens=False)
    assert stop_string_violations(tok, upto_three, "one two", " three") == []
    assert stop_string_violations(tok, upto_three, "one two three", " three") == [
        "text cut at 13 characters, the stop string ' three' begins at 7"]
    assert stop_string_violations(tok, ids, "one two", " three") == ["output goes on after the stop string ' three'"]
    assert stop_string_violations(tok, ids, "one two three four", "five") == []
    assert stop_string_violations(tok, ids, "one two three", "five") == [
        "text 'one two three' is not the output's 'one two three four'"]
