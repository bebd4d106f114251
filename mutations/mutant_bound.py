"""A pytest plugin for mutmut's mutant runs (`-p mutations.mutant_bound` in [tool.mutmut] pytest_add_cli_args):
each test's pytest-timeout bound scales with that test's own time in mutmut's stats run, so that a mutant
which hangs the engine is killed in tens of seconds rather than at the one bound every test shares.

A bound is max(floor, factor x the test's stats time), the ini options `mutant_bound_floor_s` and
`mutant_bound_factor`. The stats time counts the test's call only, and a hang inside a module fixture is
charged to the first test that uses it, so the floor covers the slowest fixture setup. Outside a mutant's run
(the stats run, the clean run, any ordinary pytest) nothing changes, and a test that names its own timeout
keeps it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# mutmut writes its stats run's per-test call times here, relative to the folder it runs the tests in.
STATS_FILE = "mutmut-stats.json"
# mutmut names every mutant after its function, with this infix; the stats, listing and forced-fail runs
# carry other names.
MUTANT_INFIX = "__mutmut_"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("mutant_bound_floor_s", "Under a mutant: the least per-test bound, in seconds.", default="20")
    parser.addini("mutant_bound_factor", "Under a mutant: the bound as a multiple of the test's stats time.", default="10")


def bounds(durations: dict[str, float], floor_s: float, factor: float) -> dict[str, float]:
    """Each measured test's bound in seconds."""
    return {nodeid: max(floor_s, factor * seconds) for nodeid, seconds in durations.items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MUTANT_INFIX not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return
    stats = Path(config.rootpath) / STATS_FILE
    if not stats.is_file():
        return
    by_test = bounds(json.loads(stats.read_text())["duration_by_test"], float(config.getini("mutant_bound_floor_s")),
                     float(config.getini("mutant_bound_factor")))
    for item in items:
        if item.nodeid in by_test and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(by_test[item.nodeid]))
