"""Adaptive verification in the scheduler (spec_decode/adaptive_verification.py): the K it chooses cuts a
request's drafts (sync) or -1 placeholders (async) before the step is planned, so the placeholders,
rollback and draft accounting follow the chosen K. The policy runs on given tables here.

Invariant numbers refer to docs/invariants.md.
"""

import pytest

from refengine.spec_decode.adaptive_verification import AdaptiveVerification, VerifyCostTable

from .harness import make_request, make_scheduler, runner_output

K = 3


def policy(seconds: list[float]) -> AdaptiveVerification:
    return AdaptiveVerification(VerifyCostTable.monotone([1], [seconds]))


CHEAP = [1.0, 1.001, 1.002, 1.003]  # every draft pays
ONE_PAYS = [1.0, 1.01, 100.0, 100.0]  # only the first draft pays


def test_a_request_holding_fewer_drafts_is_given_no_more():
    """Invariant 60: K <= the drafts a request holds (a drafter may propose fewer than k)."""
    scheduler = make_scheduler(k=K, verify_policy=policy(CHEAP))
    scheduler.add_request(make_request("a", 8, max_tokens=50))
    so = scheduler.schedule()
    scheduler.update_from_output(so, runner_output(so, {"a": [1]}))
    scheduler.update_draft_token_ids({"a": [5]})
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens["a"] == [5] and so.num_scheduled_tokens["a"] == 2
    assert scheduler.verify_policy.num_chosen == [0, 1, 0, 0]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_short_verify_rolls_back_and_releases_its_placeholders(async_scheduling):
    """K = 1 of k = 3: one draft (sync) or one -1 placeholder (async) is scheduled, the output reserves
    1 + 1 placeholders, and a rejection rolls back to nc - ph = nt - 1 (invariants 4, 5, 60)."""
    scheduler = make_scheduler(async_scheduling=async_scheduling, k=K, verify_policy=policy(ONE_PAYS))
    request = make_request("a", 8, max_tokens=50)
    scheduler.add_request(request)
    so = scheduler.schedule()
    scheduler.update_from_output(so, runner_output(so, {"a": [1]}))
    if not async_scheduling:
        scheduler.update_draft_token_ids({"a": [5, 6, 7]})
    so = scheduler.schedule()
    assert len(so.scheduled_spec_decode_tokens["a"]) == 1 and so.num_scheduled_tokens["a"] == 2
    assert request.num_output_placeholders == (2 if async_scheduling else 0)
    if async_scheduling:
        scheduler.update_draft_token_ids_in_output({"a": [5, 6, 7]}, so)
        assert so.scheduled_spec_decode_tokens["a"] == [5]
    scheduler.update_from_output(so, runner_output(so, {"a": [9]}))  # its one draft rejected
    assert request.output_token_ids == (1, 9)
    assert request.num_computed_tokens - request.num_output_placeholders == request.num_tokens - 1
    assert scheduler.verify_policy.num_chosen[1] == 1
    assert request.spec_decoding_stats.num_draft_tokens_per_pos == [1]
