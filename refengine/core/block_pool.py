"""BlockPool: a fixed set of KV blocks, handed out FIFO and reference-counted."""

from collections import deque
from collections.abc import Iterable


class KVCacheInvariantError(RuntimeError):
    """The block bookkeeping contradicts itself (double free, a block owned twice)."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free_queue: deque[int] = deque(range(num_blocks))
        self._ref_cnt = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - len(self._free_queue) / self.num_blocks

    def free_block_ids(self) -> frozenset[int]:
        return frozenset(self._free_queue)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self._free_queue):
            raise KVCacheInvariantError(f"asked for {num_blocks} blocks, {len(self._free_queue)} are free")
        block_ids = [self._free_queue.popleft() for _ in range(num_blocks)]
        for block_id in block_ids:
            # Invariant 29 (docs/invariants.md): a block in the free queue has no owner (test_double_ownership_is_refused).
            if self._ref_cnt[block_id] != 0:
                raise KVCacheInvariantError(
                    f"block {block_id} was free with ref_cnt={self._ref_cnt[block_id]}"
                )
            self._ref_cnt[block_id] = 1
        return block_ids

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            # Invariant 29: only an owned block can be freed (test_double_free_is_refused).
            if self._ref_cnt[block_id] <= 0:
                raise KVCacheInvariantError(f"block {block_id} freed twice")
            self._ref_cnt[block_id] -= 1
            if self._ref_cnt[block_id] == 0:
                self._free_queue.append(block_id)
