"""Console output: a rich live line per phase on a terminal, a plain progress line every PLAIN_EVERY_S
elsewhere, one line per finished rung, and a table of the --metric-percentiles at the end."""

from collections.abc import Callable, Sequence
from time import perf_counter

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ladder.config import DEFAULT_PERCENTILES
from ladder.metrics import DEFINITIONS, Summary, TurnStats
from ladder.records import RequestRecord, output_tokens
from ladder.rung import RungOk, RungResult, RungVoid

PLAIN_EVERY_S = 10.0
PLAIN_WIDTH = 160  # columns of the console off a terminal


def _mid(s: Summary | None) -> str:
    """The median when it was recorded, else the mean, always labelled with which it is."""
    if s is None:
        return "-"
    if "p50" in s.percentiles:
        return f"p50 {s.percentiles['p50']:.1f}"
    return f"mean {s.mean:.1f}"


def _by_turn(turns: dict[str, TurnStats]) -> str:
    """Each turn's TTFT, median (or mean) first: "p50 1: 812 | 2: 240 | 3: 260"."""
    first = next(iter(turns.values())).ttft_ms
    which = "p50" if first is not None and "p50" in first.percentiles else "mean"
    cells = [f"{t}: {'-' if s.ttft_ms is None else f'{s.ttft_ms.percentiles.get(which, s.ttft_ms.mean):.0f}'}"
             for t, s in turns.items()]
    return f"{which} " + " | ".join(cells)


def load_label(rung: RungResult) -> str:
    return f"rate={rung.request_rate:g}" if rung.request_rate is not None else f"c={rung.concurrency}"


def rung_line(rung: RungResult) -> str:
    head = f"{load_label(rung):<6} {rung.status:<8}"
    if isinstance(rung, RungOk):
        st = rung.stats
        parts = [f"{st.num_requests} measured ok (+{rung.num_ok - st.num_requests} warmup)",
                 f"ttft {_mid(st.ttft_ms)} ms", f"tpot {_mid(st.tpot_ms)} ms",
                 f"out {st.output_throughput:.1f} tok/s",
                 f"user {st.per_user_tok_s:.1f} tok/s" if st.per_user_tok_s else "user -",
                 f"tok/chunk {st.tokens_per_chunk.mean:.2f}" if st.tokens_per_chunk else "tok/chunk -",
                 f"client cpu {rung.audit.cpu_pct:.0f}%"]
        if st.goodput is not None:
            parts.append(f"goodput {st.goodput:.2f} req/s ({100 * st.goodput_fraction:.0f}%)")
        if rung.turns:
            parts.append(f"ttft by turn {_by_turn(rung.turns)} ms")
        if rung.spec:
            parts.append(f"accept len {rung.spec.acceptance_length:.2f}")
        if rung.spec_requests:
            d = rung.spec_requests
            parts.append(f"per request p10/p50/p90 {d.p10:.2f}/{d.p50:.2f}/{d.p90:.2f}")
        for kind, stats in (rung.by_content or {}).items():
            tpot = f"{stats.tpot_ms.mean:.1f} ms" if stats.tpot_ms else "-"
            accept = f", accept len {stats.spec.weighted_acceptance_length:.2f}" if stats.spec else ""
            parts.append(f"{kind}: tpot {tpot}{accept} ({stats.num_requests} req)")
        cache = rung.prefix_cache
        parts.append(f"cache hits {'n/a' if cache is None or cache.hit_rate is None else f'{100 * cache.hit_rate:.0f}%'}")
        if rung.num_unsent:
            parts.append(f"{rung.num_unsent} unsent (--max-duration)")
        running = ((rung.server_metrics or {}).get("series") or {}).get("running")
        if running:
            parts.append(f"server running mean {running['mean']:.1f} peak {running['peak']:g}")
        if rung.repeats:
            out = rung.repeats["metrics"].get("output_throughput") or {}
            spread = f" ± {out['half_width']:.1f}" if out.get("half_width") is not None else ""
            cv = f", CV {100 * out['cv']:.1f}%" if out.get("cv") is not None else ""
            parts.append(f"{rung.repeats['n']} repeats: out {out.get('mean', 0):.1f}{spread} tok/s (95% CI{cv})")
        notes = {rung.audit.flag: f"({rung.audit.criterion})",
                 "BELOW_C": f"(peak {rung.peak_in_flight} in flight < c={rung.concurrency})"}
        if rung.delivered_load is not None:
            notes["LOAD_MISS"] = f"({rung.delivered_load.missed})"
        if rung.lateness is not None:
            notes["LATE"] = (f"({rung.lateness.num_late} of {st.num_requests} sent late, "
                             f"max {rung.lateness.max_ms:.0f} ms)")
        return head + "  ".join(parts + [f"{flag} {notes[flag]}" for flag in rung.flags])
    if isinstance(rung, RungVoid):
        first = f"  ({rung.errors[0]})" if rung.errors else ""
        where = (" (" + ", ".join(f"{phase} {n}" for phase, n in rung.failed_phases.items()) + ")"
                 if rung.failed_phases else "")
        return head + f"ok={rung.num_ok} failed={rung.num_failed}{where}  {rung.reason}{first}"
    return head + rung.reason


class Display:
    def __init__(self, console: Console | None = None, explain: bool = False,
                 clock: Callable[[], float] = perf_counter, percentiles: Sequence[float] = DEFAULT_PERCENTILES):
        self.console = console or Console(highlight=False, soft_wrap=True)
        if console is None and not self.console.is_terminal:
            self.console.width = PLAIN_WIDTH  # a log is read later: nothing limits its width, keep tables whole
        self.explain = explain
        self.percentiles = tuple(f"p{p:g}" for p in percentiles)
        self.clock = clock
        self._progress: Progress | None = None
        self._task = None
        self._phase = ""
        self._done = self._failed = self._total = self._tokens = 0
        self._ttfts: list[float] = []
        self._t0 = self._last_plain = 0.0
        self._rungs: list[RungResult] = []
        self._num_rungs = 0

    def note(self, text: str) -> None:
        self.console.print(escape(text), highlight=False)

    def start(self, num_rungs: int) -> None:
        """A ladder begins: `ladder sweep --pareto` runs one per ISL:OSL pair through one display."""
        self._num_rungs = num_rungs
        self._rungs = []

    def phase_start(self, rung: str, phase: str, total: int) -> None:
        """rung: how the rung is named, e.g. "c=4" or "rate=2"."""
        self._phase = f"rung {len(self._rungs) + 1}/{self._num_rungs or '?'} {rung} {phase}"
        self._done = self._failed = self._tokens = 0
        self._total = total
        self._ttfts = []
        self._t0 = self._last_plain = self.clock()
        if not self.console.is_terminal:
            return
        self._progress = Progress(TextColumn(self._phase), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[live]}"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._task = self._progress.add_task(phase, total=total, live="")
        self._progress.start()

    def live(self) -> str:
        """failed count, output tok/s so far, TTFT p50 so far, and an ETA once a few requests finished."""
        elapsed = max(self.clock() - self._t0, 1e-9)
        parts = [f"{self._failed} failed", f"{self._tokens / elapsed:.1f} out tok/s"]
        if self._ttfts:
            ttfts = sorted(self._ttfts)
            parts.append(f"ttft p50 {1e3 * ttfts[len(ttfts) // 2]:.0f} ms")
        if self._done >= 3:  # calibrated: the rate so far predicts the rest
            parts.append(f"eta {elapsed / self._done * (self._total - self._done):.0f} s")
        return "  ".join(parts)

    def request_done(self, rec: RequestRecord, failed: bool) -> None:
        self._done += 1
        self._failed += failed
        if not failed:
            self._tokens += output_tokens(rec)
            if rec.streamed:
                self._ttfts.append(rec.chunk_times[0] - rec.t_send)
        if self._progress is not None:
            self._progress.update(self._task, advance=1, live=self.live())
        elif self.clock() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = self.clock()
            self.console.print(escape(f"{self._phase}: {self._done}/{self._total} done  {self.live()}"),
                               highlight=False)

    def phase_end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def rung_end(self, rung: RungResult) -> None:
        self._rungs.append(rung)
        self.console.print(escape(rung_line(rung)), highlight=False)

    def finish(self) -> None:
        """The end table, then the metric definitions when --explain asked for them."""
        table = end_table(self._rungs, self.percentiles)
        # NOTE: as wide as the table needs: rich would otherwise cut the numbers ("12345.6 / 2…") to fit
        # an 80-column terminal; a terminal wraps a long line, which loses no digit.
        width = self.console.width
        self.console.width = max(width, Measurement.get(self.console, self.console.options.update_width(1 << 16),
                                                        table).maximum)
        self.console.print(table)
        self.console.width = width
        if self.explain:
            self.console.print("Definitions:")
            for name, formula in DEFINITIONS.items():
                self.console.print(escape(f"  {name:<19} {formula}"), highlight=False)


def end_table(rungs: Sequence[RungResult], percentiles: Sequence[str] = ("p50", "p90", "p99")) -> Table:
    """One row per rung; each latency cell is the percentiles in ms, e.g. p50 / p90 / p99 ("-" where not
    recorded)."""
    table = Table(title="latency per rung, ms: " + " / ".join(percentiles), box=box.ASCII)
    for name in ("rung", "status", "TTFT", "TPOT", "E2E"):
        table.add_column(name, no_wrap=True)
    for rung in rungs:
        cells = ["-"] * 3
        if isinstance(rung, RungOk):
            st = rung.stats
            cells = [" / ".join(f"{s.percentiles[p]:.1f}" if s is not None and p in s.percentiles else "-"
                                for p in percentiles) for s in (st.ttft_ms, st.tpot_ms, st.e2e_ms)]
        table.add_row(load_label(rung), rung.status, *cells)
    return table
