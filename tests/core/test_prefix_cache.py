"""Automatic prefix caching in the KV cache manager and the scheduler: what is published, what a hit
may cover, and what eviction may take (invariants 41 to 44 in docs/invariants.md)."""

import subprocess
import sys

import pytest

from refengine.core.block_pool import BlockPool, KVCacheInvariantError
from refengine.core.kv_cache_manager import KVCacheManager
from refengine.core.kv_cache_utils import NONE_HASH, hash_block_tokens
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams

from .harness import make_scheduler, runner_output


def apply(scheduler, so, rows):
    return scheduler.update_from_output(so, runner_output(so, rows))


def request(req_id: str, prompt: list[int], **params) -> Request:
    return Request(req_id, prompt, SamplingParams(temperature=0.0, **params))


def cached_blocks(scheduler) -> dict[int, tuple[int, ...]]:
    pool = scheduler.kv_cache_manager.block_pool
    return {b: pool.block_token_ids(b) for b in range(pool.num_blocks) if pool.block_hash(b) is not None}


def test_blocks_are_published_only_when_committed():
    """Async, k = 2, two frames in flight: a block is published once every token in it is committed by
    the corrected count, never while it holds draft slots or positions of a frame still in flight."""
    scheduler = make_scheduler(async_scheduling=True, k=2, block_size=4, enable_prefix_caching=True)
    scheduler.add_request(request("a", [10, 11, 12, 13, 14, 15], max_tokens=20))
    s1 = scheduler.schedule()  # the prompt: nc = 6, one placeholder
    s2 = scheduler.schedule()  # t1 and two draft slots, optimistic: nc = 9
    assert s2.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    apply(scheduler, s1, {"a": [20]})
    # Committed: the prompt and t1 (7 tokens); s2's three positions are in flight.
    assert cached_blocks(scheduler) == {0: (10, 11, 12, 13)}
    s2.scheduled_spec_decode_tokens["a"] = [21, 22]
    apply(scheduler, s2, {"a": [21, 30]})  # 21 accepted, 22 rejected, 30 sampled at position 8
    a = scheduler.requests["a"]
    assert a.all_token_ids == (10, 11, 12, 13, 14, 15, 20, 21, 30)
    # Positions 4..7 are committed (15, 20, 21 and the rejected 22's slot rolled back to 30's, not cached).
    assert cached_blocks(scheduler) == {0: (10, 11, 12, 13), 1: (14, 15, 20, 21)}


def test_the_hash_covers_every_token_of_the_prefix():
    block = [5, 6, 7, 8]
    base = hash_block_tokens(NONE_HASH, block)
    for i in range(len(block)):
        changed = block[:i] + [block[i] + 1] + block[i + 1 :]
        assert hash_block_tokens(NONE_HASH, changed) != base, f"token {i} is not hashed"
    assert hash_block_tokens(base, block) != base  # the parent hash
    assert hash_block_tokens(NONE_HASH, block, ("salt",)) != base  # the extra keys
    assert hash_block_tokens(NONE_HASH, block[:3]) != hash_block_tokens(NONE_HASH, block[:3] + [0])
    # Two prompts that differ in the last token of block 0 share nothing.
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=True)
    scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=1))
    apply(scheduler, so := scheduler.schedule(), {"a": [0]})
    assert so.num_scheduled_tokens == {"a": 9} and len(cached_blocks(scheduler)) == 2
    scheduler.add_request(request("b", [1, 2, 3, 9, 5, 6, 7, 8, 9], max_tokens=1))
    scheduler.add_request(request("c", [1, 2, 3, 4, 5, 6, 7, 9, 9], max_tokens=1))
    so = scheduler.schedule()
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 0, "c": 4}


def test_the_hash_is_the_same_in_every_process():
    code = "from refengine.core.kv_cache_utils import *; print(hash_block_tokens(NONE_HASH, [1, 2, 3]).hex())"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert runs == {hash_block_tokens(NONE_HASH, [1, 2, 3]).hex()}


def test_eviction_never_takes_a_referenced_block():
    """A cached block nobody owns waits in the free queue, behind every block without cached content; a
    hit takes it out, so handing out every other free block never evicts it, and cached blocks are
    evicted least recently freed first, a request's tail before its prefix."""
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a = request("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(a, 5) == [0, 1, 2]
    a.num_computed_tokens = 5
    kv.cache_blocks(a, 4)
    kv.free(a)  # the free queue is 3, 4, 5, 2, then the cached 1, 0 (tail first)
    b = request("b", [1, 2, 3, 4, 9])
    hit, num_hit = kv.get_computed_blocks(b)
    assert (hit, num_hit) == ([0, 1], 4)
    b.num_computed_tokens = num_hit
    assert kv.allocate_slots(b, 1, new_computed_blocks=hit) == [3]
    assert kv.num_free_blocks == 3 and kv.block_pool.ref_cnt(0) == kv.block_pool.ref_cnt(1) == 1
    c = request("c", [7] * 6)
    assert kv.allocate_slots(c, 6) == [4, 5, 2]
    assert kv.allocate_slots(request("d", [8]), 1) is None
    assert kv.block_pool.num_evictions == 0 and kv.block_pool.num_cached_blocks == 2
    kv.free(c)
    kv.free(b)
    # The free queue is 4, 5, 2, 3 (in the order freed), then the cached 1, 0.
    assert kv.allocate_slots(request("e", [8] * 8), 8) == [4, 5, 2, 3]
    assert kv.block_pool.num_evictions == 0
    assert kv.allocate_slots(request("f", [8]), 1) == [1]  # the cached tail goes before the prefix
    assert kv.block_pool.num_evictions == 1 and kv.get_computed_blocks(b) == ([0], 2)


def test_a_whole_prompt_hit_still_computes_its_last_token():
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=True)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    scheduler.add_request(request("a", prompt, max_tokens=1))
    apply(scheduler, scheduler.schedule(), {"a": [0]})
    scheduler.add_request(request("b", prompt, max_tokens=1))
    so = scheduler.schedule()
    (b,) = so.scheduled_new_reqs
    # Block 1 holds the last prompt token, whose logits sample b's first token: it is recomputed.
    assert b.num_computed_tokens == 4 and so.num_scheduled_tokens == {"b": 4}
    assert scheduler.requests["b"].num_cached_tokens == 4
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.num_requests, stats.queries, stats.hits) == (2, 16, 4)


def test_a_resumed_request_hits_its_own_blocks():
    """Preemption frees the blocks but keeps them cached: the request resumes from its committed prefix."""
    scheduler = make_scheduler(block_size=2, num_blocks=6, max_model_len=10, enable_prefix_caching=True)
    scheduler.add_request(request("a", [1, 2, 3, 4, 5], max_tokens=4))
    apply(scheduler, scheduler.schedule(), {"a": [6]})
    scheduler.add_request(request("b", [9, 9, 9, 9, 9], max_tokens=4))
    so = scheduler.schedule()  # b is admitted beside a
    apply(scheduler, so, {"a": [7], "b": [1]})
    so = scheduler.schedule()  # a needs a 4th block: b is preempted
    assert so.preempted_req_ids == {"b"}
    apply(scheduler, so, {"a": [8]})
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    so = scheduler.schedule()
    (b,) = so.scheduled_new_reqs
    assert b.output_token_ids == (1,) and b.num_computed_tokens == 4  # of its 6 tokens


def test_prefix_caching_off_caches_nothing():
    scheduler = make_scheduler(block_size=4, enable_prefix_caching=False)
    for name in "ab":
        scheduler.add_request(request(name, [1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=1))
        so = scheduler.schedule()
        assert so.scheduled_new_reqs[0].num_computed_tokens == 0
        apply(scheduler, so, {name: [0]})
    assert cached_blocks(scheduler) == {}
    assert scheduler.kv_cache_manager.prefix_cache_stats.queries == 0


def test_publishing_past_the_committed_tokens_is_refused():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = request("a", [1, 2, 3])
    kv.allocate_slots(a, 3, num_lookahead_tokens=2)
    with pytest.raises(KVCacheInvariantError, match="publishing 4 positions, only 3 are committed"):
        kv.cache_blocks(a, 4)


def test_a_hit_whose_tokens_differ_is_refused():
    pool_kv = KVCacheManager(num_blocks=4, block_size=2)
    a = request("a", [1, 2, 3])
    pool_kv.allocate_slots(a, 3)
    pool_kv.cache_blocks(a, 2)
    pool_kv.block_pool._block_token_ids[0] = (1, 9)  # corrupt: what a hash collision would look like
    with pytest.raises(KVCacheInvariantError, match=r"cached block 0 holds tokens \(1, 9\)"):
        pool_kv.get_computed_blocks(request("b", [1, 2, 3]))


def test_pool_accounts_every_block():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_block(blocks[0], b"h", (1,))
    pool.touch([blocks[0]])
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 2 and pool.ref_cnt(blocks[0]) == 1
    pool.free_blocks([blocks[0]])
    assert pool.num_free_blocks == 3 and pool.get_cached_block(b"h") == blocks[0]


def test_reset_forgets_every_cached_block_only_when_idle():
    """vLLM's reset_prefix_cache: refused while a block has an owner (nothing changes); on an idle pool
    every cached block becomes a plain free block, so the same prompt then finds nothing."""
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a = request("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(a, 5) == [0, 1, 2]
    a.num_computed_tokens = 5
    kv.cache_blocks(a, 4)
    pool = kv.block_pool
    assert not pool.reset_prefix_cache() and pool.num_cached_blocks == 2
    kv.free(a)
    assert kv.get_computed_blocks(request("b", [1, 2, 3, 4, 9])) == ([0, 1], 4)
    assert pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 6
    assert pool.block_hash(0) is None and pool.block_token_ids(1) == ()
    assert kv.get_computed_blocks(request("c", [1, 2, 3, 4, 9])) == ([], 0)
    # the freed blocks are handed out again without counting as evictions of cached content
    assert kv.allocate_slots(request("d", [5] * 12), 12) is not None and pool.num_evictions == 0
