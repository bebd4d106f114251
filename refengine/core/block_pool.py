"""BlockPool: a fixed set of KV blocks, reference-counted, with vLLM v1's prefix cache: a full block
whose tokens are committed can be published under its chain hash and stays findable after its last
owner frees it, until the pool needs the block again (least recently freed first).

Invariant numbers refer to docs/invariants.md.
"""

from collections import OrderedDict
from collections.abc import Iterable

from refengine.core.kv_cache_utils import BlockHash


class KVCacheInvariantError(RuntimeError):
    """The block bookkeeping contradicts itself (double free, a block owned twice)."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        # vLLM's free block queue, in two parts: blocks with no owner and no cached content are handed out
        # first, in the order they were freed (a request's blocks stay consecutive, which the CPU attention
        # reads in place); then cached blocks, least recently freed first (LRU eviction). A cache hit takes
        # its block out of the middle of the second.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._ref_cnt = [0] * num_blocks
        self._block_hash: list[BlockHash | None] = [None] * num_blocks
        # The token ids a cached block was published with, so that a hit can be checked against them.
        self._block_token_ids: list[tuple[int, ...]] = [()] * num_blocks
        # vLLM's BlockHashToBlockMap: every cached block of a hash (two requests computing one prefix at
        # once both publish it), the oldest first; a hit takes the oldest.
        self._cached_block_hash_to_block: dict[BlockHash, dict[int, None]] = {}
        self.num_evictions = 0  # cached blocks handed out again for new content

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue) + len(self._free_cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (a cached block nobody owns is free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> frozenset[int]:
        return frozenset(self._free_queue) | frozenset(self._free_cached)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def block_hash(self, block_id: int) -> BlockHash | None:
        return self._block_hash[block_id]

    def block_token_ids(self, block_id: int) -> tuple[int, ...]:
        """The token ids of a cached block (empty for a block not in the cache)."""
        return self._block_token_ids[block_id]

    @property
    def num_cached_blocks(self) -> int:
        return sum(map(len, self._cached_block_hash_to_block.values()))

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        blocks = self._cached_block_hash_to_block.get(block_hash)
        return None if blocks is None else next(iter(blocks))

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks > self.num_free_blocks:
            raise KVCacheInvariantError(f"asked for {num_blocks} blocks, {self.num_free_blocks} are free")
        block_ids = [
            (self._free_queue if self._free_queue else self._free_cached).popitem(last=False)[0]
            for _ in range(num_blocks)
        ]
        for block_id in block_ids:
            # Invariants 29 and 43: a block in the free queue has no owner, so handing it out (and evicting
            # its cached content) never overwrites a block someone still reads
            # (test_double_ownership_is_refused, test_property_prefix_cache_*).
            if self._ref_cnt[block_id] != 0:
                raise KVCacheInvariantError(
                    f"block {block_id} was free with ref_cnt={self._ref_cnt[block_id]}"
                )
            self._evict(block_id)
            self._ref_cnt[block_id] = 1
        return block_ids

    def _evict(self, block_id: int) -> None:
        block_hash = self._block_hash[block_id]
        if block_hash is None:
            return
        self._block_hash[block_id] = None
        self._block_token_ids[block_id] = ()
        blocks = self._cached_block_hash_to_block[block_hash]
        del blocks[block_id]
        if not blocks:
            del self._cached_block_hash_to_block[block_hash]
        self.num_evictions += 1

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset: forget every cached block, so that the next request finds no prefix. Only an idle
        pool is reset (a running request's blocks stay published); False when some block has an owner."""
        if any(self._ref_cnt):
            return False
        for block_id in list(self._free_cached):
            self._block_hash[block_id] = None
            self._block_token_ids[block_id] = ()
        self._free_queue.update(self._free_cached)
        self._free_cached.clear()
        self._cached_block_hash_to_block.clear()
        return True

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference to cached blocks a request hit: one without owners leaves the free queue."""
        for block_id in block_ids:
            if self._ref_cnt[block_id] == 0:
                del self._free_cached[block_id]
            self._ref_cnt[block_id] += 1

    def cache_full_block(self, block_id: int, block_hash: BlockHash, token_ids: tuple[int, ...]) -> None:
        """Publish a full, committed block under its chain hash (beside any other block of the same
        prefix)."""
        if self._ref_cnt[block_id] <= 0 or self._block_hash[block_id] is not None:
            raise KVCacheInvariantError(
                f"block {block_id} published with ref_cnt={self._ref_cnt[block_id]}, hash set: "
                f"{self._block_hash[block_id] is not None}"
            )
        self._block_hash[block_id] = block_hash
        self._block_token_ids[block_id] = token_ids
        self._cached_block_hash_to_block.setdefault(block_hash, {})[block_id] = None

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; blocks left without owners join the free queue in this
        order, cached ones after every uncached block: pass a request's cached blocks tail first, so that
        its tail is evicted before its prefix."""
        for block_id in block_ids:
            # Invariant 29: only an owned block can be freed (test_double_free_is_refused).
            if self._ref_cnt[block_id] <= 0:
                raise KVCacheInvariantError(f"block {block_id} freed twice")
            self._ref_cnt[block_id] -= 1
            if self._ref_cnt[block_id] == 0:
                (self._free_queue if self._block_hash[block_id] is None else self._free_cached)[block_id] = None
