"""README.md stays a user's page: at most 150 lines, no commit hashes, and one headline table whose every
figure links to the report it comes from (the reports carry the commits and the prose)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
FIGURE_CELL = re.compile(r"^\[[^\]]+\]\((reports/[^)]+)\)$")


def test_the_readme_is_short_and_names_no_commit():
    assert len(README.splitlines()) <= 150
    assert HASH.findall(README) == [], "commit hashes belong in the reports, not in README.md"


def test_every_figure_of_the_headline_table_links_to_a_report():
    section = README.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith(("| what", "|---"))]
    assert 6 <= len(rows) <= 12
    for row in rows:
        _, what, figure, device, _ = (cell.strip() for cell in row.split("|"))
        link = FIGURE_CELL.match(figure)
        assert link and (ROOT / link.group(1)).is_file() and device, row
