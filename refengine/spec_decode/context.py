"""Per-request length of a drafter's accumulated context, and the continuity check that guards it.

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Iterable

from refengine.spec_decode.proposer import DraftContextError


class ContextLengths:
    """How many leading positions of each request a drafter has ingested into its own state (its paged
    KV, or DFlash's context KV). Keyed by request id, never by batch row (invariant 17).

    The runner hands a drafter only committed rows, starting at the target's exact computed position,
    so each step must begin exactly where the previous one ended. Anything else means the drafter's
    state no longer describes the request's committed tokens: a stale or foreign context that would
    only collapse acceptance (invariant 27), so it refuses instead of drafting from it.
    """

    def __init__(self, method: str) -> None:
        self.method = method
        self._lengths: dict[str, int] = {}

    def advance(self, req_id: str, first_position: int, num_rows: int, context_start: int = 0) -> None:
        """Record rows `first_position .. first_position + num_rows - 1` as ingested, after checking
        that they continue the request's context (which begins at context_start: a prefix-cache hit)."""
        length = self._lengths.get(req_id, context_start)
        if first_position != length:
            raise DraftContextError(
                f"{self.method} drafter, request {req_id!r}: context position discontinuity (accumulated "
                f"context covers positions 0..{length - 1}, but the rows to ingest start at {first_position})"
            )
        self._lengths[req_id] = first_position + num_rows

    def remove(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._lengths.pop(req_id, None)
