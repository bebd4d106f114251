"""The search behind `ladder sweep`: the highest load (concurrency or request rate) that passes, found by
doubling from a start until a point fails or the limit is reached, then bisecting between the highest pass
and the lowest failure.

It assumes what a capacity search must: a load that fails, fails at every higher load. Concurrencies are
integers and the bisection ends when the highest pass and the lowest failure are neighbours; rates end
when the two are within RATE_RESOLUTION of each other (relative).
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

RATE_RESOLUTION = 0.05  # a rate search ends when the lowest failure is within 5% above the highest pass


@dataclass
class SearchResult:
    answer: float | None  # the highest load that passed; None when even the start failed
    tried: list[tuple[float, bool]] = field(default_factory=list)  # (load, passed) in the order run
    stopped: str | None = None  # why the search ended early (the engine died), else None


async def highest(passes: Callable[[float], Awaitable[bool | None]], start: float, limit: float,
                  integer: bool) -> SearchResult:
    """`passes(load)` runs one point: True / False, or None to stop the search (the engine died)."""
    result = SearchResult(None)

    async def run(load: float) -> bool | None:
        ok = await passes(load)
        if ok is not None:
            result.tried.append((load, ok))
        return ok

    lo, hi, load = None, None, min(start, limit)
    while hi is None:  # doubling
        ok = await run(load)
        if ok is None:
            result.stopped = "the engine died"
            break
        if not ok:
            hi = load
        else:
            lo = load
            if load >= limit:
                break
            load = min(2 * load, limit)
    while lo is not None and hi is not None and not _adjacent(lo, hi, integer):  # bisection
        mid = (lo + hi) // 2 if integer else (lo + hi) / 2
        ok = await run(mid)
        if ok is None:
            result.stopped = "the engine died"
            break
        lo, hi = (mid, hi) if ok else (lo, mid)
    result.answer = lo
    return result


def _adjacent(lo: float, hi: float, integer: bool) -> bool:
    """The highest pass and the lowest failure leave no load between them worth running."""
    return hi - lo <= 1 if integer else hi - lo <= RATE_RESOLUTION * lo
