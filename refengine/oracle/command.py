"""`refengine oracle`: the token-identity oracle over the whole scheduling x drafting matrix."""

import collections
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import click
import torch
from rich.console import Console

from refengine.engine.arg_utils import EngineArgs
from refengine.model.loader import TINY_MODELS
from refengine.oracle.absolute import detokenize
from refengine.oracle.arms import METHODS, PREFIX_CACHE_MODES, Arm, build_matrix
from refengine.oracle.judge import Verdict, bad_words_changes, judge
from refengine.oracle.prompts import shared_prefix_prompts, text_prompts, token_prompts
from refengine.oracle.report import markdown, print_table
from refengine.oracle.run import ArmResult, Workload
from refengine.oracle.runner import Job, OnDone, Runner, arm_runner, resolve_model
from refengine.oracle.slices import Section, SliceMismatchError, SliceReport, render, summary
from refengine.oracle.teacher import TEACHER_METHODS
from refengine.tokenizer.tokenizer import Tokenizer
from refengine.version import build

REPORT_PATH = Path("reports/oracle.md")
BASELINE = Arm("sync", None, False, False, False)
Results = dict[Arm, ArmResult]


def _csv_ints(ctx, param, value: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return values


def _methods(ctx, param, value: str) -> tuple[str | None, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n != "none" and n not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown methods {unknown}; choose from none, {', '.join(METHODS)}")
    return tuple(None if n == "none" else n for n in names)


def _device(ctx, param, value: str) -> str:
    if value == "cpu":
        return value
    if not value.startswith("cuda"):
        raise click.BadParameter(f"expected cpu or cuda[:N], got {value!r}")
    if not torch.cuda.is_available():
        raise click.BadParameter(f"{value!r} asked for, but torch sees no CUDA device")
    return value


def _device_name(device: str, results: list[Results]) -> str:
    if device == "cpu":
        return "the CPU"
    arms = [r for done in results for r in done.values()]
    replayed, steps = sum(r.num_graph_steps for r in arms), sum(r.num_engine_steps for r in arms)
    return f"{torch.cuda.get_device_name(device)} ({device}, CUDA graphs at batch size c and for mixed steps: {replayed} of {steps} engine steps replayed)"


def derive_bad_words(baseline: ArmResult) -> tuple[tuple[int, ...], ...]:
    """Two frequent single tokens and one two-token sequence from the baseline's own output, so the
    constraint certainly changes what is generated."""
    counts = collections.Counter(t for tokens in baseline.tokens for t in tokens[1:])
    singles = [(t,) for t, _ in counts.most_common(2)]
    first = baseline.tokens[0]
    pair = (first[1], first[2]) if len(first) > 2 else ()
    return tuple(singles + ([pair] if pair and pair[0] not in {s[0] for s in singles} else []))


@click.group("oracle", invoke_without_command=True)
@click.option("--model", default=EngineArgs.model, show_default=True, help="smollm2, a path, or tiny-llama / tiny-qwen3.")
@click.option("--methods", default="none," + ",".join(METHODS), show_default=True, callback=_methods)
@click.option("--c", "concurrency", default="1,2,4,8", show_default=True, callback=_csv_ints,
              help="Concurrency levels (max_num_seqs), all prompts submitted at once.")
@click.option("--prompts", "num_prompts", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=24, show_default=True, type=click.IntRange(min=2))
@click.option("--k", "num_speculative_tokens", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="The seeded sampling pass: every arm must equal the seeded no-spec baseline.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--variants/--no-variants", default=True, show_default=True,
              help="Also run every arm with chunked prefill, forced preemption and bad_words.")
@click.option("--seeded/--no-seeded", default=True, show_default=True, help="Run the seeded sampling pass.")
@click.option("--structured/--no-structured", default=True, show_default=True,
              help="Also run one structured-output arm per method and front (a JSON schema, a regex, a choice set).")
@click.option("--prefix-cache", default="on", show_default=True, type=click.Choice(PREFIX_CACHE_MODES),
              help="Also run every method and front on a shared-prefix workload with the prefix cache on, and with "
                   "a pool that forces evictions (only: just those arms and their references).")
@click.option("--block-size", default=None, type=click.IntRange(min=1), help="Default 4 for tiny models, 16 otherwise.")
@click.option("--write-report", is_flag=True,
              help="Write the report (markdown) and its slice (JSON, for `oracle merge`); without it nothing tracked changes.")
@click.option("--report", "report_path", default=str(REPORT_PATH), show_default=True, type=click.Path(dir_okay=False),
              help="Where --write-report writes; the slice goes beside it with the suffix .json.")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(min=1),
              help="Worker processes running arms in parallel, each loading the model once and using one thread; "
                   "1 runs every arm in this process. The results do not depend on it.")
@click.option("--executor", default="local", show_default=True, type=click.Choice(["local", "ray"]),
              help="local: here (--jobs); ray: every arm a task on the Ray cluster at --address (one GPU each on cuda).")
@click.option("--address", default=None, help="With --executor ray: the cluster's address (host:port).")
@click.option("--device", default="cpu", show_default=True, callback=_device,
              help="cpu, or cuda[:N]: the same arms on a GPU, their uniform steps replayed from CUDA graphs.")
@click.option("--tensor-parallel-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Run every arm's engine on this many ranks (processes; GPUs 0..N-1 with --device cuda). "
                   "Teacher methods replace one rank's drafter and are refused.")
@click.pass_context
def oracle_command(ctx, model, methods, concurrency, num_prompts, max_tokens, num_speculative_tokens, temperature,
                   seed, variants, seeded, structured, prefix_cache, block_size, write_report, report_path, jobs,
                   executor, address, device, tensor_parallel_size) -> None:
    """Run every arm of the matrix and judge it. Exits 1 on any failed arm. With --jobs N the arms run
    in N worker processes; the tables keep the matrix order. `oracle merge` combines slice reports."""
    if ctx.invoked_subcommand is not None:
        return
    # Wide enough that CI logs keep each arm on one line.
    console = Console(width=None if sys.stdout.isatty() else 220)
    if num_prompts < max(concurrency):
        raise click.UsageError(
            f"--prompts {num_prompts} is fewer than c = {max(concurrency)}: that slice could never run c requests at once"
        )
    if tensor_parallel_size > 1 and any(m in TEACHER_METHODS for m in methods):
        raise click.UsageError("--tensor-parallel-size > 1: drop the teacher methods from --methods")
    if (executor == "ray") != (address is not None):
        raise click.UsageError("--executor ray takes --address (and --address only goes with --executor ray)")
    loaded = resolve_model(model, device)
    block_size = block_size or (4 if model in TINY_MODELS else 16)
    prompts = (
        token_prompts(loaded.config.vocab_size, num_prompts, seed)
        if model in TINY_MODELS
        else text_prompts(loaded.tokenizer, num_prompts)
    )
    arms = build_matrix(methods, variants, structured, prefix_cache, adaptive=tensor_parallel_size == 1)
    workloads = [
        Workload(tuple(map(tuple, prompts)), max_tokens, c, temp, seed, num_speculative_tokens)
        for c in concurrency
        for temp in ((0.0, temperature) if seeded else (0.0,))
    ]
    sections: list[Section] = []
    started = time.perf_counter()
    with arm_runner(model, loaded, block_size, jobs, device, tensor_parallel_size, address) as runner:
        all_results, workloads = _run_passes(runner, arms, workloads, loaded.tokenizer, console)
    labels: collections.Counter[str] = collections.Counter()
    for workload, results in zip(banned_workloads(workloads, all_results), all_results, strict=True):
        verdicts = [_judge(arm, results, workload) for arm in arms]
        print_table(_title(workload), verdicts, console)
        sections.append(Section(workload.concurrency, workload.temperature, _title(workload),
                                markdown(_title(workload), verdicts)))
        labels.update(v.label for v in verdicts)
    report = SliceReport(
        model=model, methods=", ".join(m or "none" for m in methods), k=num_speculative_tokens,
        num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature if seeded else None, seed=seed,
        variants=variants, structured=structured, prefix_cache=prefix_cache, concurrency=tuple(concurrency), commit=_commit(),
        date=time.strftime("%Y-%m-%d"),
        host=(f"Ray cluster at {address}" if address else _host(jobs, device, all_results)) + (f"; tensor-parallel size {tensor_parallel_size}" if tensor_parallel_size > 1 else ""),
        sections=tuple(sections), labels=dict(labels),
        elapsed_s=round(time.perf_counter() - started, 1),
    )
    console.print(("[bold red]" if report.num_failed else "[bold green]") + summary(report.labels, report.elapsed_s))
    if write_report:
        path = Path(report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render([report]))
        path.with_suffix(".json").write_text(report.to_json())
    sys.exit(1 if report.num_failed else 0)


@oracle_command.command("merge")
@click.argument("slices", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", default=str(REPORT_PATH), show_default=True, type=click.Path(dir_okay=False, path_type=Path))
def merge_command(slices: tuple[Path, ...], out: Path) -> None:
    """Combine the JSON slices of `oracle --write-report --report ...` runs (one per --c slice, or per
    --methods part of one c) into one report. Exits 1 if any slice has a failed arm, 2 if the slices are not
    one matrix."""
    try:
        reports = [SliceReport.from_json(path.read_text()) for path in slices]
        text = render(reports)
    except (SliceMismatchError, ValueError, TypeError, KeyError) as e:
        raise click.UsageError(f"cannot merge: {e}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    failed = sum(r.num_failed for r in reports)
    click.echo(f"{out}: {len(reports)} slice(s), {failed} failed arm(s)")
    sys.exit(1 if failed else 0)


def _run_passes(
    runner: Runner, arms: list[Arm], workloads: list[Workload], tokenizer: Tokenizer, console: Console
) -> tuple[list[Results], list[Workload]]:
    """Every pass's needed arms, in waves: an arm runs alongside every arm whose output it does not read."""
    needed = [_needed(arms) for _ in workloads]
    progress = _Progress(console, sum(map(len, needed)) + len(workloads))
    # NOTE: engine runs outnumber the judged arms: each pass also runs its baseline once without a stop
    # token, and references outside the matrix; say so, or "[256/256]" reads as 256 arms against 252.
    console.print(f"{len(arms)} arms x {len(workloads)} passes = {len(arms) * len(workloads)} arms to judge, in "
                  f"{progress.total} engine runs (each pass adds its baseline without a stop token"
                  f"{' and the references outside the matrix' if progress.total > (len(arms) + 1) * len(workloads) else ''})",
                  markup=False, highlight=False)
    # First the baseline without a stop token, whose request 0 picks the stop every arm then uses.
    unstopped = _run_wave(runner, [[(BASELINE, w)] for w in workloads], progress)
    workloads = [with_stop(w, r[BASELINE], tokenizer) for w, r in zip(workloads, unstopped, strict=True)]
    results: list[Results] = [{} for _ in workloads]
    # Three waves: bad_words arms ban words taken from their pass's baseline output, and teacher arms
    # propose their own baseline's output (which for a teacher with bad_words is itself a bad_words arm).
    for wave in range(3):
        passes = banned_workloads(workloads, results) if wave else workloads
        jobs = [
            [(a, _arm_workload(a, w, r)) for a in need if a.bad_words + a.teacher == wave]
            for w, r, need in zip(passes, results, needed)
        ]
        for done, new in zip(results, _run_wave(runner, jobs, progress), strict=True):
            done |= new
    return results, workloads


def with_stop(workload: Workload, unstopped: ArmResult, tokenizer: Tokenizer) -> Workload:
    """Request 0 stops on the second token it emits without a stop, but only after min_tokens = half its
    max_tokens (at least 2): so the min_tokens mask certainly bites at position 1. Request 1 stops on the
    text of two of its own tokens from half way on, so the stop string certainly matches, and late."""
    min_tokens = min(workload.max_tokens, max(2, workload.max_tokens // 2))
    later = unstopped.tokens[1][workload.max_tokens // 2 :] if len(unstopped.tokens) > 1 else []
    texts = [detokenize(tokenizer, later[j : j + 2]) for j in range(len(later) - 1)]
    # Whole characters only: a lone byte of a multi-byte character has no text of its own.
    stop_string = next((t for t in texts if t and "\ufffd" not in t), None)
    return replace(workload, stop_token_id=unstopped.tokens[0][1], min_tokens=min_tokens, stop_string=stop_string)


def _arm_workload(arm: Arm, workload: Workload, results: Results) -> Workload:
    """The pass's workload as the arm runs it: the shared-prefix prompts, and a teacher's script."""
    if arm.shared_prefix:
        workload = replace(workload, prompts=shared_prefix_prompts(workload.prompts))
    if arm.teacher:
        workload = replace(workload, teacher_outputs=tuple(map(tuple, results[arm.baseline()].tokens)))
    return workload


def banned_workloads(workloads: list[Workload], results: list[Results]) -> list[Workload]:
    """Each pass's workload with the words its bad_words arms ban, taken from its baseline's output."""
    return [replace(w, bad_words_token_ids=derive_bad_words(r[BASELINE])) for w, r in zip(workloads, results)]


def _run_wave(runner: Runner, jobs_per_pass: list[list[Job]], on_done: OnDone) -> list[Results]:
    # One batch across all passes, so the workers are not left idle at the end of each pass.
    results = iter(runner.run([job for jobs in jobs_per_pass for job in jobs], on_done))
    return [{arm: next(results) for arm, _ in jobs} for jobs in jobs_per_pass]


def _needed(arms: list[Arm]) -> list[Arm]:
    """The arms and their references, in matrix order after the baseline, which every pass runs
    because the bad_words arms take their banned words from its output."""
    references = {a.sync_twin() for a in arms if a.method is not None} | {a.baseline() for a in arms}
    # References outside the matrix (--methods without none) run too, after it.
    extra = sorted(references - set(arms) - {BASELINE}, key=lambda a: a.name)
    return [BASELINE] + [arm for arm in arms if arm != BASELINE] + extra


@dataclass
class _Progress:
    """Prints each arm as it finishes; with --jobs the order is the order of completion."""

    console: Console
    total: int
    done: int = 0

    def __call__(self, workload: Workload, result: ArmResult) -> None:
        self.done += 1
        self.console.print(f"[run {self.done}/{self.total}] {_title(workload)}: {result.arm.name}", style="dim",
                           markup=False, highlight=False)


def _title(workload: Workload) -> str:
    temp = workload.temperature
    title = f"c={workload.concurrency}, {'greedy' if temp == 0 else f'temperature {temp} (seeded)'}"
    if workload.stop_token_id is not None:
        title += (f"; request 0 stops on token {workload.stop_token_id} after {workload.min_tokens}, request 1 on "
                  f"{workload.stop_string!r}")
    return title


def _judge(arm: Arm, results: Results, workload: Workload) -> Verdict:
    twin = results.get(arm.sync_twin()) if arm.method is not None else None
    changed = None
    if arm.bad_words:
        changed = bad_words_changes(results[arm], results[BASELINE], workload.prompts, workload.bad_words_token_ids)
    return judge(results[arm], results[arm.baseline()], twin, changed)


def _commit() -> str:
    """The source tree's commit, marked dirty where it has uncommitted changes: a slice run from a copy of
    a tree ahead of its repository's HEAD (a GPU host's) must not name HEAD as if it were that tree."""
    tree = build()
    if tree.commit is None:
        return "no git commit"
    return f"{tree.commit} (dirty)" if tree.dirty else tree.commit


def _host(jobs: int, device: str, results: list[Results]) -> str:
    threads = f"{jobs} worker processes of 1 torch thread each" if jobs > 1 else f"{torch.get_num_threads()} torch thread(s)"
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__} "
            f"on {_device_name(device, results)}; {threads}")
