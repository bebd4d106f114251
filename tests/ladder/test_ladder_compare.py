"""ladder compare over fixture runs: cells, VOID/NOT_RUN/CLIENT_BOUND, the like-for-like guard, plots."""

import re

import pytest
from run_fixtures import REFENGINE, WORKLOAD, not_run, ok, void, write_run

from ladder.cli import main


@pytest.fixture
def compare(capsys):
    """Run `ladder compare` in-process; returns (exit code, stdout, stderr)."""
    def run(*args: str):
        with pytest.raises(SystemExit) as exc:
            main(["compare", *map(str, args)])
        cap = capsys.readouterr()
        return exc.value.code, cap.out, cap.err
    return run


def rows(report: str, metric: str) -> dict[int, list[str]]:
    """{c: cells} of one metric's rows in the report's tables."""
    out = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[0].startswith(metric + " (") and cells[1].isdigit():
            out[int(cells[1])] = cells[2:]
    return out


def footnote(report: str, cell: str) -> str:
    number = re.search(r"\[\^(\d+)\]", cell).group(1)
    return next(line for line in report.splitlines() if line.startswith(f"[^{number}]:"))


def test_cells_hold_value_and_delta_against_the_baseline(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0, tpot=20.0), ok(2, 180.0)])
    b = write_run(tmp_path, "b", [ok(1, 120.0, tpot=25.0), ok(2, 90.0)])
    code, out, err = compare(a, b, "--baseline", "a")
    assert (code, err) == (0, "")
    assert rows(out, "output") == {1: ["100.0", "120.0 (+20.0%)"], 2: ["180.0", "90.0 (-50.0%)"]}
    assert rows(out, "TPOT")[1] == ["20.0", "25.0 (+25.0%)"]
    assert "| metric | c | a | b (Δ% vs a) |" in out
    assert "not like-for-like" not in out
    # no baseline: values only
    code, out, _ = compare(a, b)
    assert rows(out, "output")[1] == ["100.0", "120.0"]


def test_void_not_run_and_client_bound_stay_visible_with_reasons(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0, cpu_pct=97.0, loop_lag_ms=30.0), ok(2, 150.0), ok(4, 200.0)])
    b = write_run(tmp_path, "b", [ok(1, 90.0), void(2, error="http_error: HTTP 500: request submitted to a "
                                                                    "stopped AsyncLLM"), not_run(4)])
    code, out, _ = compare(a, b, "--baseline", "b")
    assert code == 0
    for metric in ("output", "TTFT", "TPOT", "per-user", "acceptance length"):
        cells = rows(out, metric)
        assert re.fullmatch(r"VOID\[\^\d+\]", cells[2][1]), cells  # never blank, never a number
        assert re.fullmatch(r"NOT_RUN\[\^\d+\]", cells[4][1]), cells
    output = rows(out, "output")
    void_note = footnote(out, output[2][1])
    assert "b, c=2: VOID, 1 ok and 7 failed (http_error)" in void_note and "stopped AsyncLLM" in void_note
    assert "engine_dead: the server process exited" in footnote(out, output[4][1])
    # CLIENT_BOUND keeps its numbers and says why; Δ% against a VOID baseline cell is not computed
    assert output[1][0].startswith("100.0 (+11.1%) CLIENT_BOUND[^")
    assert "event-loop lag p99 30.0 ms > 10 ms, client CPU 97% of a core > 90%" in footnote(out, output[1][0])
    assert output[2][0] == "150.0" and output[4][0] == "200.0"
    assert rows(out, "acceptance length")[1][1] == "n/a"  # an OK rung without spec counters


def test_a_rung_that_never_reached_c_is_flagged_below_c(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0), ok(4, 150.0, peak=2)])
    code, out, _ = compare(a)
    output = rows(out, "output")
    assert code == 0 and output[1] == ["100.0"] and output[4][0].startswith("150.0 BELOW_C[^")
    assert "a, c=4: BELOW_C, peak 2 in flight: the rung never had c requests in flight" in footnote(out, output[4][0])


def test_open_loop_runs_are_keyed_by_rate_and_never_mixed_with_closed_loop(tmp_path, compare):
    rate_workload = {**WORKLOAD, "load": {"request_rate": [1.0, 2.5], "burstiness": 1.0, "max_concurrency": None}}
    rungs = [ok(1, 100.0), ok(2, 150.0)]
    for rung, rate in zip(rungs, (1.0, 2.5)):
        object.__setattr__(rung, "request_rate", rate)
    a = write_run(tmp_path, "a", rungs, workload=rate_workload)
    code, out, _ = compare(a)
    assert code == 0 and "| metric | rate (req/s) | a |" in out
    assert [line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| output (")] == ["1", "2.5"]
    closed = write_run(tmp_path, "b", [ok(1, 100.0)], workload={**WORKLOAD, "load": {"concurrency": [1]}})
    code, _, err = compare(a, closed)
    assert code == 2 and "load: a = request rate, b = concurrency" in err


def test_formulas_are_footnoted_and_the_percentile_is_stated(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0, ttft=100.0)])
    code, out, _ = compare(a, "--percentile", "90")
    assert code == 0
    assert "### Latency, p90 over requests (lower is better)" in out
    assert rows(out, "TTFT")[1] == ["120.0"]  # the fixture's p90 is 1.2 x the mean
    assert "the p90 over the measured requests" in out
    tpot_name = next(line for line in out.splitlines() if line.startswith("| TPOT")).split("|")[1]
    assert footnote(out, tpot_name).endswith("TPOT: (E2E - TTFT) / (N - 1) per request; N = usage.completion_tokens")
    code, _, err = compare(a, "--percentile", "95")
    assert code == 2 and "run a has no p95" in err


def test_banner_lists_a_spec_on_spec_off_mix(tmp_path, compare):
    off = write_run(tmp_path, "spec-off", [ok(1, 100.0)])
    eagle = write_run(tmp_path, "eagle", [ok(1, 180.0)],
                      engine={**REFENGINE, "spec_method": "eagle", "spec_k": 3})
    code, out, err = compare(off, eagle)
    assert code == 0
    banner = [line for line in out.splitlines() if line.startswith(">")]
    assert banner[0].startswith("> **not like-for-like:**")
    assert banner[2:] == ["> - spec_method: spec-off = none, eagle = eagle", "> - spec_k: spec-off = 0, eagle = 3"]
    assert "not like-for-like: spec_method: spec-off = none, eagle = eagle" in err
    assert "Engine keys no run reports, so unverified: engine_version." in out


def test_banner_lists_a_cpu_run_beside_a_gpu_run(tmp_path, compare):
    cpu = write_run(tmp_path, "cpu", [ok(1, 100.0)])
    gpu = write_run(tmp_path, "gpu", [ok(1, 900.0)], engine={**REFENGINE, "device": "cuda"})
    code, out, err = compare(cpu, gpu)
    assert code == 0
    assert "> - device: cpu = cpu, gpu = cuda" in out.splitlines()
    assert "not like-for-like: device: cpu = cpu, gpu = cuda" in err


def test_banner_lists_a_weight_format_difference_and_unknown_keys(tmp_path, compare):
    q4 = write_run(tmp_path, "q4", [ok(1, 100.0)])
    f32 = write_run(tmp_path, "f32", [ok(1, 60.0)],
                    engine={**REFENGINE, "weight_format": "F32", "weights": "smol-f32.gguf", "numerics": None})
    code, out, _ = compare(q4, f32)
    assert code == 0
    assert "> - weight_format: q4 = Q4_1, f32 = F32" in out
    assert "> - weights: q4 = smol.gguf, f32 = smol-f32.gguf" in out
    assert "> - numerics: q4 = batch_invariant, f32 = unknown" in out  # unknown never passes as equal
    assert "| weight_format | Q4_1 (server) | F32 (server) |" in out


def test_a_workload_mismatch_is_refused_unless_allowed(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0), ok(2, 150.0)])
    other = {**WORKLOAD, "seed": 1, "rung_prompt_hashes": {**WORKLOAD["rung_prompt_hashes"], "2": "x" * 64}}
    b = write_run(tmp_path, "b", [ok(1, 100.0), ok(2, 150.0)], workload=other)
    code, out, err = compare(a, b)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "the workloads differ" in err and "seed: a = 0, b = 1" in err
    assert "prompt texts at c=2: a = h2h2h2h2h2h2, b = xxxxxxxxxxxx" in err
    code, out, _ = compare(a, b, "--allow-mismatch")
    assert code == 0
    assert "> **different workloads (shown only because of --allow-mismatch):**" in out
    assert "> - seed: a = 0, b = 1" in out


@pytest.mark.parametrize("b_rung, refused", [
    (ok(1, 90.0, input_tokens=130), None),  # a chat template's extra BOS: within ±2
    (ok(1, 90.0, input_tokens=131), "input tokens at c=1: a = 128, b = 131 (must match within ±2)"),
    (ok(1, 90.0, output_tokens=63), "output tokens at c=1: a = 64, b = 63 (must match exactly)"),
    # the same shortest output, but b's longest differs: the guard must look at both ends of the span
    (ok(1, 90.0, output_tokens=64, output_max=70), "output tokens at c=1: a = 64, b = 64–70 (must match exactly)"),
])
def test_realised_lengths_input_within_two_tokens_output_exact(tmp_path, compare, b_rung, refused):
    a = write_run(tmp_path, "a", [ok(1, 100.0)])
    b = write_run(tmp_path, "b", [b_rung])
    code, _, err = compare(a, b)
    if refused is None:
        assert code == 0
    else:
        assert code == 2 and refused in err


def test_without_ignore_eos_the_engines_own_stops_are_shown_not_refused(tmp_path, compare):
    """Free to stop at EOS, two engines of different numerics stop at different tokens on the same greedy
    prompts (make demo's llama.cpp arm replied up to 255 tokens where refengine stopped at 224): the guard
    lists the lengths beside the tables instead of refusing the runs, and still refuses other differences."""
    free = {**WORKLOAD, "sampling": {**WORKLOAD["sampling"], "ignore_eos": False}}
    a = write_run(tmp_path, "a", [ok(1, 100.0, output_tokens=8, output_max=224)], workload=free)
    b = write_run(tmp_path, "b", [ok(1, 90.0, output_tokens=8, output_max=255)], workload=free)
    code, out, err = compare(a, b)
    assert code == 0, err
    assert "> **replies of different lengths:**" in out
    assert "> - output tokens at c=1: a = 8–224, b = 8–255 (each engine stopped at its own EOS)" in out
    c = write_run(tmp_path, "c", [ok(1, 90.0, input_tokens=140, output_tokens=8, output_max=255)], workload=free)
    code, _, err = compare(a, c)
    assert code == 2 and "input tokens at c=1: a = 128, c = 140 (must match within ±2)" in err
    same = write_run(tmp_path, "same", [ok(1, 90.0, output_tokens=8, output_max=224)], workload=free)
    code, out, _ = compare(a, same)
    assert code == 0 and "replies of different lengths" not in out


@pytest.mark.parametrize("b_span, refused", [
    ((57, 158), None),  # a dataset's prompts, one token shorter at both ends on another server: within ±2
    ((58, 162), "input tokens at c=1: a = 58–159, b = 58–162 (must match within ±2)"),
    ((55, 159), "input tokens at c=1: a = 58–159, b = 55–159 (must match within ±2)"),
])
def test_lengths_that_vary_within_a_run_are_compared_end_for_end(tmp_path, compare, b_span, refused):
    """Dataset prompts vary in length inside one run: the guard compares each end of the spans across
    runs, not the whole spread of lengths against the tolerance."""
    a = write_run(tmp_path, "a", [ok(1, 100.0, input_tokens=58, input_max=159)])
    b = write_run(tmp_path, "b", [ok(1, 90.0, input_tokens=b_span[0], input_max=b_span[1])])
    code, _, err = compare(a, b)
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and refused in err


def test_plots_are_written_and_linked(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0), ok(2, 150.0), ok(4, 200.0)])
    b = write_run(tmp_path, "b", [ok(1, 90.0), void(2), not_run(4)])
    report = tmp_path / "reports" / "cmp.md"
    code, out, _ = compare(a, b, "--out", report, "--plots", tmp_path / "reports" / "cmp")
    assert code == 0 and "wrote" in out and "3 plots" in out
    text = report.read_text()
    for name in ("throughput", "latency", "interactivity"):
        png = tmp_path / "reports" / "cmp" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"(cmp/{name}.png)" in text


def test_bad_input_is_one_line(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0)])
    code, _, err = compare(a, "--baseline", "zzz")
    assert code == 2 and "--baseline 'zzz' names no run" in err
    code, _, err = compare(tmp_path)
    assert code == 2 and "not a ladder result directory" in err


def test_runs_sharing_a_label_are_told_apart_by_directory(tmp_path, compare):
    a = write_run(tmp_path / "x", "run", [ok(1, 100.0)])
    b = write_run(tmp_path / "y", "run", [ok(1, 100.0)])
    (tmp_path / "x" / "run").rename(tmp_path / "x" / "first")
    (tmp_path / "y" / "run").rename(tmp_path / "y" / "second")
    code, out, _ = compare(a.parent / "first", b.parent / "second")
    assert code == 0 and "| metric | c | first | second |" in out


def test_plots_of_an_open_loop_run_skip_rate_inf_and_say_rate(tmp_path, compare):
    rate_workload = {**WORKLOAD, "load": {"request_rate": [1.0, 2.0, float("inf")]}}
    rungs = [ok(1, 100.0), ok(2, 150.0), ok(4, 160.0)]
    for rung, rate in zip(rungs, (1.0, 2.0, float("inf"))):
        object.__setattr__(rung, "request_rate", rate)
    a = write_run(tmp_path, "a", rungs, workload=rate_workload)
    code, out, _ = compare(a, "--out", tmp_path / "r.md", "--plots", tmp_path / "p")
    assert code == 0 and (tmp_path / "p" / "throughput.png").stat().st_size > 10_000
    assert "| output (tok/s)[^1] | inf | 160.0 |" in (tmp_path / "r.md").read_text()
