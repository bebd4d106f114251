from refengine.spec_decode.ngram import propose_ngram


def test_longest_and_latest_match_wins():
    ids = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    # suffix [2, 3] occurred at 1 and 5; the latest (5) is followed by [4, 5, 7].
    assert propose_ngram(ids, 3, 1, 4) == [4, 5, 7]
    # suffix [7, 2, 3] never occurred; [2, 3] did.
    assert propose_ngram(ids, 2, 2, 3) == [4, 5]


def test_short_and_empty_drafts():
    assert propose_ngram([5, 6, 5], 4, 1, 3) == [6, 5]  # continuation runs into the end: shorter than k
    assert propose_ngram([1, 2, 3], 4, 1, 3) == []
    assert propose_ngram([7], 4, 1, 3) == []
    assert propose_ngram([1, 2, 1, 2], 4, 3, 3) == []  # no 3-gram repeats
