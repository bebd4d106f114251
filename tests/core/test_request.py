import pytest

from refengine.request import FinishReason, Request, RequestStatus, derive_rng_key
from refengine.sampling_params import SamplingParams


def test_status_order_and_finish_reasons():
    unfinished = [RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED]
    assert not any(s.is_finished() for s in unfinished)
    assert RequestStatus.FINISHED_STOPPED.finish_reason is FinishReason.STOP
    assert RequestStatus.FINISHED_LENGTH_CAPPED.finish_reason == "length"
    assert RequestStatus.FINISHED_ABORTED.finish_reason == "abort"
    assert all(s > RequestStatus.PREEMPTED for s in RequestStatus if s.is_finished())


def test_tokens_are_append_only_and_counted():
    request = Request("a", [1, 2, 3], SamplingParams())
    request.append_output_token_ids(7)
    request.append_output_token_ids([8, 9])
    assert request.prompt_token_ids == (1, 2, 3) and request.output_token_ids == (7, 8, 9)
    assert request.all_token_ids == (1, 2, 3, 7, 8, 9)
    assert (request.num_prompt_tokens, request.num_output_tokens, request.num_tokens) == (3, 3, 6)
    request.spec_token_ids = [4, 4]
    assert request.num_tokens_with_spec == 8
    with pytest.raises(AttributeError):
        request.output_token_ids.append(1)


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="'a' has an empty prompt"):
        Request("a", [], SamplingParams())


def test_rng_key_is_the_seed_or_reproducible_from_engine_seed_and_arrival():
    assert Request("a", [1], SamplingParams(seed=42), arrival_index=5, engine_seed=9).rng_key == 42
    keys = {derive_rng_key(None, engine_seed, index) for engine_seed in (0, 1) for index in range(100)}
    assert len(keys) == 200
    assert derive_rng_key(None, 3, 17) == derive_rng_key(None, 3, 17)
    assert all(0 <= key < 2**64 for key in keys) and derive_rng_key(-1, 0, 0) == 2**64 - 1


def test_constraint_comes_from_bad_words():
    assert not Request("a", [1], SamplingParams()).has_constraint
    assert Request("a", [1], SamplingParams(bad_words=["x"])).has_constraint
    assert Request("a", [1], SamplingParams(bad_words_token_ids=[[3]])).has_constraint


def test_rng_key_mixer_is_splitmix64():
    """Keys must not change between versions (a seeded request's tokens hang on them): the mixer is
    splitmix64, whose reference stream from state 0 starts e220a8397b1dcdaf, 6e789e6aa1b965f4."""
    from refengine.sample.splitmix import splitmix64

    golden = 0x9E3779B97F4A7C15
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(golden) == 0x6E789E6AA1B965F4
    assert derive_rng_key(None, 0, 0) == splitmix64(splitmix64(0))
