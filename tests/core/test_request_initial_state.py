"""A fresh Request's identity and counters, before any scheduler touches it."""

from refengine.request import Request, RequestStatus, derive_rng_key
from refengine.sampling_params import SamplingParams


def test_unseeded_request_defaults_to_engine_seed_0_and_arrival_0():
    # The engine passes both; a Request built without them (tests, tools) must draw the same numbers
    # as the engine's first request under engine seed 0, not some other stream.
    request = Request("a", [1, 2], SamplingParams())
    assert request.arrival_index == 0
    assert request.rng_key == derive_rng_key(None, 0, 0)
    assert request.rng_key != derive_rng_key(None, 1, 0) and request.rng_key != derive_rng_key(None, 0, 1)


def test_arrival_index_is_kept_and_keys_the_stream():
    request = Request("a", [1], SamplingParams(), arrival_index=5, engine_seed=9)
    assert request.arrival_index == 5
    assert request.rng_key == derive_rng_key(None, 9, 5)


def test_fresh_request_is_waiting_and_not_a_prefill_chunk():
    # is_prefill_chunk is only set by scheduling; until then the request has sampled nothing and been
    # scheduled for nothing, so nothing may treat it as a chunk in progress.
    request = Request("a", [1, 2, 3], SamplingParams())
    assert request.is_prefill_chunk is False
    assert request.status == RequestStatus.WAITING
    assert request.num_computed_tokens == request.num_output_placeholders == request.num_preemptions == 0
