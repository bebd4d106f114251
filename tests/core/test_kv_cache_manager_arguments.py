"""KVCacheManager.allocate_slots: which token counts it takes, and the exact error for the ones it refuses."""

import pytest

from refengine.core.kv_cache_manager import KVCacheManager
from refengine.request import Request
from refengine.sampling_params import SamplingParams


@pytest.mark.parametrize("num_new, num_lookahead", [(-1, 0), (0, -1), (-2, -3)])
def test_negative_counts_are_refused_and_allocate_nothing(num_new, num_lookahead):
    kv = KVCacheManager(num_blocks=4, block_size=4)
    request = Request("a", [1, 2, 3], SamplingParams())
    with pytest.raises(ValueError, match=f"^num_new_tokens={num_new}, num_lookahead_tokens={num_lookahead}$"):
        kv.allocate_slots(request, num_new, num_lookahead)
    assert kv.num_free_blocks == 4


def test_zero_new_tokens_is_a_valid_request_for_lookahead_slots():
    # A request whose KV already covers its tokens may still need the drafter's lookahead slots:
    # 0 new tokens is legal, and with nc=4 and 2 lookahead slots it needs a second block.
    kv = KVCacheManager(num_blocks=4, block_size=4)
    request = Request("a", [1, 2, 3, 4], SamplingParams())
    assert kv.allocate_slots(request, 4) == [0]
    request.num_computed_tokens = 4
    assert kv.allocate_slots(request, 0) == []
    assert kv.allocate_slots(request, 0, num_lookahead_tokens=2) == [1]
    assert kv.get_block_ids("a") == (0, 1) and kv.num_free_blocks == 2
