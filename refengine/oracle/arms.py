"""The oracle's matrix: {sync depth 1, async depth 1, async depth 2} x {no spec, every method}
x {chunked prefill} x {forced preemption} x {bad_words}, plus a structured-output arm per front and method
and an adaptive-verification arm per front and Eagle-type method (teachers included)."""

import dataclasses
import itertools
from dataclasses import dataclass

from refengine.oracle.teacher import TEACHER_METHODS
from refengine.spec_decode.config import ASYNC_SCHEDULING_COMPATIBLE

FRONTS = ("sync", "async-d1", "async-d2")
# The engine's methods, then the teachers (teacher.py), which run under every front.
METHODS = (*ASYNC_SCHEDULING_COMPATIBLE, *TEACHER_METHODS)
# Those with an adaptive-verification arm: the device drafters (Eagle-type, async-capable) and the
# teachers, whose acceptance the policy has something to learn from.
ADAPTIVE_METHODS = (*(m for m, ok in ASYNC_SCHEDULING_COMPATIBLE.items() if ok), *TEACHER_METHODS)


@dataclass(frozen=True, slots=True)
class Arm:
    front: str  # sync: Scheduler + step(); async-d1: AsyncScheduler + step(); async-d2: + batch queue
    method: str | None
    chunked: bool
    preempt: bool
    bad_words: bool
    structured: bool = False  # each request follows a JSON schema, a regex or a choice set (structured.py)
    # The shared-prefix workload (prompts.shared_prefix_prompts), and whether the engine caches prefixes;
    # evict: a KV pool just large enough for c requests, so cached blocks are evicted.
    shared_prefix: bool = False
    prefix_cache: bool = False
    evict: bool = False
    # Adaptive verification on (enable_adaptive_verification): each step verifies 0..k drafts per request.
    adaptive: bool = False

    @property
    def async_scheduling(self) -> bool:
        return self.front != "sync"

    @property
    def batch_queue(self) -> bool:
        return self.front == "async-d2"

    @property
    def teacher(self) -> bool:
        return self.method in TEACHER_METHODS

    @property
    def name(self) -> str:
        flags = [
            f
            for f, on in (
                ("chunked", self.chunked), ("preempt", self.preempt), ("bad_words", self.bad_words),
                ("structured", self.structured), ("shared_prefix", self.shared_prefix and not self.prefix_cache),
                ("prefix_cache", self.prefix_cache), ("evict", self.evict), ("adaptive", self.adaptive),
            )
            if on
        ]
        return f"{self.front}/{self.method or 'no-spec'}" + (f"[{','.join(flags)}]" if flags else "")

    def baseline(self) -> "Arm":
        """The reference of every arm, greedy and seeded: sync, no spec, no chunking, no preemption;
        bad_words and structured output change outputs by design, so they stay, and so does the workload;
        the prefix cache is off."""
        return Arm("sync", None, False, False, self.bad_words, self.structured, self.shared_prefix)

    def sync_twin(self) -> "Arm":
        """The same method and workload, scheduled synchronously."""
        return dataclasses.replace(self, front="sync")


PREFIX_CACHE_MODES = ("on", "off", "only")


def build_matrix(
    methods: tuple[str | None, ...], variants: bool = True, structured: bool = False, prefix_cache: str = "off",
    adaptive: bool = True,
) -> list[Arm]:
    """Without `variants`, only the plain arms: no chunking, no forced preemption, no bad_words. With
    `structured`, one structured-output arm per method and front (not crossed with the other variants,
    which would double the matrix). With `prefix_cache` on, every method and front also runs the
    shared-prefix workload with the cache on (crossed with chunking and preemption under `variants`) and
    with a pool that forces evictions; "only" runs just those arms (and their references). Each front and
    ADAPTIVE_METHODS method also gets a plain arm with adaptive verification on (not crossed either), unless
    `adaptive` is off (tensor parallelism, which adaptive verification refuses)."""
    toggles = (False, True) if variants else (False,)
    plain = []
    for method, front, chunked, preempt, bad_words in itertools.product(methods, FRONTS, toggles, toggles, toggles):
        if front != "sync" and method is not None and not ASYNC_SCHEDULING_COMPATIBLE.get(method, True):
            continue  # the truth table forces these methods to sync: there is no async arm to run
        plain.append(Arm(front, method, chunked, preempt, bad_words))
    arms = [] if prefix_cache == "only" else list(plain)
    bare = [a for a in plain if not (a.chunked or a.preempt or a.bad_words)]
    if structured and prefix_cache != "only":
        arms += [Arm(a.front, a.method, False, False, False, True) for a in bare]
    if adaptive and prefix_cache != "only":
        arms += [dataclasses.replace(a, adaptive=True) for a in bare if a.method in ADAPTIVE_METHODS]
    if prefix_cache != "off":
        cached = [dataclasses.replace(a, shared_prefix=True, prefix_cache=True) for a in plain if not a.bad_words]
        arms += cached + [dataclasses.replace(a, evict=True) for a in cached if not (a.chunked or a.preempt)]
    return arms
