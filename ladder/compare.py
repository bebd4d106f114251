"""`ladder compare`: several runs side by side in one markdown report, after the like-for-like guard.

One table per metric group; rows are rungs (c), columns are runs. The guard runs first: differing
workloads are refused (unless allowed, and then shown in a banner), differing engine keys are listed in a
"not like-for-like" banner above every table.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ladder import guard, speedup
from ladder.config import ENGINE_KEYS, SetupError
from ladder.metrics import DEFINITIONS
from ladder.own_version import Build, build
from ladder.runs import Run, concurrencies
from ladder.table import GROUPS, TURN_FIELDS, Footnotes, Group, cell, turn_metric


@dataclass(frozen=True)
class Comparison:
    runs: list[Run]
    baseline: Run | None
    percentile: str  # "p50"
    engine_differences: list[guard.Difference]
    workload_differences: list[guard.Difference]  # non-empty only when the mismatch was allowed
    stop_differences: list[guard.Difference]  # output lengths the engines chose (no ignore_eos)

    @property
    def reference(self) -> Run:
        """The run whose workload the report describes."""
        return self.baseline or self.runs[0]


def prepare(runs: list[Run], baseline: str | None, percentile: float, allow_mismatch: bool,
            same_build: bool = False) -> Comparison:
    """Resolve the baseline, check the percentile exists, and apply the guard."""
    base = None
    if baseline is not None:
        base = next((r for r in runs if r.label == baseline), None)
        if base is None:
            raise SetupError(f"--baseline {baseline!r} names no run; the runs are: "
                             f"{', '.join(r.label for r in runs)}")
    pct = f"p{percentile:g}"
    for run in runs:
        shown = {k for row in run.rungs.values() if row.stats for k in row.stats["e2e_ms"]["percentiles"]}
        if shown and pct not in shown:
            raise SetupError(f"run {run.label} has no {pct} (it recorded {', '.join(sorted(shown))}); "
                             f"pick one with --percentile")
    workload = guard.workload_differences(runs)
    if workload and not allow_mismatch:
        raise SetupError("the workloads differ, so these runs are not comparable (--allow-mismatch shows them "
                         "anyway): " + "; ".join(d.line() for d in workload))
    return Comparison(runs, base, pct, guard.engine_differences(runs, same_build), workload,
                      guard.stop_differences(runs))


def workload_caption(run: Run) -> str:
    w, f = run.workload, run.flags
    sampling = w.get("sampling") or {}
    per_rung = (f"{f['prompts_per_rung']} prompts per rung" if f.get("prompts_per_rung")
                else f"{f.get('prompts_per_concurrency', '?')}·c prompts per rung")
    data = w.get("dataset") or {"kind": "random"}
    if data["kind"] == "random":
        prompts = f"{w.get('input_len') or '?'} tokens in"
    else:
        limit = f" of ≤ {data['max_input_len']} tokens" if data.get("max_input_len") else ""
        limit += f", ≤ {data['max_total_len']} tokens with the output" if data.get("max_total_len") else ""
        prompts = f"{data['kind']} prompts{limit} ({data.get('num_usable', '?')} of {data.get('num_records', '?')} records)"
    out_len = w.get("output_len") or "dataset lengths"
    slos = f", goodput SLOs (ms) {run.slos}" if run.slos != "none" else ""
    if w.get("multi_turn"):
        turns = w["multi_turn"]
        per_rung = (f"sessions of {turns['turns']} turns (replies from the {turns['reply']}), "
                    + per_rung.replace("prompts", "sessions"))
    if w.get("trace"):
        per_rung = f"a trace of {w['trace']['num_requests']} requests at {w['trace']['speedup']:g}x speed"
    return (f"{w.get('endpoint_kind', '?')}, {prompts} / {out_len} out"
            f"{' (ignore_eos)' if sampling.get('ignore_eos') else ''}, {per_rung}, "
            f"temperature {sampling.get('temperature', '?')}, seed {w.get('seed', '?')}{slos}")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _banner(cmp: Comparison) -> list[str]:
    out: list[str] = []
    if cmp.engine_differences:
        out += ["> **not like-for-like:** these runs differ in engine keys, so a difference in the tables "
                "is not only the engine's speed:", ">"]
        out += [f"> - {d.line()}" for d in cmp.engine_differences]
        out.append("")
    if cmp.workload_differences:
        out += ["> **different workloads (shown only because of --allow-mismatch):** the runs did not "
                "measure the same requests:", ">"]
        out += [f"> - {d.line()}" for d in cmp.workload_differences]
        out.append("")
    if cmp.stop_differences:
        out += ["> **replies of different lengths:** the requests were free to stop at EOS and the engines "
                "stopped at different tokens, so per-token figures (TPOT, ITL) compare and per-request ones "
                "(E2E, output throughput) carry the difference too:", ">"]
        out += [f"> - {d.line()}" for d in cmp.stop_differences]
        out.append("")
    interrupted = [r.label for r in cmp.runs if r.interrupted]
    if interrupted:
        out += [f"> **interrupted:** {', '.join(interrupted)} stopped (SIGINT or SIGTERM) before the last rung; "
                "the rungs it did not finish are missing.", ""]
    unverified = guard.unverified_engine_keys(cmp.runs)
    if unverified:
        out += [f"Engine keys no run reports, so unverified: {', '.join(unverified)}.", ""]
    return out


def _engine_table(runs: Sequence[Run]) -> list[str]:
    out = [_row(["engine key", *(r.label for r in runs)]), _row(["---"] * (len(runs) + 1))]
    for key in ENGINE_KEYS:
        cells = []
        for r in runs:
            v, source = r.engine.get(key), r.engine_sources.get(key)
            if key == "weights" and isinstance(v, str) and "/" in v:
                v = "…/" + v.rsplit("/", 1)[1]  # the banner compares, and shows, the whole path
            cells.append("unknown" if v is None else f"{v} ({source})" if source else str(v))
        out.append(_row([key, *cells]))
    return out


def load_column(run: Run) -> str:
    """The rung key's column: c (closed loop) or the request rate (open loop)."""
    return "rate (req/s)" if "request_rate" in (run.workload.get("load") or {}) else "c"


def _group_table(cmp: Comparison, group: Group, notes: Footnotes) -> list[str]:
    runs = cmp.runs
    heads = [r.label if r is cmp.baseline or cmp.baseline is None else f"{r.label} (Δ% vs {cmp.baseline.label})"
             for r in runs]
    title = group.title.replace("{pct}", cmp.percentile)
    out = [f"### {title}" + (f" ({group.direction})" if group.direction else ""), "",
           _row(["metric", load_column(cmp.reference), *heads]), _row(["---", "---:", *(["---:"] * len(runs))])]
    for metric in group.metrics:
        if metric.key == "goodput" and all(r.slos == "none" for r in runs):
            continue  # no run set --goodput: the row would be n/a everywhere
        formula = cmp.reference.definitions.get(metric.key) or DEFINITIONS.get(metric.key, "")
        name = f"{metric.name} ({metric.unit}){notes.ref(f'{metric.name}: {formula}')}"
        for c in concurrencies(runs):
            out.append(_row([name, f"{c:g}", *(cell(r, c, metric, cmp.percentile, cmp.baseline, notes) for r in runs)]))
    return out + [""]


def _turn_table(cmp: Comparison, notes: Footnotes) -> list[str]:
    """--multi-turn runs: TTFT, prompt tokens and cached tokens by turn index, rows per (rung, turn)."""
    runs = cmp.runs
    turns = sorted({int(t) for r in runs for row in r.rungs.values() for t in (row.turns or {})})
    if not turns:
        return []
    heads = [r.label if r is cmp.baseline or cmp.baseline is None else f"{r.label} (Δ% vs {cmp.baseline.label})"
             for r in runs]
    out = [f"### TTFT by turn, {cmp.percentile} over each turn's requests (lower is better)", "",
           "Turn k's prompt holds the session's k − 1 earlier turns and their replies, which a prefix cache can "
           "serve; cached tokens are the server's own count (usage.prompt_tokens_details), n/a where it gives none.",
           "", _row(["metric", load_column(cmp.reference), "turn", *heads]),
           _row(["---", "---:", "---:", *(["---:"] * len(runs))])]
    for field in TURN_FIELDS:
        for c in concurrencies(runs):
            for t in turns:
                metric = turn_metric(field, str(t))
                formula = cmp.reference.definitions.get(metric.key) or DEFINITIONS[metric.key]
                label = f"{metric.name} ({metric.unit}){notes.ref(f'{metric.name}: {formula}')}"
                cells = [cell(r, c, metric, cmp.percentile, cmp.baseline, notes) for r in runs]
                out.append(_row([label, f"{c:g}", str(t), *cells]))
    return out + [""]


# series -> (name, unit, decimals, scale) as the report shows them
SERVER_SERIES = {"running": ("running requests", "", 1, 1), "waiting": ("waiting requests", "", 1, 1),
                 "kv_usage": ("KV cache usage", "%", 2, 100), "preemptions": ("preemptions", "per interval", 1, 1),
                 "spec_acceptance_rate": ("spec acceptance rate", "per interval", 2, 1),
                 "spec_accept_length": ("spec acceptance length", "SGLang", 2, 1),
                 "prefix_cache_hit_rate": ("prefix-cache hit rate", "per interval", 2, 1),
                 "gpu_util_pct": ("GPU utilisation", "%", 0, 1), "gpu_mem_used_mib": ("GPU memory used", "MiB", 0, 1)}


def series_label(name: str) -> str:
    """A server series' name with its unit, as the table's rows and the plot's axes show it."""
    title, unit, _, _ = SERVER_SERIES[name]
    return f"{title} ({unit})" if unit else title


def _server_cell(run: Run, c: float) -> dict[str, str]:
    row = run.rungs.get(c)
    if row is None or row.server_metrics is None:
        return {}
    out = {}
    for name, s in row.server_metrics["series"].items():
        if name in SERVER_SERIES:
            _, _, decimals, scale = SERVER_SERIES[name]
            out[name] = "n/a" if s is None else f"{scale * s['mean']:,.{decimals}f} / {scale * s['peak']:,.{decimals}f}"
    return out


def _server_table(cmp: Comparison) -> list[str]:
    """The server's /metrics series per rung: mean / peak over the measured phase; n/a where the server
    does not expose the series."""
    runs = cmp.runs
    cells = {(r.label, c): _server_cell(r, c) for r in runs for c in concurrencies(runs)}
    if not any(cells.values()):
        return []
    intervals = sorted({row.server_metrics["interval_s"] for r in runs for row in r.rungs.values()
                        if row.server_metrics})
    out = ["### Server metrics over the measured phase (mean / peak)", "",
           f"Scraped from each server's /metrics every {', '.join(f'{i:g}' for i in intervals)} s; counters as "
           "their increase per interval. n/a: the server does not expose it; - : not scraped.", "",
           _row(["series", load_column(cmp.reference), *(r.label for r in runs)]),
           _row(["---", "---:", *(["---:"] * len(runs))])]
    for name in SERVER_SERIES:
        shown = [(c, [cells[(r.label, c)].get(name, "-") for r in runs]) for c in concurrencies(runs)]
        if all(v in ("-", "n/a") for _, vs in shown for v in vs) and name.startswith("gpu_"):
            continue  # no GPU series anywhere: not a row per rung of "-"
        out += [_row([series_label(name), f"{c:g}", *vs]) for c, vs in shown]
    return out + [""]


def _speedup_section(cmp: Comparison) -> list[str]:
    """--baseline: every other run's speed-up in TPOT (the baseline's over the run's) at each c, with the
    interval of the repeats, whether the load moved between the runs, and per content type on a mix."""
    arms = [r for r in cmp.runs if r is not cmp.baseline]
    if cmp.baseline is None or not arms:
        return []
    return [f"## Speed-up against {cmp.baseline.label}", "",
            speedup.table(cmp.baseline, arms, f"tpot_ms.{cmp.percentile}"), ""]


def render(cmp: Comparison, plot_links: Sequence[tuple[str, str]] = (), paragraphs: Sequence[str] = ()) -> str:
    """The markdown report; plot_links are (caption, path relative to the report), paragraphs go on top."""
    notes = Footnotes()
    runs = cmp.runs
    lines = [f"# ladder compare: {', '.join(r.label for r in runs)}", ""]
    for paragraph in paragraphs:
        lines += [paragraph, ""]
    lines += [f"Workload: {workload_caption(cmp.reference)}.", ""]
    lines += _banner(cmp)
    lines += [f"Report by ladder, {build().describe()}.", ""]
    lines += ["## Runs", "", _row(["run", "result directory", "ladder build", "host"]), _row(["---"] * 4)]
    lines += [_row([r.label + (" (interrupted)" if r.interrupted else ""), f"`{r.path}`", code_name(r.code),
                    host_name(r.host)]) for r in runs]
    lines += ["", "## Engine keys", "",
              "Each value with its source: `metadata` (asserted with --metadata), `server` (reported by the "
              "server) or `flags` (read from --serve-cmd).", ""]
    lines += _engine_table(runs) + [""]
    pct_note = (f"Latencies are the {cmp.percentile} over the measured requests of each rung; throughput is over "
                f"the rung's measured window.")
    lines += _speedup_section(cmp)
    lines += ["## Results", "", pct_note + (f" Δ% is against {cmp.baseline.label}." if cmp.baseline else ""),
              "VOID (a request failed: no numbers), NOT_RUN (the engine died earlier), CLIENT_BOUND (the client "
              "may have limited the rung) and HOST_CONTENTION (another process delayed the client) are footnoted "
              "with their reasons.", ""]
    for group in GROUPS:
        lines += _group_table(cmp, group, notes)
    lines += _turn_table(cmp, notes)
    lines += _server_table(cmp)
    if plot_links:
        lines += ["## Plots", "", f"Workload: {workload_caption(cmp.reference)}.", ""]
        lines += [f"![{caption}]({path})" for caption, path in plot_links] + [""]
    lines += notes.render()
    return "\n".join(lines) + "\n"


def code_name(code: dict | None) -> str:
    """The build a run's ladder came from, as a report names it."""
    if not code:
        return "unknown (manifest without a build)"
    return Build(**code).describe()


def host_name(host: dict | None) -> str:
    if not host or "cpu_model" not in host:
        return "unknown"
    gpus = ", ".join(f"{g['name']} (driver {g['driver']})" for g in host.get("gpus") or ()) or "no GPU seen"
    busy = " OVERLOADED (load average above the core count)" if host.get("overloaded") else ""
    return f"{host.get('cpu_model') or '?'} x{host.get('cpu_count')}, {gpus}{busy}"


def link(path: Path, report: Path | None) -> str:
    """path as the report links it: relative to the report's directory (or the working directory)."""
    start = report.parent if report is not None else Path.cwd()
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()
