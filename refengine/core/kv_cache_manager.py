"""KVCacheManager: which blocks each request owns, grown on demand from the BlockPool, and vLLM v1's
automatic prefix caching: a request starts from the longest run of cached full blocks that matches its
tokens, and publishes its own full blocks once their tokens are committed.

Invariant numbers refer to docs/invariants.md.
"""

from dataclasses import dataclass

from refengine.core.block_pool import BlockPool, KVCacheInvariantError
from refengine.core.kv_cache_utils import BlockHash, extend_block_hashes
from refengine.request import Request


@dataclass
class PrefixCacheStats:
    """Since start, in tokens as vLLM counts them: a query is a scheduled admission's tokens, a hit the
    tokens it found cached."""

    num_requests: int = 0
    queries: int = 0
    hits: int = 0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.prefix_cache_stats = PrefixCacheStats()
        self._req_to_block_ids: dict[str, list[int]] = {}
        self._req_to_block_hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of each request are published (or found cached at admission).
        self._num_cached_block: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_block_ids(self, req_id: str) -> tuple[int, ...]:
        return tuple(self._req_to_block_ids.get(req_id, ()))

    def _block_hashes(self, request: Request) -> list[BlockHash]:
        hashes = self._req_to_block_hashes.setdefault(request.request_id, [])
        return extend_block_hashes(hashes, request.all_token_ids, self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The cached blocks a request holding no blocks can start from, and how many tokens they cover.
        The hit stops before the request's last token, whose logits the next step must compute."""
        if not self.enable_caching:
            return [], 0
        tokens = request.all_token_ids
        # Invariant 44: a hit never covers the last token (test_a_whole_prompt_hit_still_computes_its_last_token).
        max_cache_hit_length = request.num_tokens - 1
        hit: list[int] = []
        for block_hash in self._block_hashes(request)[: max_cache_hit_length // self.block_size]:
            block_id = self.block_pool.get_cached_block(block_hash)
            if block_id is None:
                break
            start = len(hit) * self.block_size
            # Invariant 42: the hash names every token of the prefix, so a hit holds exactly the request's
            # tokens (test_the_hash_covers_every_token_of_the_prefix).
            if self.block_pool.block_token_ids(block_id) != tokens[start : start + self.block_size]:
                raise KVCacheInvariantError(
                    f"{request}: cached block {block_id} holds tokens {self.block_pool.block_token_ids(block_id)}, "
                    f"the request has {tokens[start : start + self.block_size]} at {start}"
                )
            hit.append(block_id)
        return hit, len(hit) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        new_computed_blocks: list[int] | None = None,
    ) -> list[int] | None:
        """Grow the request's blocks to cover its computed, new and lookahead slots:

            | computed (nc) | new (num_new_tokens) | lookahead (drafter KV) |

        `new_computed_blocks` are the cache hits of a request being admitted (get_computed_blocks); they
        are already counted in its num_computed_tokens. Returns the newly added block ids (possibly none),
        or None when the free blocks do not suffice, in which case nothing is allocated or referenced.
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(f"num_new_tokens={num_new_tokens}, num_lookahead_tokens={num_lookahead_tokens}")
        hits = new_computed_blocks or []
        num_slots = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        owned = self._req_to_block_ids.get(request.request_id, [])
        # Blocks past the need (after a rollback of rejected drafts) stay owned for reuse.
        num_missing = max(0, -(-num_slots // self.block_size) - len(owned) - len(hits))
        # A hit block nobody owns sits in the free queue: taking it costs a free block too.
        num_free_hits = sum(1 for b in hits if self.block_pool.ref_cnt(b) == 0)
        if num_missing + num_free_hits > self.block_pool.num_free_blocks:
            return None
        if hits:
            self.block_pool.touch(hits)
            owned = self._req_to_block_ids.setdefault(request.request_id, owned)
            owned.extend(hits)
            self._num_cached_block[request.request_id] = len(hits)
        if num_missing == 0:
            return []
        new_block_ids = self.block_pool.get_new_blocks(num_missing)
        self._req_to_block_ids.setdefault(request.request_id, owned).extend(new_block_ids)
        return new_block_ids

    def record_admission(self, request: Request, num_cached_tokens: int) -> None:
        if self.enable_caching:
            self.prefix_cache_stats.num_requests += 1
            self.prefix_cache_stats.queries += request.num_tokens
            self.prefix_cache_stats.hits += num_cached_tokens

    def cache_blocks(self, request: Request, num_committed_tokens: int) -> None:
        """Publish the request's full blocks among its first `num_committed_tokens` positions: their
        token ids are committed and their KV is written (or written by a frame ahead of any reader)."""
        if not self.enable_caching:
            return
        # Invariant 41: never a block holding a draft slot or any position past the committed tokens
        # (test_blocks_are_published_only_when_committed).
        if num_committed_tokens > request.num_tokens:
            raise KVCacheInvariantError(
                f"{request}: publishing {num_committed_tokens} positions, only {request.num_tokens} are committed"
            )
        req_id = request.request_id
        block_ids = self._req_to_block_ids.get(req_id, [])
        num_full = min(num_committed_tokens // self.block_size, len(block_ids))
        num_cached = self._num_cached_block.get(req_id, 0)
        if num_full <= num_cached:
            return
        hashes = self._block_hashes(request)
        tokens = request.all_token_ids
        for i in range(num_cached, num_full):
            self.block_pool.cache_full_block(
                block_ids[i], hashes[i], tokens[i * self.block_size : (i + 1) * self.block_size]
            )
        self._num_cached_block[req_id] = num_full

    def free(self, request: Request) -> None:
        """Give back every block of the request: its cached ones tail first, so that its prefix is evicted
        last, the others in order. A request without blocks is a no-op. Cached blocks stay cached until
        evicted."""
        block_ids = self._req_to_block_ids.pop(request.request_id, [])
        pool = self.block_pool
        pool.free_blocks(
            [b for b in block_ids if pool.block_hash(b) is None]
            + [b for b in reversed(block_ids) if pool.block_hash(b) is not None]
        )
        self._num_cached_block.pop(request.request_id, None)
        if request.is_finished:
            self._req_to_block_hashes.pop(request.request_id, None)


__all__ = ["KVCacheInvariantError", "KVCacheManager"]
