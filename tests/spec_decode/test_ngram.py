from refengine.spec_decode.ngram import propose_ngram


def test_longest_and_latest_match_wins():
    ids = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    # suffix [2, 3] occurred at 1 and 5; the latest (5) is followed by [4, 5, 7].
    assert propose_ngram(ids, 3, 1, 4) == [4, 5, 7]
    # suffix [7, 2, 3] never occurred; [2, 3] did.
    assert propose_ngram(ids, 2, 2, 3) == [4, 5]


def test_a_match_right_before_the_suffix_counts():
    # [5, 5]'s 1-gram suffix [5] last occurred just before it, at 1: followed by the suffix itself.
    assert propose_ngram([7, 5, 5], 2, 1, 1) == [5]
    # The longest possible n-gram is num - 1 tokens long: [5]'s only earlier occurrence starts at 0.
    assert propose_ngram([5, 5], 2, 1, 3) == [5]


def test_short_and_empty_drafts():
    assert propose_ngram([5, 6, 5], 4, 1, 3) == [6, 5]  # continuation runs into the end: shorter than k
    assert propose_ngram([1, 2, 3], 4, 1, 3) == []
    assert propose_ngram([7], 4, 1, 3) == []
    assert propose_ngram([1, 2, 1, 2], 4, 3, 3) == []  # no 3-gram repeats


def test_the_longest_match_wins_over_a_later_shorter_one():
    # The 3-gram [1, 2, 3] occurred at 0 (followed by 4, 9, 3); the 1-gram [3] last occurred at 5
    # (followed by 5, 1, 2). The longest suffix match wins even though a shorter one is more recent.
    ids = [1, 2, 3, 4, 9, 3, 5, 1, 2, 3]
    assert propose_ngram(ids, 3, 1, 3) == [4, 9, 3]
    assert propose_ngram(ids, 3, 1, 1) == [5, 1, 2]
