"""`mutations list` piped (`| grep`, `| less`): every mutant whole on one line, never wrapped or cut."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_piped_list_has_one_whole_line_per_mutant():
    listed = subprocess.run([str(Path(sys.executable).parent / "mutations"), "list"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    data = tomllib.loads((ROOT / "mutations" / "catalogue.toml").read_text())
    mutants, default_timeout = data["mutant"], data["defaults"]["timeout_s"]
    assert len(listed) == 1 + len(mutants)
    for line, m in zip(listed[1:], mutants):
        assert line.split("\t") == [m["id"], m["file"], str(len(m["tests"])), str(len(m["must_fail"])),
                                    f"{m.get('timeout_s', default_timeout):g}", m["title"]]
