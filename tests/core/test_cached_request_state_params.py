"""CachedRequestState.from_new: the runner's per-row sampling parameters from a request's SamplingParams."""

import pytest

from refengine.core.outputs import NewRequestData
from refengine.sampling_params import SamplingParams
from refengine.worker.request_state import CachedRequestState


def new_data(**params) -> NewRequestData:
    return NewRequestData(
        req_id="a",
        prompt_token_ids=(5, 6, 7),
        output_token_ids=(8,),
        sampling_params=SamplingParams(**params),
        rng_key=11,
        eos_token_id=2,
        block_ids=(0, 1),
        num_computed_tokens=0,
    )


@pytest.mark.parametrize("top_k, row_top_k", [(-1, 0), (0, 0), (1, 1), (40, 40)])
def test_top_k_off_is_always_0_in_the_row(top_k, row_top_k):
    # SamplingParams accepts -1 and 0 for "off"; the sampler only knows 0 as off, and a -1 reaching it
    # would be read as a cut-off.
    state = CachedRequestState.from_new(new_data(top_k=top_k, temperature=0.7))
    assert state.params.top_k == row_top_k


def test_state_from_new_request_data():
    state = CachedRequestState.from_new(new_data(stop_token_ids=[9], min_tokens=2, seed=3))
    assert state.num_tokens == 4 and state.num_prompt_tokens == 3
    assert state.params.stop_token_ids == (9, 2) and state.params.min_tokens == 2
    assert state.params.rng_key == 11 and state.block_ids == (0, 1)
