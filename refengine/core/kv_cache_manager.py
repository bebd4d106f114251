"""KVCacheManager: which blocks each request owns, grown on demand from the BlockPool."""

from refengine.core.block_pool import BlockPool, KVCacheInvariantError
from refengine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self._req_to_block_ids: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_block_ids(self, req_id: str) -> tuple[int, ...]:
        return tuple(self._req_to_block_ids.get(req_id, ()))

    def allocate_slots(
        self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0
    ) -> list[int] | None:
        """Grow the request's blocks to cover its computed, new and lookahead slots:

            | computed (nc) | new (num_new_tokens) | lookahead (drafter KV) |

        Returns the newly added block ids (possibly none), or None when the free blocks do not suffice,
        in which case nothing is allocated.
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(f"num_new_tokens={num_new_tokens}, num_lookahead_tokens={num_lookahead_tokens}")
        num_slots = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        owned = self._req_to_block_ids.get(request.request_id, [])
        # Blocks past the need (after a rollback of rejected drafts) stay owned for reuse.
        num_missing = -(-num_slots // self.block_size) - len(owned)
        if num_missing <= 0:
            return []
        if num_missing > self.block_pool.num_free_blocks:
            return None
        new_block_ids = self.block_pool.get_new_blocks(num_missing)
        self._req_to_block_ids.setdefault(request.request_id, owned).extend(new_block_ids)
        return new_block_ids

    def free(self, request: Request) -> None:
        """Give back every block of the request; a request without blocks is a no-op."""
        self.block_pool.free_blocks(self._req_to_block_ids.pop(request.request_id, []))


__all__ = ["KVCacheInvariantError", "KVCacheManager"]
