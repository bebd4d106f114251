"""The relative links in README.md, ladder/README.md, docs/ and the reports index resolve, checked offline by
pytest-check-links (the dev extra) in its own pytest run; web links are not fetched. Mutant M331 (a README
link to a file that does not exist) shows the check red."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["README.md", "ladder/README.md", "docs", "reports/README.md"]
# Design pages written on another branch of the same wave: linked already, checked once they exist.


def broken_links(root: Path, paths: list[str]) -> subprocess.CompletedProcess:
    ignore = ["https?://.*"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), "--check-links",
           *(arg for pattern in ignore for arg in ("--check-links-ignore", pattern)), *paths]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)


def test_every_relative_link_in_the_docs_resolves():
    done = broken_links(ROOT, CHECKED)
    assert done.returncode == 0, "broken links:\n" + "\n".join(line for line in done.stdout.splitlines() if "FAILED" in line)

