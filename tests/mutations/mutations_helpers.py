"""Helpers for the runner's self-tests.

The fixture project (fixture_pkg/) is only ever run from a temporary copy: the tests mutate files, and
files in the repository must never be mutated by a test.
"""

import json
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from mutations.cli import main

FIXTURE = Path(__file__).parent / "fixture_pkg"
# The CLI as its own process, for the tests that kill it: same interpreter, so the same install.
CLI = [sys.executable, "-c", "from mutations.cli import main; main()"]


def copy_fixture(destination: Path) -> Path:
    shutil.copytree(FIXTURE, destination, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def invoke(root: Path, *args: str, catalogue: Path | None = None) -> Result:
    """Run the CLI in-process against `root`, with the fixture catalogue unless told otherwise."""
    catalogue = catalogue or root / "catalogue.toml"
    return CliRunner().invoke(main, ["--root", str(root), "--catalogue", str(catalogue), *args])


def statuses(report: Path) -> dict[str, str]:
    return {m["id"]: m["status"] for m in json.loads(report.read_text())["mutants"]}
