"""Adaptive verification (vLLM's `enable_adaptive_verification`): each step, how many of its drafts each
request verifies, 0..k. Every (request, position) slot is scored by its survival probability, the
request's running acceptance at that position; the slots are taken best first, and the number taken is
the one that maximises expected tokens per second under a verify-cost table measured at start-up
(worker/verify_cost.py). Torch-free: the scheduler owns the policy. The rule: docs/design/spec-decode.md.

Invariant numbers refer to docs/invariants.md.
"""

from bisect import bisect_left
from dataclasses import dataclass, field

from refengine.spec_decode.metrics import SpecDecodingStats

# Pseudo-observations of the engine-wide survival that each request's own estimate starts from.
PRIOR_WEIGHT = 4
# A request that verified no draft for this many steps verifies one, so that its estimate can recover.
PROBE_INTERVAL = 16


class AdaptiveVerificationError(RuntimeError):
    """The policy's choice contradicts an invariant (numbered as in docs/invariants.md)."""


@dataclass(frozen=True, slots=True)
class VerifyCostTable:
    """Seconds of a verify step of b requests that each feed 1 + K tokens: seconds[i][K] at b =
    batch_sizes[i], K = 0..k. Made monotone when built (a step with more tokens or more requests never
    costs less), so measurement noise cannot buy a draft that is worth nothing."""

    batch_sizes: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    @classmethod
    def monotone(cls, batch_sizes: list[int], seconds: list[list[float]]) -> "VerifyCostTable":
        rows: list[tuple[float, ...]] = []
        for row in seconds:
            running = [max(row[: j + 1]) for j in range(len(row))]
            if rows:
                running = [max(a, b) for a, b in zip(running, rows[-1], strict=True)]
            rows.append(tuple(running))
        return cls(tuple(batch_sizes), tuple(rows))

    @property
    def k(self) -> int:
        return len(self.seconds[0]) - 1

    def cost(self, num_reqs: int, num_drafts: int) -> float:
        """A step of `num_reqs` requests verifying `num_drafts` drafts in all: linear between the measured
        batch sizes and between whole drafts per request (b past the table reads its last row)."""
        sizes = self.batch_sizes
        i = min(bisect_left(sizes, num_reqs), len(sizes) - 1)
        if i == 0 or sizes[i] <= num_reqs:
            return self._at(i, num_drafts / max(num_reqs, 1))
        lo, hi = sizes[i - 1], sizes[i]
        w = (num_reqs - lo) / (hi - lo)
        x = num_drafts / num_reqs
        return (1 - w) * self._at(i - 1, x) + w * self._at(i, x)

    def _at(self, i: int, drafts_per_req: float) -> float:
        row = self.seconds[i]
        x = min(max(drafts_per_req, 0.0), self.k)
        j = min(int(x), self.k - 1) if self.k else 0
        return row[j] if self.k == 0 else row[j] + (x - j) * (row[j + 1] - row[j])


def survival(own: SpecDecodingStats, engine: SpecDecodingStats, k: int) -> list[float]:
    """Per position, the estimated probability that a draft there is accepted (its prefix included): the
    request's own counts, starting from the engine-wide ones, which start optimistic (1.0). Forced
    non-increasing in position, as a survival is."""
    out: list[float] = []
    for i in range(k):
        seen, hit = _counts(engine, i)
        prior = (hit + 1) / (seen + 1)
        seen, hit = _counts(own, i)
        s = (hit + PRIOR_WEIGHT * prior) / (seen + PRIOR_WEIGHT)
        out.append(min(s, out[-1]) if out else s)
    return out


def _counts(stats: SpecDecodingStats, position: int) -> tuple[int, int]:
    offered, accepted = stats.num_draft_tokens_per_pos, stats.num_accepted_tokens_per_pos
    return (offered[position] if position < len(offered) else 0, accepted[position] if position < len(accepted) else 0)


@dataclass(slots=True)
class AdaptiveVerification:
    """The scheduler's per-step choice of K per request (vLLM's adaptive verification, DSpark's rule)."""

    table: VerifyCostTable
    # [K] = request-steps that verified K drafts by this policy's choice (the benchmarks' table).
    num_chosen: list[int] = field(default_factory=list)
    _unverified_steps: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.num_chosen = [0] * (self.table.k + 1)

    @property
    def k(self) -> int:
        return self.table.k

    def choose(self, num_reqs: int, survivals: dict[str, list[float]]) -> dict[str, int]:
        """K per request of `survivals` (its drafts' survival by position; fewer than k where it holds
        fewer drafts), in a step of `num_reqs` requests."""
        slots = sorted(
            ((s, pos, req_id) for req_id, ss in survivals.items() for pos, s in enumerate(ss)),
            key=lambda slot: (-slot[0], slot[1]),
        )
        best_n, best_rate, gain = 0, num_reqs / self.table.cost(num_reqs, 0), 0.0
        for n, (s, _, _) in enumerate(slots, start=1):
            gain += s
            rate = (num_reqs + gain) / self.table.cost(num_reqs, n)
            if rate > best_rate:  # a tie keeps the fewer drafts
                best_n, best_rate = n, rate
        chosen = {req_id: 0 for req_id in survivals}
        for _, pos, req_id in slots[:best_n]:
            # Invariant 61: a request verifies a prefix of its drafts, so slot `pos` comes after all
            # slots before it (survival never rises with position) (test_policy_takes_prefixes).
            if chosen[req_id] != pos:
                raise AdaptiveVerificationError(f"{req_id}: slot {pos} chosen after {chosen[req_id]} slots")
            chosen[req_id] += 1
        for req_id, num in chosen.items():
            if num == 0 and self._unverified_steps.get(req_id, 0) + 1 >= PROBE_INTERVAL and survivals[req_id]:
                chosen[req_id] = num = 1
            self._unverified_steps[req_id] = 0 if num else self._unverified_steps.get(req_id, 0) + 1
        return chosen

    def forget(self, req_id: str) -> None:
        self._unverified_steps.pop(req_id, None)
