"""What an oracle arm did, seen from its scheduler: the peak number of requests running at once, the
preemptions and chunked prefills that happened, and (in a preempt arm) the preemption it forces.

A variant proves it happened by these counts: the judge calls an arm whose variant left no trace
INEFFECTIVE. The probe wraps one scheduler instance's methods; the engine's code path is unchanged, and
a forced preemption goes through the scheduler's own "no free blocks" branch.
"""

from dataclasses import dataclass

from refengine.core.scheduler import Scheduler
from refengine.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class ArmCounts:
    peak_concurrency: int  # the most requests running after any one schedule
    num_preemptions: int  # every preemption, the pool's and the forced ones
    # Preemptions of a request that had already verified drafts (with no drafter, or a random one:
    # emitted a token), so the resumption re-prefills past verified drafts.
    num_preemptions_after_drafts: int
    # Requests whose prompt prefill spanned >= 2 steps and that then verified drafts (with no drafter,
    # or a random one: that emitted tokens).
    num_chunked_prefills: int
    prefix_cache_hits: int = 0  # prompt tokens served from the prefix cache
    num_evictions: int = 0  # cached blocks evicted for new content
    # Request-steps that adaptive verification gave fewer than k drafts.
    num_short_verifies: int = 0


class SchedulerProbe:
    """Installed on one scheduler before its engine runs. With `force_preemption`, every request is
    evicted once: at the first allocation (for any request) that finds it the newest running request
    after it verified drafts (with no drafter: after its first token), the allocation reports no free
    blocks, so the scheduler's own preemption picks it. At most one such eviction per step. That also
    works at c = 1, where a tight pool alone never preempts."""

    def __init__(self, scheduler: Scheduler, *, spec: bool, force_preemption: bool) -> None:
        """`spec`: the evidence is verified drafts; otherwise emitted tokens."""
        self.scheduler = scheduler
        self.spec = spec
        self.force_preemption = force_preemption
        self.peak_concurrency = 0
        self.num_preemptions = 0
        self.num_preemptions_after_drafts = 0
        self._chunked: dict[str, Request] = {}
        self._forced: set[str] = set()
        self._evicted_this_step = False
        self._schedule = scheduler.schedule
        self._preempt = scheduler._preempt_request
        self._allocate = scheduler.kv_cache_manager.allocate_slots
        scheduler.schedule = self._counting_schedule
        scheduler._preempt_request = self._counting_preempt
        scheduler.kv_cache_manager.allocate_slots = self._allocate_or_evict

    def counts(self) -> ArmCounts:
        return ArmCounts(
            peak_concurrency=self.peak_concurrency,
            num_preemptions=self.num_preemptions,
            num_preemptions_after_drafts=self.num_preemptions_after_drafts,
            num_chunked_prefills=sum(self._progressed(r) for r in self._chunked.values()),
        )

    def _progressed(self, request: Request) -> bool:
        """Drafts verified (spec arms) or tokens emitted (no-spec arms): what follows a prefill or a
        preemption and exercises it."""
        return request.spec_decoding_stats.num_draft_tokens > 0 if self.spec else request.num_output_tokens > 0

    def _counting_schedule(self):
        self._evicted_this_step = False
        output = self._schedule()
        self.peak_concurrency = max(self.peak_concurrency, len(self.scheduler.running))
        for req_id in output.num_scheduled_tokens:
            request = self.scheduler.requests[req_id]
            # A first prefill (not a resumption) that this step did not finish: it spans >= 2 steps.
            if request.is_prefill_chunk and request.num_output_tokens == 0:
                self._chunked[req_id] = request
        return output

    def _counting_preempt(self, request: Request) -> None:
        self.num_preemptions += 1
        self.num_preemptions_after_drafts += self._progressed(request)
        self._preempt(request)

    def _allocate_or_evict(
        self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0, new_computed_blocks=None
    ):
        running = self.scheduler.running
        newest = running[-1] if running else None
        if (
            self.force_preemption
            and not self._evicted_this_step
            # Only the running loop preempts when allocation fails; admission would just stop.
            and request.status == RequestStatus.RUNNING
            and newest is not None
            and newest.request_id not in self._forced
            and self._progressed(newest)
        ):
            # "No free blocks": the scheduler preempts its newest running request, the one chosen here.
            self._forced.add(newest.request_id)
            self._evicted_this_step = True
            return None
        return self._allocate(request, num_new_tokens, num_lookahead_tokens, new_computed_blocks)
