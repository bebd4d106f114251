"""Console output: a rich live progress bar per phase on a terminal, plain lines everywhere else."""

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ladder.metrics import DEFINITIONS, Summary
from ladder.rung import RungOk, RungResult, RungVoid


def _mid(s: Summary | None) -> str:
    if s is None:
        return "-"
    return f"{s.percentiles.get('p50', s.mean):.1f}"


def rung_line(rung: RungResult) -> str:
    head = f"c={rung.concurrency:<4} {rung.status:<8}"
    if isinstance(rung, RungOk):
        st = rung.stats
        parts = [f"{rung.num_ok} ok",
                 f"ttft {_mid(st.ttft_ms)} ms", f"tpot {_mid(st.tpot_ms)} ms",
                 f"out {st.output_throughput:.1f} tok/s",
                 f"user {st.per_user_tok_s:.1f} tok/s" if st.per_user_tok_s else "user -",
                 f"tok/chunk {st.tokens_per_chunk.mean:.2f}",
                 f"client cpu {rung.audit.cpu_pct:.0f}%"]
        if rung.spec:
            parts.append(f"accept len {rung.spec.acceptance_length:.2f}")
        flagged = [f"{flag} ({rung.audit.criterion})" for flag in rung.flags]
        return head + "  ".join(parts + flagged)
    if isinstance(rung, RungVoid):
        first = f"  ({rung.errors[0]})" if rung.errors else ""
        return head + f"ok={rung.num_ok} failed={rung.num_failed}  {rung.reason}{first}"
    return head + rung.reason


class Display:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._progress: Progress | None = None
        self._task = None

    def note(self, text: str) -> None:
        self.console.print(escape(text), highlight=False)

    def phase_start(self, concurrency: int, phase: str, total: int) -> None:
        if not self.console.is_terminal:
            return
        self._progress = Progress(TextColumn(f"c={concurrency} {phase}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._task = self._progress.add_task(phase, total=total, failed=0)
        self._progress.start()

    def request_done(self, num_failed: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, failed=num_failed)

    def phase_end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def rung_end(self, rung: RungResult) -> None:
        self.console.print(escape(rung_line(rung)), highlight=False)

    def definitions(self) -> None:
        self.console.print("Definitions (ttft/tpot shown as p50):")
        for name, formula in DEFINITIONS.items():
            self.console.print(escape(f"  {name:<19} {formula}"), highlight=False)
