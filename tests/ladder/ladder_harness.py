"""Helpers shared by the ladder tests."""

import json
import sys
from pathlib import Path

from ladder import rfc_json

FAKE = Path(__file__).with_name("fake_openai.py")


def fake_cmd(script: dict, port: str = "0") -> str:
    """The shell command that runs the fake server (for --serve-cmd)."""
    return f"{sys.executable} {FAKE} --port {port} --script '{json.dumps(script)}'"


def load_rungs(out: Path) -> list[dict]:
    return rfc_json.loads((out / "rungs.json").read_text())


def load_records(out: Path) -> list[dict]:
    return [rfc_json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
