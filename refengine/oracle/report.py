"""Rendering oracle verdicts: a rich table for the terminal and markdown for reports/oracle.md."""

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from refengine.oracle.judge import Verdict

COLUMNS = (
    "arm", "compared with", "tokens", "per-step drafts", "acceptance", "steps", "peak", "preemptions (after drafts)",
    "chunked prefills", "cache hits (tokens), evictions", "bad_words changes", "grammar: masked rows, cut drafts, ended", "argmax checked", "verdict",
)


def _cells(v: Verdict) -> tuple[str, ...]:
    r = v.result
    div = v.divergence
    if div is not None:
        tokens = f"diverged: request {div.request} position {div.position}: {div.expected} vs {div.actual}"
    else:
        tokens = "identical"
    if r.violations:
        tokens += "; WRONG " + "; ".join(r.violations[:2])
    if v.step_mismatch is not None:
        steps = f"MISMATCH {v.step_mismatch}"
    elif v.notes:
        steps = "; ".join(v.notes)
    elif r.arm.method is None:
        steps = "-"
    else:
        steps = "equal to sync" if r.arm.async_scheduling else "reference"
    rate = r.acceptance_rate
    acceptance = "-" if rate is None else f"{100 * rate:.1f}% of {r.num_draft_tokens}" + (" (random weights: exempt)" if r.random_init else "")
    c = r.counts
    verdict = v.label + (f" ({', '.join(v.ineffective)})" if v.ineffective else "")
    structured = (
        f"{r.num_grammar_masked_rows}, {r.num_grammar_cut_drafts}, {r.num_ended_by_grammar} of {len(r.tokens)}"
        if r.arm.structured
        else "-"
    )
    return (
        r.arm.name, v.reference, tokens, steps, acceptance, str(r.num_engine_steps), f"{c.peak_concurrency} of {r.concurrency}",
        f"{c.num_preemptions} ({c.num_preemptions_after_drafts})", str(c.num_chunked_prefills),
        f"{c.prefix_cache_hits}, {c.num_evictions}" if r.arm.prefix_cache else "-",
        "-" if v.bad_words_changes is None else str(v.bad_words_changes), structured, str(r.num_argmax_checked), verdict,
    )


def print_table(title: str, verdicts: Sequence[Verdict], console: Console) -> None:
    table = Table(title=title, show_lines=False)
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for v in verdicts:
        style = None if v.ok else "bold red"
        # Arm names carry [flags], which rich would read as markup.
        table.add_row(*(escape(c) for c in _cells(v)), style=style)
    console.print(table)


def markdown(title: str, verdicts: Sequence[Verdict]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(v)) + " |" for v in verdicts]
    return "\n".join(lines) + "\n"
