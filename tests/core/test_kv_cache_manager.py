import pytest

from refengine.core.block_pool import BlockPool, KVCacheInvariantError
from refengine.core.kv_cache_manager import KVCacheManager
from refengine.request import Request
from refengine.sampling_params import SamplingParams


def _request(req_id: str, num_computed_tokens: int = 0) -> Request:
    request = Request(req_id, [1, 2, 3], SamplingParams())
    request.num_computed_tokens = num_computed_tokens
    return request


def test_allocate_grows_by_whole_blocks_including_lookahead():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = _request("a")
    assert kv.allocate_slots(a, 5) == [0, 1]
    assert kv.allocate_slots(a, 3) == []  # 8 slots fit in 2 blocks
    a.num_computed_tokens = 8
    assert kv.allocate_slots(a, 1, num_lookahead_tokens=4) == [2, 3]  # | 8 | 1 | 4 | = 13 slots
    assert kv.get_block_ids("a") == (0, 1, 2, 3)
    assert kv.num_free_blocks == 6 and kv.usage == pytest.approx(0.4)


def test_allocation_that_does_not_fit_takes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    assert kv.allocate_slots(_request("a"), 4) == [0, 1]
    assert kv.allocate_slots(_request("b"), 3) is None
    assert kv.get_block_ids("b") == () and kv.num_free_blocks == 1


def test_free_returns_blocks_fifo_and_is_idempotent_per_request():
    kv = KVCacheManager(num_blocks=4, block_size=1)
    a, b = _request("a"), _request("b")
    kv.allocate_slots(a, 2)
    kv.allocate_slots(b, 1)
    kv.free(a)
    kv.free(a)  # nothing left to free
    assert kv.num_free_blocks == 3
    assert kv.allocate_slots(_request("c"), 3) == [3, 0, 1]  # oldest free blocks first


def test_rollback_keeps_blocks_for_reuse():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = _request("a")
    kv.allocate_slots(a, 6)
    a.num_computed_tokens = 2  # rejected drafts rolled back
    assert kv.allocate_slots(a, 2) == []
    assert kv.get_block_ids("a") == (0, 1, 2)


def test_double_free_is_refused():
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    with pytest.raises(KVCacheInvariantError, match="block 0 freed twice"):
        pool.free_blocks(blocks)


def test_double_ownership_is_refused():
    kv = KVCacheManager(num_blocks=2, block_size=1)
    kv.allocate_slots(_request("a"), 1)
    kv.block_pool._free_queue[0] = None  # corrupt: block 0 is owned and free at once
    kv.block_pool._free_queue.move_to_end(0, last=False)
    with pytest.raises(KVCacheInvariantError, match="block 0 was free with ref_cnt=1"):
        kv.allocate_slots(_request("b"), 1)


def test_pool_refuses_to_overdraw():
    with pytest.raises(KVCacheInvariantError, match="asked for 3 blocks, 2 are free"):
        BlockPool(2).get_new_blocks(3)
