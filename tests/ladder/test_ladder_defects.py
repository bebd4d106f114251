"""Defects new users found (issue 32), each pinned by a test that failed before its fix."""

import json

import pytest
from ladder_harness import load_records, load_rungs

SMALL = ("--input-len", "16", "--output-len", "4")


def test_request_rate_inf_sizes_its_rung_without_prompts_per_rung(fake_server, ladder):
    """ceil(inf) raised OverflowError: an inf rung sends K·--max-concurrency, else K·32 requests."""
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--request-rate", "2,inf", *SMALL,
                                 "--prompts-per-concurrency", "1")
    assert code == 0, (out, err)
    assert [(r["request_rate"], r["num_measured"]) for r in load_rungs(run)] == [(2, 2), (float("inf"), 32)]
    code, _, _, run = ladder("--base-url", url, "--request-rate", "inf", "--max-concurrency", "3", *SMALL,
                             "--prompts-per-concurrency", "2")
    assert code == 0 and [r["num_measured"] for r in load_rungs(run)] == [6]


@pytest.mark.parametrize("rates", ["nan", "1,nan", "-inf"])
def test_a_rate_that_is_not_a_positive_number_is_one_line(ladder, rates):
    code, out, err, _ = ladder("--base-url", "http://127.0.0.1:9", "--request-rate", rates)
    assert code == 2 and err.count("\n") == 1 and "positive request rates" in err, (out, err)
