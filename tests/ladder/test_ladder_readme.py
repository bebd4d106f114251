"""ladder/README.md documents every flag of every ladder command, each with an example."""

from pathlib import Path

import click
import pytest

from ladder.cli import cli

README = (Path(__file__).parents[2] / "ladder" / "README.md").read_text()


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_flag_is_in_the_readme_with_an_example(command):
    table_rows = [line for line in README.splitlines() if line.startswith("| `--")]
    for param in cli.commands[command].params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        for flag in param.opts + param.secondary_opts:
            rows = [row for row in table_rows if f"`{flag}" in row.split("|")[1] or f"/{flag}`" in row.split("|")[1]]
            assert rows, f"ladder {command} {flag} is not documented in ladder/README.md"
            assert any(flag.split("/")[0] in row.split("|")[2] or row.split("|")[2].strip().startswith("`--")
                       for row in rows), f"{flag}: no example"
