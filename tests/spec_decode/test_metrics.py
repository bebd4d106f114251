"""SpecDecodingStats: exact counters per verify step, and per draft position."""

import pytest

from refengine.spec_decode.metrics import SpecDecodingStats


def test_counters_accumulate_over_drafts():
    stats = SpecDecodingStats()
    stats.observe_draft(3, 2)
    stats.observe_draft(3, 3)
    stats.observe_draft(2, 0)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 5)
    # Position 0 was accepted in two drafts, 1 in two, 2 in one: counts, not flags.
    assert stats.num_accepted_tokens_per_pos == [2, 2, 1]


@pytest.mark.parametrize("drafts, accepted", [(2, 3), (2, -1)])
def test_impossible_acceptance_is_refused_with_the_numbers(drafts, accepted):
    stats = SpecDecodingStats()
    with pytest.raises(ValueError, match=f"^accepted {accepted} of {drafts} draft tokens$"):
        stats.observe_draft(drafts, accepted)
    assert stats.num_drafts == 0
