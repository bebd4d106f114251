"""`mutations`: the named-mutation gate and the mutmut score gate.

Exit codes: 0 green; 1 red (a mutant not KILLED, a drifted mutant, a score below threshold);
2 configuration or usage error; 3 RESTORE_FAILED (the tree may still be mutated: run `mutations restore`).
"""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mutations.catalogue import CatalogueError, load_catalogue
from mutations.clean_run import CleanRunError, load_clean_run
from mutations.diffgate import judge, load_config_scope, plan, run_scoped, sample
from mutations.diffscope import DiffError, changed_functions, default_base
from mutations.gate import (
    STATS_PATH,
    GateError,
    evaluate,
    export_scoped_stats,
    load_stats,
    load_threshold,
    run_mutmut,
)
from mutations.journal import Journal, JournalError, recover
from mutations.model import Catalogue, Mutant, MutantResult, Status
from mutations.mutate import MutantRejected, mutate_source
from mutations.parallel import run_parallel
from mutations.ratchet import check as ratchet_check
from mutations.ratchet import file_scores, load_scores, render_scores
from mutations.ray_executor import run_on_ray
from mutations.records import load_records, read_all, stats_of, write_records
from mutations.records import merge as merge_records
from mutations.report import (
    closing_line,
    keep_marked_section,
    print_table,
    render_markdown,
    tree_commit,
    write_json,
)
from mutations.runner import JournalPending, Runner, check_apply
from mutations.scratch import run_mutants
from mutations.shards import (
    DURATIONS,
    coverage_failures,
    parse_shard,
    plan_scope,
    shard_plan,
    write_durations,
)
from mutations.survivors import load_survivors
from mutations.tree import tree_digest

STATE_DIR = ".mutations"
MARKDOWN_REPORT = Path("reports") / "mutations.md"
EXIT_RESTORE_FAILED = 3
# The PR-scoped gate's cap on mutants: a 26-line change in core/ makes 69, which took 5m50s on the loaded 2-core machine.
DIFF_MAX_MUTANTS = 100
SHARDS_DIR = Path(".mutations") / "shards"
SCORES = Path("mutations") / "scores.toml"
FULL_RUN_RECORDS = Path(".mutations") / "records.jsonl"

console = Console(highlight=False)


class ConfigError(click.ClickException):
    exit_code = 2


@dataclass(frozen=True)
class Context:
    root: Path
    catalogue_path: Path

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def catalogue(self) -> Catalogue:
        try:
            return load_catalogue(self.catalogue_path)
        except CatalogueError as exc:
            raise ConfigError(str(exc)) from exc

    def select(self, catalogue: Catalogue, only: tuple[str, ...]) -> tuple[Mutant, ...]:
        unknown = [i for i in only if catalogue.get(i) is None]
        if unknown:
            raise ConfigError(f"unknown mutant ids: {unknown}")
        return tuple(m for m in catalogue.mutants if not only or m.id in only)

    def label(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)


pass_context = click.make_pass_decorator(Context)
only_option = click.option("--only", multiple=True, metavar="ID", help="Only this mutant (repeatable).")


@click.group()
@click.version_option(package_name="specladder", prog_name="mutations")
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root: targets, tests and reports are relative to it.",
)
@click.option(
    "--catalogue",
    "catalogue_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Catalogue TOML [default: ROOT/mutations/catalogue.toml].",
)
@click.pass_context
def main(ctx: click.Context, root: Path, catalogue_path: Path | None) -> None:
    """Named invariant mutations (each must turn a named test red) and the mutmut score gate."""
    root = root.resolve()  # the journal and the tests' PYTHONPATH must not depend on the working directory
    ctx.obj = Context(root=root, catalogue_path=catalogue_path or root / "mutations" / "catalogue.toml")


@main.command("list")
@pass_context
def list_cmd(ctx: Context) -> None:
    """List the catalogue: a table on a terminal; piped, one tab-separated line per mutant (id, target,
    tests, must fail, timeout s, bug), so that nothing is wrapped or cut at 80 columns."""
    mutants = ctx.catalogue().mutants
    if not console.is_terminal:
        click.echo("\t".join(("id", "target", "tests", "must fail", "timeout s", "bug")))
        for m in mutants:
            click.echo(f"{m.id}\t{m.file}\t{len(m.tests)}\t{len(m.must_fail)}\t{m.timeout_s:g}\t{m.title}")
        return
    table = Table(title=ctx.label(ctx.catalogue_path))
    table.add_column("id", no_wrap=True)
    for column in ("bug", "target", "tests", "must fail", "timeout s"):
        table.add_column(column)
    for m in mutants:
        table.add_row(
            escape(m.id),
            escape(m.title),
            escape(m.file),
            str(len(m.tests)),
            str(len(m.must_fail)),
            f"{m.timeout_s:g}",
        )
    console.print(table)


@main.command("check-apply")
@only_option
@pass_context
def check_apply_cmd(ctx: Context, only: tuple[str, ...]) -> None:
    """Fast drift check: every mutant applies exactly once and compiles. Runs no tests."""
    checks = check_apply(ctx.select(ctx.catalogue(), only), ctx.root)
    for check in checks:
        status = "[green]OK[/green]" if check.status is None else f"[red]{check.status.value}[/red]"
        console.print(f"{escape(check.id)}: {status} {escape(check.detail)}")
    bad = sum(c.status is not None for c in checks)
    click.echo(f"check-apply: {len(checks) - bad} ok, {bad} failed")
    if bad:
        raise SystemExit(1)


@main.command()
@click.argument("mutant_id")
@pass_context
def show(ctx: Context, mutant_id: str) -> None:
    """Show one mutant: the bug, the invariant, the tests and the diff it makes."""
    (mutant,) = ctx.select(ctx.catalogue(), (mutant_id,))
    # Plain echo: node ids are copied from here, so they must not be wrapped at the terminal width.
    click.echo(f"{mutant.id}: {mutant.title}")
    click.echo(f"invariant: {mutant.invariant}")
    click.echo(f"tests: {' '.join(mutant.tests)}")
    click.echo(f"must fail: {' '.join(mutant.must_fail)}")
    click.echo(f"timeout: {mutant.timeout_s:g}s")
    target = ctx.root / mutant.file
    try:
        original = target.read_bytes()
        mutated = mutate_source(mutant, original)
    except OSError as exc:
        raise click.ClickException(f"cannot read {mutant.file}: {exc}") from exc
    except MutantRejected as exc:
        console.print(f"[red]{exc.status.value}[/red] {escape(exc.detail)}")
        raise SystemExit(1) from exc
    diff = difflib.unified_diff(
        original.decode("utf-8").splitlines(keepends=True),
        mutated.decode("utf-8").splitlines(keepends=True),
        fromfile=f"a/{mutant.file}",
        tofile=f"b/{mutant.file}",
    )
    click.echo("".join(diff), nl=False)


@main.command()
@only_option
@click.option("--budget-seconds", type=click.FloatRange(min=0), default=None, help="Whole-run budget.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"JSON report [default: ROOT/{STATE_DIR}/report.json, untracked].",
)
@click.option(
    "--write-report", is_flag=True, help=f"Also rewrite ROOT/{MARKDOWN_REPORT} (full catalogue only)."
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the mutants in N copies of the tree at once (one core each); the tree itself is then never mutated.",
)
@click.option(
    "--clean-run",
    "clean_run_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="JUNIT",
    help="JUnit XML (pytest --junitxml) of a run on this same tree: a mutant whose focused tests all "
    "passed there skips its own clean-tree run.",
)
@pass_context
def run(
    ctx: Context,
    only: tuple[str, ...],
    budget_seconds: float | None,
    report_path: Path | None,
    write_report: bool,
    jobs: int,
    clean_run_path: Path | None,
) -> None:
    """Run the named mutants: green baseline, mutate, focused tests, verified restore."""
    if write_report and only:
        raise ConfigError("--write-report describes the whole catalogue; it cannot be combined with --only")
    if jobs > 1 and budget_seconds is not None:
        raise ConfigError("--budget-seconds applies to one tree; it cannot be combined with --jobs")
    catalogue = ctx.catalogue()
    mutants = ctx.select(catalogue, only)
    try:
        # Read here even with --jobs, so that a bad report is refused before any copy is made.
        clean_run = None if clean_run_path is None else load_clean_run(clean_run_path, ctx.root)
    except CleanRunError as exc:
        raise ConfigError(str(exc)) from exc
    if jobs > 1:
        results = run_parallel(ctx.root, catalogue.path, mutants, jobs, clean_run_path)
    else:
        runner = Runner(
            ctx.root, ctx.state_dir, budget_s=budget_seconds, on_result=_print_progress, clean_run=clean_run,
            preload=catalogue.preload,
        )
        try:
            with _sigterm_unwinds():
                results = runner.run(mutants)
        except JournalPending as exc:
            raise ConfigError(str(exc)) from exc
    print_table(console, results)
    write_json(results, catalogue, report_path or ctx.state_dir / "report.json")
    if write_report:
        markdown = render_markdown(results, catalogue, ctx.label(catalogue.path), tree_commit(ctx.root))
        path = ctx.root / MARKDOWN_REPORT
        path.parent.mkdir(parents=True, exist_ok=True)
        previous = path.read_text(encoding="utf-8") if path.is_file() else ""
        path.write_text(keep_marked_section(markdown, previous), encoding="utf-8")
    if not results:
        console.print("[red]no mutants: a gate without mutants proves nothing[/red]")
    click.echo(closing_line(results, clean_run=clean_run is not None))
    if any(r.status is Status.RESTORE_FAILED for r in results):
        raise SystemExit(EXIT_RESTORE_FAILED)
    if not results or not all(r.passed for r in results):
        raise SystemExit(1)


@main.command()
@click.option("--force", is_flag=True, help="Restore even though the journal's runner pid is alive.")
@pass_context
def restore(ctx: Context, force: bool) -> None:
    """Undo an interrupted mutation from the journal, byte for byte, with the original mtime."""
    try:
        click.echo(recover(Journal(ctx.state_dir), force=force))
    except JournalError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command()
@click.option(
    "--threshold-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML with min_score and max_timeouts [default: ROOT/mutations/threshold.toml].",
)
@click.option(
    "--stats",
    "stats_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"mutmut export-cicd-stats output [default: ROOT/{STATS_PATH}].",
)
@click.option("--run", "run_first", is_flag=True, help="First do a fresh `mutmut run` + `export-cicd-stats`.")
@click.option("--max-children", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--timeout-seconds", type=click.FloatRange(min=1), default=None, help="Wall limit for mutmut.")
@click.option(
    "--scope",
    multiple=True,
    help="A file glob within mutmut's selection (e.g. 'refengine/sample/*'); repeatable. Only its mutants run "
    "and the score covers them alone. With no --run, the stats are recomputed over it from mutants/.",
)
@click.option(
    "--diff",
    "diff_base",
    metavar="BASE",
    default=None,
    help="PR-scoped: mutate only the functions changed since BASE (a commit; 'auto': the merge base with "
    "origin's default branch, else HEAD~1) and fail on any survivor not recorded in --survivors.",
)
@click.option(
    "--max-mutants",
    type=click.IntRange(min=0),
    default=DIFF_MAX_MUTANTS,
    show_default=True,
    help="With --diff: run a deterministic sample of this many when the change has more (0: all), and say so.",
)
@click.option(
    "--survivors",
    "survivors_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --diff: the reviewed survivors [default: ROOT/mutations/survivors.toml].",
)
@pass_context
def gate(
    ctx: Context,
    threshold_file: Path | None,
    stats_path: Path | None,
    run_first: bool,
    max_children: int,
    timeout_seconds: float | None,
    scope: tuple[str, ...],
    diff_base: str | None,
    max_mutants: int,
    survivors_path: Path | None,
) -> None:
    """The mutmut gate: strict score killed/(everything but skipped) against the threshold in the repo."""
    if diff_base is not None:
        if scope or stats_path is not None or run_first:
            raise ConfigError("--diff runs its own mutants: drop --scope, --stats and --run")
        _diff_gate(ctx, diff_base, max_children, timeout_seconds, max_mutants, survivors_path)
        return
    try:
        threshold = load_threshold(threshold_file or ctx.root / "mutations" / "threshold.toml")
    except GateError as exc:
        raise ConfigError(str(exc)) from exc
    if scope and stats_path is not None:
        raise ConfigError(f"--scope writes its own stats to {STATS_PATH}: drop --stats")
    if run_first:
        tree = None if scope else tree_digest(ctx.root)  # before the run: its verdicts are on the tree as it started
        failure = run_mutmut(ctx.root, max_children, timeout_seconds, scope)
        if failure is not None:
            click.echo(f"mutmut-gate: FAIL ({failure})")
            raise SystemExit(1)
        if not scope:
            # The full run's raw records: `mutations merge` ratchets on them and writes the per-file table
            # and the per-mutant durations that balance the next run's shards.
            try:
                write_records(read_all(ctx.root / "mutants", tree), ctx.root / FULL_RUN_RECORDS)
            except GateError as exc:
                raise ConfigError(str(exc)) from exc
    if scope:
        try:
            export_scoped_stats(ctx.root, scope)
        except GateError as exc:
            raise ConfigError(str(exc)) from exc
    try:
        stats = load_stats(stats_path or ctx.root / STATS_PATH)
    except GateError as exc:
        raise ConfigError(str(exc)) from exc
    verdict = evaluate(stats, threshold)
    table = Table(title="mutmut")
    table.add_column("bucket")
    table.add_column("mutants", justify="right")
    for bucket in (
        "killed",
        "survived",
        "timeout",
        "suspicious",
        "segfault",
        "no_tests",
        "not_checked",
        "skipped",
    ):
        table.add_row(bucket, str(getattr(stats, bucket)))
    table.add_row("interrupted", str(stats.check_was_interrupted_by_user))
    table.add_row("total", str(stats.total))
    console.print(table)
    for failure in verdict.failures:
        console.print(f"[red]{escape(failure)}[/red]")
    outcome = "PASS" if verdict.ok else "FAIL"
    click.echo(f"mutmut-gate: score {verdict.score:.4f} (min {threshold.min_score:.4f}) {outcome}")
    if not verdict.ok:
        raise SystemExit(1)


@main.command()
@click.option("--shard", "shard_text", default="1/1", show_default=True, metavar="I/N", help="Which shard of how many.")
@click.option("--max-children", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--timeout-seconds", type=click.FloatRange(min=1), default=None, help="Wall limit for mutmut.")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: this shard here, under mutmut's own children; ray: all --count shards as Ray tasks.",
)
@click.option("--address", default=None, help="With --executor ray: the cluster (e.g. 127.0.0.1:6379).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="With --executor ray: how many shards.")
@pass_context
def shard(
    ctx: Context,
    shard_text: str,
    max_children: int,
    timeout_seconds: float | None,
    executor: str,
    address: str | None,
    count: int | None,
) -> None:
    """Run shards of the full mutmut scope (balanced by mutations/durations.json); write raw records per shard
    to ROOT/.mutations/shards/I-of-N.jsonl for `mutations merge`."""
    if (executor == "ray") != (address is not None and count is not None):
        raise ConfigError("--executor ray takes --address and --count (and runs every shard); local takes --shard")
    try:
        index, total = (1, count) if count is not None else parse_shard(shard_text)
        scope = load_config_scope(ctx.root)
        shards = shard_plan(ctx.root, scope, total)
    except (GateError, DiffError) as exc:
        raise ConfigError(str(exc)) from exc
    wanted = range(1, total + 1) if executor == "ray" else [index]
    scratches = [ctx.root / SHARDS_DIR / f"scratch-{i}-of-{total}" for i in wanted]
    tests = list(scope.test_selection)
    if executor == "ray":
        try:
            done = run_on_ray(address, ctx.root, shards, scratches, tests, max_children, timeout_seconds)
        except RuntimeError as exc:
            raise ConfigError(str(exc)) from exc
    else:
        chosen = shards[index - 1]
        records, failure = run_mutants(
            ctx.root, scratches[0], chosen, tests, max_children, timeout_seconds, every_mutant=total == 1
        )
        done = [(records, failure, "local")]
    failed = False
    for i, (records, failure, node) in zip(wanted, done, strict=True):
        if failure is not None:
            click.echo(f"mutmut-shard {i}/{total}: FAIL ({failure})")
            failed = True
            continue
        out = ctx.root / SHARDS_DIR / f"{i}-of-{total}.jsonl"
        write_records(records, out)
        click.echo(f"mutmut-shard {i}/{total}: {len(records)} records in {ctx.label(out)} (node {node})")
    if failed:
        raise SystemExit(1)


@main.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--threshold-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML with min_score and max_timeouts [default: ROOT/mutations/threshold.toml].",
)
@click.option(
    "--write-scores",
    is_flag=True,
    help=f"When the gate passes, rewrite {SCORES} and {DURATIONS} from these records (the ratchet only rises).",
)
@pass_context
def merge_cmd(ctx: Context, parts: tuple[Path, ...], threshold_file: Path | None, write_scores: bool) -> None:
    """Merge shards' raw records, check they cover the scope's plan, and gate: score and per-file ratchet."""
    try:
        threshold = load_threshold(threshold_file or ctx.root / "mutations" / "threshold.toml")
        records = merge_records([load_records(part) for part in parts])
        planned = plan_scope(ctx.root, load_config_scope(ctx.root))
        recorded = load_scores(ctx.root / SCORES)
        here = tree_digest(ctx.root)
    except (GateError, DiffError) as exc:
        raise ConfigError(str(exc)) from exc
    # Invariant: the gate and the per-file table score this checkout, so its records must be this tree's.
    stale = sorted({r.tree for r in records} - {here})
    if stale:
        raise ConfigError(
            f"the records are of tree {', '.join(stale)}, this checkout is {here} (its sources, tests or "
            "[tool.mutmut] changed since): rerun the shards here"
        )
    stats = stats_of(records)
    verdict = evaluate(stats, threshold)
    scores = file_scores(records)
    failures = coverage_failures(planned, records) + verdict.failures + ratchet_check(scores, recorded, threshold.min_score)
    table = Table(title=f"mutmut, {len(parts)} shards merged")
    for column in ("file", "killed", "scored", "score", "recorded"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for path, score in scores.items():
        floor = recorded.get(path)
        table.add_row(escape(path), str(score.killed), str(score.scored), f"{score.score:.4f}", "new" if floor is None else f"{floor:.4f}")
    console.print(table)
    for failure in failures:
        click.echo(f"FAILED: {failure}")
    outcome = "FAIL" if failures else "PASS"
    click.echo(f"mutmut-merge: {len(records)} mutants, score {stats.score:.4f} (min {threshold.min_score:.4f}) {outcome}")
    if failures:
        raise SystemExit(1)
    if write_scores:
        (ctx.root / SCORES).parent.mkdir(parents=True, exist_ok=True)
        (ctx.root / SCORES).write_text(render_scores(scores, tree_commit(ctx.root)), encoding="utf-8")
        write_durations(records, ctx.root / DURATIONS)
        click.echo(f"wrote {SCORES} and {DURATIONS}")


def _diff_gate(
    ctx: Context, base: str, max_children: int, timeout_s: float | None, max_mutants: int, survivors_path: Path | None
) -> None:
    try:
        scope = load_config_scope(ctx.root)
        base = default_base(ctx.root) if base == "auto" else base
        functions = changed_functions(ctx.root, base, scope)
        survivors = load_survivors(survivors_path or ctx.root / "mutations" / "survivors.toml")
        planned = plan(ctx.root, functions)
    except (GateError, DiffError) as exc:
        raise ConfigError(str(exc)) from exc
    click.echo(f"diff-gate: base {base}: {len(functions)} changed functions in scope, {len(planned)} mutants")
    if not planned:
        click.echo("diff-gate: PASS (no mutant in the change: nothing in mutmut's scope changed)")
        return
    chosen = sample(planned, max_mutants)
    if len(chosen) < len(planned):
        console.print(
            f"[bold yellow]SAMPLED: {len(chosen)} of {len(planned)} mutants run (--max-mutants {max_mutants}); "
            f"{len(planned) - len(chosen)} stay unchecked: run `mutations gate --diff {base} --max-mutants 0` "
            "or `make mutmut` for all of them[/bold yellow]"
        )
    records, failure = run_scoped(ctx.root, chosen, scope, max_children, timeout_s)
    if failure is not None:
        click.echo(f"diff-gate: FAIL ({failure})")
        raise SystemExit(1)
    failures, excused = judge(chosen, records, survivors)
    # Plain echo: the names and digests are copied into survivors.toml, so they must not be wrapped.
    for line in excused:
        click.echo(f"excused: {line}")
    for line in failures:
        click.echo(f"FAILED: {line}")
    killed = sum(r.status == "killed" for r in records)
    sampled = f", sampled {len(chosen)} of {len(planned)}" if len(chosen) < len(planned) else ""
    outcome = "FAIL" if failures else "PASS"
    click.echo(f"diff-gate: {killed} of {len(records)} killed, {len(excused)} recorded survivors{sampled} {outcome}")
    if failures:
        raise SystemExit(1)


def _print_progress(result: MutantResult) -> None:
    style = "green" if result.passed else "red"
    console.print(
        f"{escape(result.id)}: [{style}]{result.status.value}[/{style}] {result.duration_s:.1f}s {escape(result.detail)}"
    )


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so the runner's restore (a `finally:`) runs before the process ends."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
