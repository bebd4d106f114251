"""The commands the README and docs/ show exist: every `make X` names a Makefile target, and every
`refengine ...`, `ladder ...` and `mutations ...` names a subcommand that exists, with options it takes.

Only code is read (fenced blocks and inline code spans), so prose may say "make" freely."""

import re
import shlex
from pathlib import Path

import click
import pytest

from benchmarks.reports_index import make_targets
from ladder.cli import cli as ladder_cli
from mutations.cli import main as mutations_cli
from refengine.cli import main as refengine_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "ladder/README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROGRAMS = {"refengine": refengine_cli, "ladder": ladder_cli, "mutations": mutations_cli}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")


def code_lines(text: str) -> list[str]:
    """Each line of each fenced block (continuations joined) and each inline code span."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += INLINE.findall(FENCE.sub("", text))
    return lines


def commands(line: str) -> list[list[str]]:
    """The make / refengine / ladder / mutations invocations on one line, each as its tokens from the program on."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # a half-quoted fragment in prose: not a command
        return []
    found = []
    for i, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1] if token.startswith((".venv/bin/", "/")) else token
        if name in (*PROGRAMS, "make") and (i == 0 or tokens[i - 1] in ("&&", ";", "|", "$", "time")):
            rest = []
            for t in tokens[i + 1:]:
                if t in ("&&", ";", "|", "&"):
                    break
                rest.append(t.strip("[]"))
            found.append([name, *rest])
    return found


def check(invocation: list[str], targets: set[str]) -> str | None:
    """What is wrong with one invocation, or None."""
    program, args = invocation[0], invocation[1:]
    if program == "make":
        named = [a for a in args if not a.startswith("-") and "=" not in a]
        return next((f"make {a}: no such target" for a in named if a not in targets), None)
    command: click.Command = PROGRAMS[program]
    ctx = click.Context(command)
    path = [program]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(ctx, args[0])
        if sub is None:
            return f"{' '.join(path)} {args[0]}: no such subcommand"
        path.append(args[0])
        command, args = sub, args[1:]
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            return f"{' '.join(path)}: no option {flag}"
    return None


def problems(text: str, targets: set[str]) -> list[str]:
    return [p for line in code_lines(text) for inv in commands(line) if (p := check(inv, targets))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_doc_shows_exists(doc):
    targets = make_targets((ROOT / "Makefile").read_text())
    assert problems(doc.read_text(), targets) == [], f"{doc.name} shows commands that do not exist"


def test_the_readme_shows_the_commands_a_new_user_needs():
    invocations = [inv for line in code_lines((ROOT / "README.md").read_text()) for inv in commands(line)]
    shown = {" ".join(inv[:2]) for inv in invocations}
    assert {"make demo", "make test", "refengine serve", "ladder run", "refengine oracle", "make mutations"} <= shown
    assert any(inv[:2] == ["ladder", "run"] and "--c" in inv and "--base-url" in inv for inv in invocations)


def test_the_check_bites():
    targets = {"test", "demo"}
    text = "```bash\nmake tset\n.venv/bin/ladder runn --c 1\nrefengine serve --no-such-flag\n```\nthen `mutations list`\n"
    assert problems(text, targets) == ["make tset: no such target", "ladder runn: no such subcommand",
                                       "refengine serve: no option --no-such-flag"]
