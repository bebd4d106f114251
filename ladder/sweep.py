"""`ladder sweep`: the highest concurrency (or request rate) whose rung meets the --goodput SLOs.

Each point is a normal rung of `ladder run`, with its warmup, VOID rules and --repeats; a point passes
when it is OK and at least --slo-attainment of its measured requests meet every SLO (DistServe's
definition of goodput capacity). A VOID point fails. The search is ladder.search's doubling then
bisection; the result directory holds every point as a rung, and sweep.json the answer with the evidence.
"""

import math
from dataclasses import dataclass, replace

from ladder import rfc_json
from ladder.config import EXIT_ENGINE_DEAD, EXIT_OK, EXIT_VOID, RunConfig, SetupError
from ladder.display import Display
from ladder.rung import RungOk, RungResult
from ladder.search import highest


@dataclass(frozen=True)
class SweepSpec:
    max_c: int | None
    max_rate: float | None
    attainment: float  # the share of measured requests that must meet every SLO

    @property
    def open_loop(self) -> bool:
        return self.max_rate is not None


def passes(rung: RungResult, attainment: float) -> bool:
    """A point passes when it is OK and enough of its requests meet every SLO."""
    return isinstance(rung, RungOk) and rung.stats.goodput_fraction is not None and \
        rung.stats.goodput_fraction >= attainment


def point_config(config: RunConfig, spec: SweepSpec, load: float) -> RunConfig:
    if spec.open_loop:
        return replace(config, request_rates=(load,))
    return replace(config, concurrencies=(int(load),))


def evidence(rungs: dict[float, RungResult], order: list[tuple[float, bool]]) -> list[dict]:
    rows = []
    for load, ok in order:
        rung = rungs[load]
        stats = rung.stats if isinstance(rung, RungOk) else None
        rows.append({"load": load, "status": rung.status, "passed": ok,
                     "goodput_fraction": stats.goodput_fraction if stats else None,
                     "goodput": stats.goodput if stats else None,
                     "reason": getattr(rung, "reason", None)})
    return rows


def check(config: RunConfig, spec: SweepSpec) -> None:
    if not config.goodput:
        raise SetupError("ladder sweep searches for the highest load meeting SLOs: give them with --goodput")
    if (spec.max_c is None) == (spec.max_rate is None):
        raise SetupError("give --max-c (closed loop) or --max-rate (open loop), one of them")
    if spec.max_rate is not None and not math.isfinite(spec.max_rate):
        raise SetupError(f"--max-rate must be a finite rate in req/s, got {spec.max_rate}")
    if spec.max_c is not None and config.prompts_per_rung is not None and config.prompts_per_rung < spec.max_c:
        raise SetupError(f"--prompts-per-rung {config.prompts_per_rung} is below --max-c {spec.max_c}: a point above "
                         f"it could never have c requests in flight; use --prompts-per-concurrency")


def limit_reached(answer: float | None, spec: SweepSpec) -> bool:
    """The answer is the search's ceiling: the capacity is at least that, not that."""
    return answer is not None and answer >= (spec.max_rate if spec.open_loop else spec.max_c)


def report(answer: float | None, spec: SweepSpec, config: RunConfig, rows: list[dict], stopped: str | None) -> str:
    unit = "req/s" if spec.open_loop else "concurrent requests"
    slos = " ".join(f"{k}:{v:g}" for k, v in config.goodput.items())
    flag = f"--max-rate {spec.max_rate:g}" if spec.open_loop else f"--max-c {spec.max_c}"
    ceiling = f" (limit reached: {flag} passed, so the highest passing load is at least this; raise {flag})"
    head = (f"sweep: highest {'rate' if spec.open_loop else 'c'} meeting {slos} (ms) for "
            f">= {100 * spec.attainment:g}% of requests: "
            + (f"{answer:g} {unit}" + (ceiling if limit_reached(answer, spec) else "") if answer is not None
               else "none (the first point failed)"))
    lines = [head + (f"; stopped early: {stopped}" if stopped else "")]
    for r in rows:
        share = "-" if r["goodput_fraction"] is None else f"{100 * r['goodput_fraction']:.0f}% meet the SLOs"
        lines.append(f"  {'rate' if spec.open_loop else 'c'}={r['load']:g} {r['status']:<7} "
                     f"{'pass' if r['passed'] else 'FAIL'}  {share}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return "\n".join(lines)


async def run_sweep(config: RunConfig, spec: SweepSpec, session, display: Display) -> int:
    """`session` is the runner's open Session (endpoint, server, store); returns the exit code."""
    rungs: dict[float, RungResult] = {}

    async def point(load: float) -> bool | None:
        load = load if spec.open_loop else int(load)
        ladder = await session.ladder(point_config(config, spec, load))
        rung, dead = await ladder.run_repeats(load)
        rungs[load] = rung
        session.store.write_rungs([rungs[k] for k in sorted(rungs)])
        display.rung_end(rung)
        if dead is not None:
            session.dead = dead
            return None
        return passes(rung, spec.attainment)

    limit = spec.max_rate if spec.open_loop else spec.max_c
    result = await highest(point, 1.0 if not spec.open_loop else min(1.0, limit), limit, not spec.open_loop)
    rows = evidence(rungs, result.tried)
    text = report(result.answer, spec, config, rows, result.stopped)
    session.store.path("sweep.json").write_text(rfc_json.dumps({
        "answer": result.answer, "axis": "request_rate" if spec.open_loop else "concurrency",
        "slos_ms": config.goodput, "attainment": spec.attainment, "limit": limit,
        "limit_reached": limit_reached(result.answer, spec), "stopped": result.stopped,
        "points": rows}, indent=2) + "\n")
    display.note(text)
    if result.stopped:
        return EXIT_ENGINE_DEAD
    return EXIT_OK if result.answer is not None else EXIT_VOID
