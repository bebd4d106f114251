"""The metrics `ladder compare` tabulates, and the cell of one (run, rung, metric).

A cell shows what the rung is: a number (with Δ% against the baseline run where there is one), VOID or
NOT_RUN with a footnote giving the reason, or "n/a" when an OK rung has no such number (TPOT of a
one-token response, acceptance on a server without spec counters). A VOID cell never carries a number.
"""

from collections.abc import Callable
from dataclasses import dataclass

from ladder.runs import Run, RungRow

Reader = Callable[[RungRow, str], float | None]  # (OK row, percentile key like "p50") -> value


def _stat(key: str) -> Reader:
    return lambda row, pct: (row.stats or {}).get(key)


def _summary(key: str, pct_key: str | None = None) -> Reader:
    def read(row: RungRow, pct: str) -> float | None:
        summary = (row.stats or {}).get(key)
        if not summary:
            return None
        return summary["mean"] if pct_key == "mean" else summary["percentiles"].get(pct)
    return read


def _spec(key: str) -> Reader:
    return lambda row, pct: (row.spec or {}).get(key)


@dataclass(frozen=True)
class Metric:
    key: str  # its entry in the run's definitions (ladder.metrics.DEFINITIONS)
    name: str
    unit: str
    decimals: int
    read: Reader


@dataclass(frozen=True)
class Group:
    title: str  # "{pct}" is replaced by the percentile shown
    direction: str  # "higher is better" | "lower is better" | ""
    metrics: tuple[Metric, ...]


OUTPUT_TPUT = Metric("output_throughput", "output", "tok/s", 1, _stat("output_throughput"))
TTFT = Metric("ttft_ms", "TTFT", "ms", 1, _summary("ttft_ms"))
TPOT = Metric("tpot_ms", "TPOT", "ms", 1, _summary("tpot_ms"))
PER_USER = Metric("per_user_tok_s", "per-user", "tok/s", 1, _stat("per_user_tok_s"))

GROUPS = (
    Group("Throughput over the measured window", "higher is better", (
        OUTPUT_TPUT,
        Metric("total_throughput", "total", "tok/s", 1, _stat("total_throughput")),
        Metric("request_throughput", "requests", "req/s", 3, _stat("request_throughput")),
        Metric("goodput", "goodput", "req/s", 3, _stat("goodput")),
    )),
    Group("Latency, {pct} over requests", "lower is better", (
        TTFT, TPOT, Metric("e2e_ms", "E2E", "ms", 1, _summary("e2e_ms")),
    )),
    Group("Interactivity and speculation", "higher is better", (
        PER_USER,
        Metric("tokens_per_chunk", "tokens per chunk (mean)", "tok", 2, _summary("tokens_per_chunk", "mean")),
        Metric("acceptance_length", "acceptance length", "tok", 2, _spec("acceptance_length")),
        Metric("acceptance_rate", "acceptance rate", "accepted / drafted", 2, _spec("acceptance_rate")),
        Metric("prefix_cache_hit_rate", "prefix cache hit rate", "hit / queried tokens", 2,
               lambda row, pct: (row.prefix_cache or {}).get("hit_rate")),
    )),
)


# --multi-turn's table: each field of a turn's statistics -> (its definition, name, unit, decimals)
TURN_FIELDS = {"ttft_ms": ("ttft_by_turn", "TTFT", "ms", 1),
               "input_tokens": ("input_tokens_by_turn", "prompt tokens, mean", "tok", 0),
               "cached_tokens": ("cached_tokens", "cached tokens, mean", "tok", 0)}


def turn_metric(field: str, turn: str) -> Metric:
    """One field of one turn index's statistics (a TTFT percentile, or a length's mean)."""
    key, name, unit, decimals = TURN_FIELDS[field]

    def read(row: RungRow, pct: str) -> float | None:
        value = ((row.turns or {}).get(turn) or {}).get(field)
        if not value:
            return None
        return value["percentiles"].get(pct) if field == "ttft_ms" else value["mean"]
    return Metric(key, name, unit, decimals, read)


class Footnotes:
    """Numbered footnotes in order of first use; the same text always gets the same number."""

    def __init__(self) -> None:
        self._texts: dict[str, int] = {}

    def ref(self, text: str) -> str:
        number = self._texts.setdefault(text, len(self._texts) + 1)
        return f"[^{number}]"

    def render(self) -> list[str]:
        return [f"[^{n}]: {text}" for text, n in self._texts.items()]


def status_note(run: Run, row: RungRow) -> str:
    """The footnote for a VOID or NOT_RUN rung: what happened, with the first error."""
    if row.status == "VOID":
        first = f"; first error: `{row.errors[0]}`" if row.errors else ""
        return (f"{run.label}, {rung_name(row)}: VOID, {row.num_ok} ok and {row.num_failed} failed "
                f"({row.reason}){first}. A VOID rung has no numbers.")
    return f"{run.label}, {rung_name(row)}: NOT_RUN ({row.reason})."


def _audit(row: RungRow) -> str:
    return (row.audit or {}).get("criterion", "no audit recorded")


def _late(row: RungRow) -> str:
    late = row.lateness or {}
    return f"{late.get('num_late', '?')} requests sent late (max {late.get('max_ms', 0):.0f} ms)"


# flag -> (what it says about the rung, the detail from its row)
FLAG_NOTES: dict[str, tuple[str, Callable[[RungRow], str]]] = {
    "CLIENT_BOUND": ("the numbers may describe the client as much as the server", _audit),
    "HOST_CONTENTION": ("another process delayed the client; the numbers may describe the machine's load", _audit),
    "BELOW_C": ("the rung never had c requests in flight, so it did not measure c",
                lambda row: f"peak {row.peak_in_flight} in flight"),
    "LATE": ("the client fell behind the arrival schedule, so the server saw less than the rate", _late),
    "PARTIAL": ("SIGINT or SIGTERM stopped the rung, so its numbers are over the requests that finished before",
                lambda row: f"{row.num_measured} measured requests finished"),
}


def flag_note(run: Run, row: RungRow, flag: str) -> str:
    meaning, detail = FLAG_NOTES[flag]
    return f"{run.label}, {rung_name(row)}: {flag}, {detail(row)}: {meaning}."


def rung_name(row: RungRow) -> str:
    return f"rate={row.request_rate:g}" if row.request_rate is not None else f"c={row.concurrency}"


def fmt(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def value(run: Run, c: int, metric: Metric, pct: str) -> float | None:
    row = run.ok(c)
    return metric.read(row, pct) if row is not None else None


def ci_path(metric: Metric, pct: str) -> str:
    """The metric's path in a --repeats row's confidence intervals (ladder.repeats)."""
    if metric.key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        return f"{metric.key}.{pct}"
    if metric.key == "tokens_per_chunk":
        return "tokens_per_chunk.mean"
    if metric.key.startswith("acceptance_"):
        return f"spec.{metric.key}"
    return metric.key


def spread(row: RungRow, metric: Metric, pct: str) -> str:
    """" ± h (CV c%)" for a --repeats row: the 95% CI's half-width and the CV over the repeats."""
    ci = ((row.repeats or {}).get("metrics") or {}).get(ci_path(metric, pct))
    if not ci or ci.get("half_width") is None:
        return ""
    cv = f", CV {100 * ci['cv']:.1f}%" if ci.get("cv") is not None else ""
    return f" ± {fmt(ci['half_width'], metric.decimals)} (n={ci['n']}{cv})"


def cell(run: Run, c: int, metric: Metric, pct: str, baseline: Run | None, notes: Footnotes) -> str:
    row = run.rungs.get(c)
    if row is None:
        return "not in run"
    if row.status != "OK":
        return f"{row.status}{notes.ref(status_note(run, row))}"
    v = metric.read(row, pct)
    text = "n/a" if v is None else fmt(v, metric.decimals) + spread(row, metric, pct)
    if v is not None and baseline is not None and baseline is not run:
        base = value(baseline, c, metric, pct)
        if base:  # no Δ against a missing, VOID or zero baseline value
            text += f" ({100 * (v - base) / base:+.1f}%)"
    for flag in row.flags:
        if flag in FLAG_NOTES:
            text += f" {flag}{notes.ref(flag_note(run, row, flag))}"
    return text
