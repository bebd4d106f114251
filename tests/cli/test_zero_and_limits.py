"""Every limit that `refengine serve`, `refengine generate`, `ladder run` and `ladder sweep` accept, at 0, 1, its
documented maximum and one past it (where it has one), and a negative value, checked where the command
line parses it; and what 0 means, written beside the wording of the flag's `--help`, which the test
reads so that the two cannot drift. Each meaning of 0 has an end-to-end test, named in the table.

The HTTP request fields' limits (max_tokens, top_k, logprobs, ...) are the table in
tests/server/test_zero_and_limits_http.py."""

from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ladder.cli import cli as ladder_cli
from refengine.entrypoints.cli_generate import generate_command
from refengine.entrypoints.cli_serve import make_serve_command


class Refused:
    def __repr__(self) -> str:
        return "REFUSED"


REFUSED = Refused()
# What each meaning of 0 is, and the test that shows it end to end.
E2E = {
    "refused": "tests/cli/test_zero_and_limits.py::test_a_refused_zero_is_a_one_line_usage_error",
    "a free port the OS picks": "tests/server/test_seeds.py::test_serve_port_0_listens_on_the_port_its_banner_names",
    "a seed like any other": "tests/server/test_seeds.py::test_seed_zero_is_a_seed_over_http",
    "no queue": "tests/server/test_zero_and_limits_http.py::test_max_waiting_requests_0_means_no_queue",
    "the first step raises": "tests/server/test_zero_and_limits_http.py::test_fault_after_steps_0_fails_the_first_step",
    "requests in flight are aborted at once": "tests/server/test_seeds.py::test_shutdown_grace_0_aborts_requests_in_flight_at_once",
    "greedy": "tests/server/test_zero_and_limits_http.py::test_temperature_0_is_greedy_and_top_k_0_is_off",
    "no warmup": "tests/ladder/test_ladder_zero_values.py::test_zero_warmup_and_zero_audit_thresholds",
    "any client CPU": "tests/ladder/test_ladder_zero_values.py::test_zero_warmup_and_zero_audit_thresholds",
    "any lag": "tests/ladder/test_ladder_zero_values.py::test_zero_warmup_and_zero_audit_thresholds",
    "never scraped": "tests/ladder/test_ladder_zero_values.py::test_zero_series_spread_top_k_and_request_seed",
    "exact lengths": "tests/ladder/test_ladder_zero_values.py::test_zero_series_spread_top_k_and_request_seed",
    "sent as top_k 0: off": "tests/ladder/test_ladder_zero_values.py::test_zero_series_spread_top_k_and_request_seed",
}


@dataclass(frozen=True)
class Limit:
    flag: str
    zero: str  # what 0 means: a key of E2E
    help: str  # the words of the flag's --help line (click's range included) that say it
    cases: dict[str, object] = field(default_factory=dict)  # argument -> the parsed value, or REFUSED


def positive(flag: str, low: int = 1, value=int, more: dict | None = None) -> Limit:
    """A limit whose least value is `low` (an integer range x>=low, or a float one x>0 when low is 0)."""
    if value is float:
        return Limit(flag, "refused", "x>0", {"0": REFUSED, "1": 1.0, "-1": REFUSED, **(more or {})})
    cases = {str(v): (v if v >= low else REFUSED) for v in range(min(0, low - 1), low + 1)} | {"-1": REFUSED}
    return Limit(flag, "refused", f"x>={low}", {**cases, **(more or {})})


SERVE = [
    Limit("--port", "a free port the OS picks", "0 = a free port the OS picks",
          {"0": 0, "1": 1, "65535": 65535, "65536": REFUSED, "-1": REFUSED}),
    positive("--max-num-seqs"),
    positive("--max-model-len", low=2),
    positive("--max-num-batched-tokens"),
    positive("--num-blocks"),
    positive("--kv-cache-memory-gib", value=float),
    positive("--block-size"),
    Limit("--seed", "a seed like any other", "0 is a seed like any other", {"0": 0, "1": 1, "-1": -1}),
    positive("--max-request-bytes"),
    Limit("--fault-after-steps", "the first step raises", "0 = the first step raises", {"0": 0, "1": 1, "-1": REFUSED}),
    positive("--threads"),
    Limit("--max-waiting-requests", "no queue", "0 = no queue", {"0": 0, "1": 1, "-1": REFUSED}),
    positive("--request-timeout", value=float),
    Limit("--shutdown-grace", "requests in flight are aborted at once", "0 = requests in flight are aborted at once",
          {"0": 0.0, "1": 1.0, "-1": REFUSED}),
    positive("--tensor-parallel-size"),
]
GENERATE = [
    positive("--max-tokens"),
    Limit("--temperature", "greedy", "0 is greedy", {"0": 0.0, "1": 1.0, "-1": REFUSED}),
    Limit("--seed", "a seed like any other", "0 is a seed like any other", {"0": 0, "1": 1, "-1": -1}),
    positive("--kv-cache-memory-gib", value=float),
    positive("--tensor-parallel-size"),
]
LADDER_RUN = [
    positive("--serve-timeout", value=float),
    Limit("--c", "refused", "each >= 1", {"0": REFUSED, "1": (1,), "-1": REFUSED, "1,0": REFUSED}),
    Limit("--request-rate", "refused", "each > 0", {"0": REFUSED, "1": (1.0,), "inf": (float("inf"),), "-1": REFUSED}),
    positive("--burstiness", value=float),
    positive("--max-concurrency"),
    positive("--max-duration", value=float),
    positive("--max-input-len"),
    positive("--max-total-len", low=2),
    positive("--input-len"),
    positive("--output-len", low=2),
    positive("--prompts-per-rung"),
    positive("--prompts-per-concurrency"),
    Limit("--warmup", "no warmup", "0 = no warmup", {"0": 0, "1": 1, "-1": REFUSED}),
    positive("--timeout", value=float),
    positive("--stall-timeout", value=float),
    Limit("--metric-percentiles", "refused", "in (0, 100]",
          {"0": REFUSED, "1": (1.0,), "100": (100.0,), "100.5": REFUSED, "-1": REFUSED}),
    Limit("--goodput", "refused", "each > 0",
          {"ttft:0": REFUSED, "ttft:1": {"ttft": 1.0}, "ttft:-1": REFUSED}),
    Limit("--seed", "a seed like any other", "0 is a seed like any other", {"0": 0, "1": 1, "-1": -1}),
    Limit("--temperature", "greedy", "0 = greedy", {"0": 0.0, "1": 1.0, "-1": REFUSED}),
    Limit("--client-bound-cpu-pct", "any client CPU", "0 = any client CPU", {"0": 0.0, "1": 1.0, "-1": REFUSED}),
    Limit("--client-bound-lag-ms", "any lag", "0 = any lag", {"0": 0.0, "1": 1.0, "-1": REFUSED}),
    Limit("--metrics-interval", "never scraped", "0 = never", {"0": 0.0, "0.5": 0.5, "-1": REFUSED}),
    positive("--repeats"),
    Limit("--range-ratio", "exact lengths", "0 = every request exactly --input-len and --output-len",
          {"0": 0.0, "0.5": 0.5, "1": REFUSED, "-1": REFUSED}),
    Limit("--top-p", "refused", "0<x<=1", {"0": REFUSED, "1": 1.0, "1.5": REFUSED, "-1": REFUSED}),
    Limit("--top-k", "sent as top_k 0: off", "0 or -1 = off, as in vLLM", {"0": 0, "1": 1, "-1": -1, "-2": REFUSED}),
    Limit("--request-seed", "a seed like any other", "0 is a seed like any other", {"0": 0, "1": 1, "-1": -1}),
    positive("--prefix-len"),
    positive("--num-prefixes"),
    positive("--multi-turn"),
    positive("--trace-speedup", value=float),
]
# `ladder sweep` takes `ladder run`'s flags but the loads, which its search sets, and its own limits.
LADDER_SWEEP = [limit for limit in LADDER_RUN if limit.flag not in ("--c", "--request-rate")] + [
    positive("--max-c"),
    positive("--max-rate", value=float),
    Limit("--slo-attainment", "refused", "0<x<=1", {"0": REFUSED, "0.9": 0.9, "1": 1.0, "1.5": REFUSED, "-1": REFUSED}),
]


def _no_engine(*_):
    raise AssertionError("parsing must not build an engine")


COMMANDS = {
    "refengine serve": (make_serve_command(_no_engine), SERVE),
    "refengine generate": (generate_command, GENERATE),
    "ladder run": (ladder_cli.commands["run"], LADDER_RUN),
    "ladder sweep": (ladder_cli.commands["sweep"], LADDER_SWEEP),
}
# Options that take a list of limits parsed by a callback, not by a click number type.
LIST_LIMITS = {"--c", "--request-rate", "--metric-percentiles", "--goodput"}
ROWS = [(name, limit) for name, (_, table) in COMMANDS.items() for limit in table]


def option(command: click.Command, flag: str) -> click.Option:
    (found,) = [p for p in command.params if flag in p.opts]
    return found


def help_line(command: click.Command, flag: str) -> str:
    """The flag's --help text as a user reads it (click's default and range included), on one line."""
    ctx = click.Context(command, info_name=command.name)
    return " ".join(option(command, flag).get_help_record(ctx)[1].split())


def parse(command: click.Command, flag: str, value: str) -> object:
    """The value the command line hands on for `flag value`, or REFUSED; nothing runs."""
    try:
        ctx = command.make_context(command.name, [flag, value, *required(command)])
    except click.UsageError:
        return REFUSED
    return ctx.params[option(command, flag).name]


def required(command: click.Command) -> list[str]:
    return ["--prompt", "x"] if command is generate_command else []


@pytest.mark.parametrize(("command", "table"), COMMANDS.values(), ids=COMMANDS.keys())
def test_every_number_a_command_takes_is_in_the_table(command, table):
    numbers = {
        p.opts[0] for p in command.params
        if isinstance(p, click.Option) and isinstance(p.type, click.types._NumberParamTypeBase)
    }
    listed = {limit.flag for limit in table}
    assert numbers <= listed, f"limits without a row: {sorted(numbers - listed)}"
    assert listed - numbers <= LIST_LIMITS


@pytest.mark.parametrize(("name", "limit"), ROWS, ids=[f"{n} {limit.flag}" for n, limit in ROWS])
def test_help_says_what_0_means(name, limit):
    command, _ = COMMANDS[name]
    assert limit.help in help_line(command, limit.flag)
    assert limit.zero in E2E


@pytest.mark.parametrize(
    ("name", "limit", "arg"),
    [(n, limit, arg) for n, limit in ROWS for arg in limit.cases],
    ids=[f"{n} {limit.flag} {arg}" for n, limit in ROWS for arg in limit.cases],
)
def test_each_value_parses_as_the_table_says(name, limit, arg):
    command, _ = COMMANDS[name]
    assert parse(command, limit.flag, arg) == limit.cases[arg]


def test_every_meaning_of_0_has_its_end_to_end_test():
    root = Path(__file__).parents[2]
    for nodeid in E2E.values():
        path, function = nodeid.split("::")
        assert f"def {function}(" in (root / path).read_text(), nodeid


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--max-num-seqs", "0"], "Invalid value for '--max-num-seqs': 0 is not in the range x>=1."),
    (["generate", "--prompt", "x", "--max-tokens", "0"], "Invalid value for '--max-tokens': 0 is not in the range x>=1."),
], ids=["serve", "generate"])
def test_a_refused_zero_is_a_one_line_usage_error(argv, message):
    from refengine.cli import main as refengine_main

    result = CliRunner().invoke(refengine_main, argv)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in result.output


def test_a_refused_zero_is_a_one_line_usage_error_in_ladder_run(capsys):
    from ladder.cli import main as ladder_main

    with pytest.raises(SystemExit) as exit_:
        ladder_main(["run", "--c", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ladder: error: Invalid value for '--c': expected positive integers"), err



# The config layer: the engine arguments behind `refengine serve`'s flags, as `LLM(...)` and `EngineArgs`
# take them from Python, refuse exactly the values the command line refuses (0 is never "not given").
ENGINE_ARGS = {
    "--max-num-seqs": ("max_num_seqs", [0, 1, -1]),
    "--max-model-len": ("max_model_len", [0, 1, 2, -1]),
    "--max-num-batched-tokens": ("max_num_batched_tokens", [0, 1, -1]),
    "--num-blocks": ("num_blocks", [0, 1, -1]),
    "--kv-cache-memory-gib": ("kv_cache_memory_gib", [0, -1]),
    "--block-size": ("block_size", [0, 1, -1]),
    "--seed": ("seed", [0, 1, -1]),
}
ENGINE_CASES = [(flag, value) for flag, (_, values) in ENGINE_ARGS.items() for value in values]


@pytest.fixture(scope="module")
def tiny_model():
    from refengine.model.loader import load_model

    return load_model("tiny-qwen3")


@pytest.mark.parametrize(("flag", "value"), ENGINE_CASES, ids=[f"{f}={v}" for f, v in ENGINE_CASES])
def test_engine_args_refuse_what_the_command_line_refuses(tiny_model, flag, value):
    from refengine.engine.arg_utils import EngineArgs
    from refengine.engine.engine_args import build_engine

    name, _ = ENGINE_ARGS[flag]
    (limit,) = [limit for limit in SERVE if limit.flag == flag]
    # A pool of 4 blocks of 16 for sequences of 16 tokens: every accepted value builds in milliseconds.
    base = {"max_model_len": 16, "block_size": 16, "num_blocks": 4, "max_num_batched_tokens": 64}
    if name == "kv_cache_memory_gib":
        base["num_blocks"] = None
    if name in ("block_size", "max_model_len"):
        # Room for a sequence in blocks of 1 token, and for the model's whole context (2048 tokens) were
        # max_model_len 0 taken for "not given".
        base["num_blocks"] = 2048
    args = EngineArgs(model=tiny_model, **{**base, name: value})
    if limit.cases[str(value)] is REFUSED:
        with pytest.raises(ValueError, match=name):
            build_engine(args)
    else:
        build_engine(args).core.shutdown()


def served(args: list[str]) -> tuple:
    """What `refengine serve ARGS` hands its engine factory: (EngineArgs, ServeOptions)."""
    seen = []

    def capture(engine_args, options):
        seen.append((engine_args, options))
        raise ValueError("captured")

    CliRunner().invoke(make_serve_command(capture), ["--port", "0", *args])
    (given,) = seen
    return given


SERVE_ACCEPTED = [(limit, arg) for limit in SERVE if limit.flag != "--port" for arg in limit.cases
                  if limit.cases[arg] is not REFUSED]


@pytest.mark.parametrize(("limit", "arg"), SERVE_ACCEPTED, ids=[f"{limit.flag}={a}" for limit, a in SERVE_ACCEPTED])
def test_each_accepted_serve_value_reaches_the_engine_or_the_server_unchanged(limit, arg):
    name = option(make_serve_command(_no_engine), limit.flag).name
    engine_args, options = served([limit.flag, arg])
    (value,) = [getattr(o, name) for o in (engine_args, options) if hasattr(o, name)]
    assert value == limit.cases[arg]
