"""benchmarks/gpu_bench.py --dry-run: the GPU benchmark's code on the CPU at tiny shapes, so that a mistake
in a section shows before a GPU run. Here the spec_profile section, which wraps the engine's methods from
the outside (if the engine stopped calling one of them, its figures would silently read 0 ms), and the
heads_profile section."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WAITS = {"wait: frames landing (ids, counts, drafts)"}


def dry_run_rows(tmp_path: Path, section: str) -> list[dict]:
    """Run one section of gpu_bench.py --dry-run; its rows, once the section reported ok."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--dry-run", "--out", str(tmp_path),
         "--only", section],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert results["sections"][section]["status"] == "ok", done.stdout[-3000:]
    return [r for r in results["rows"] if r["section"] == section]


def test_spec_profile_dry_run_times_every_phase(tmp_path: Path) -> None:
    rows = dry_run_rows(tmp_path, "spec_profile")
    assert [r["c"] for r in rows] == [1, 8]
    for row in rows:
        calls = row["calls"]
        # The drafter proposed after every verification; frames land (one step late) at each launch.
        assert calls["drafter.propose (all)"] == calls["verify_rows (sampler + rejection)"] > 0
        assert all(calls[w] >= calls["drafter.propose (all)"] for w in WAITS)
        assert set(row["waits_ms_per_step"]) == WAITS
        assert {"runner.execute_model", "runner.sample_tokens", "scheduler.schedule",
                "scheduler.update_from_output"} <= set(row["host_ms_per_step"])
        assert {"verify_rows (sampler + rejection)", "drafter.propose (all)"} <= set(row["stream_ms_per_step"])
        # SYNTHETIC acceptance 0.7 ran: drafts were accepted.
        assert row["accepted_tokens_per_step"] > 0
        assert row["runner_steps"] > 0 and row["async_scheduling"] and row["batch_queue"]
        summary = (tmp_path / f"trace_summary_spec_c{row['c']}.txt").read_text()
        assert json.loads(summary.split("\n\n", 1)[0])["c"] == row["c"]


def test_heads_profile_dry_run_counts_the_device_work_of_each_arm(tmp_path: Path) -> None:
    """On the CPU: tiny-llama, spec off and a random eagle head; the trace sees the CPU's ops instead."""
    rows = dry_run_rows(tmp_path, "heads_profile")
    assert [(r["method"], r["c"]) for r in rows] == [("off", 1), ("off", 8), ("eagle", 1), ("eagle", 8)]
    for row in rows:
        assert row["runner_steps"] > 0 and row["requests"] == 2 * row["c"]
        # spec off has no acceptance; the head drafted and was verified (a random head accepts little)
        assert (row["acceptance_length"] is None) == (row["method"] == "off")
        assert (tmp_path / f"trace_summary_heads_{row['method']}_c{row['c']}.txt").exists()
        # The instrumented run split the step's host time by phase; only a head's step has a drafter's.
        host = row["host_ms_per_step"]
        assert {"runner.execute_model", "runner.sample_tokens", "engine step calls (engine thread)"} <= set(host)
        assert ("drafter.propose (all)" in host) == (row["method"] != "off")
        assert host["runner.execute_model"] > 0 and row["wall_ms_per_step_instrumented"] > 0
