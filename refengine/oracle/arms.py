"""The oracle's matrix: {sync depth 1, async depth 1, async depth 2} x {no spec, every method}
x {chunked prefill} x {forced preemption} x {bad_words}, plus a structured-output arm per front and method."""

import itertools
from dataclasses import dataclass

from refengine.oracle.teacher import TEACHER_METHODS
from refengine.spec_decode.config import ASYNC_SCHEDULING_COMPATIBLE

FRONTS = ("sync", "async-d1", "async-d2")
# The engine's methods, then the teachers (teacher.py), which run under every front.
METHODS = (*ASYNC_SCHEDULING_COMPATIBLE, *TEACHER_METHODS)


@dataclass(frozen=True, slots=True)
class Arm:
    front: str  # sync: Scheduler + step(); async-d1: AsyncScheduler + step(); async-d2: + batch queue
    method: str | None
    chunked: bool
    preempt: bool
    bad_words: bool
    structured: bool = False  # each request follows a JSON schema, a regex or a choice set (structured.py)

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
                ("structured", self.structured),
            )
            if on
        ]
        return f"{self.front}/{self.method or 'no-spec'}" + (f"[{','.join(flags)}]" if flags else "")

    def baseline(self) -> "Arm":
        """The reference of every arm, greedy and seeded: sync, no spec, no chunking, no preemption;
        bad_words and structured output change outputs by design, so they stay."""
        return Arm("sync", None, False, False, self.bad_words, self.structured)

    def sync_twin(self) -> "Arm":
        """The same method and workload, scheduled synchronously."""
        return Arm("sync", self.method, self.chunked, self.preempt, self.bad_words, self.structured)


def build_matrix(methods: tuple[str | None, ...], variants: bool = True, structured: bool = False) -> list[Arm]:
    """Without `variants`, only the plain arms: no chunking, no forced preemption, no bad_words. With
    `structured`, one structured-output arm per method and front (not crossed with the other variants,
    which would double the matrix)."""
    toggles = (False, True) if variants else (False,)
    arms = []
    for method, front, chunked, preempt, bad_words in itertools.product(methods, FRONTS, toggles, toggles, toggles):
        if front != "sync" and method is not None and not ASYNC_SCHEDULING_COMPATIBLE.get(method, True):
            continue  # the truth table forces these methods to sync: there is no async arm to run
        arms.append(Arm(front, method, chunked, preempt, bad_words))
    if structured:
        arms += [Arm(a.front, a.method, False, False, False, True) for a in arms if not (a.chunked or a.preempt or a.bad_words)]
    return arms
