"""`make help`: the Makefile's targets by group, each with what it does and how long it takes.

The Makefile's header documents the format: a `## GROUP | DESCRIPTION | DURATION` line directly above a
target's rule. Standard library only, so that a bare `make` prints this before `make install` has run.
"""

import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The groups in the order `make help` prints them; a help line naming another group is refused.
GROUPS = {
    "setup": "setup",
    "test": "test",
    "demo": "demo",
    "cpu-report": "reports on the CPU",
    "gpu-report": "reports on a GPU",
}
HELP_LINE = re.compile(r"^## *([\w-]+) *\| *(.+?) *\| *(.+?) *$")
RULE = re.compile(r"^([A-Za-z0-9][\w.-]*) *:(?!=)")


class HelpFormatError(ValueError):
    """A help line that names no group, or that no target's rule follows."""


@dataclass(frozen=True)
class TargetHelp:
    target: str
    group: str
    description: str
    duration: str


def parse(text: str) -> list[TargetHelp]:
    """Every `## GROUP | DESCRIPTION | DURATION` line and the target whose rule follows it directly."""
    lines = text.splitlines()
    found = []
    for n, line in enumerate(lines):
        help_line = HELP_LINE.match(line)
        if help_line is None:
            continue
        group, description, duration = help_line.groups()
        if group not in GROUPS:
            raise HelpFormatError(f"Makefile line {n + 1}: group {group!r} is not one of {', '.join(GROUPS)}")
        rule = RULE.match(lines[n + 1]) if n + 1 < len(lines) else None
        if rule is None:
            raise HelpFormatError(f"Makefile line {n + 1}: the help line must sit directly above a target's rule")
        found.append(TargetHelp(rule.group(1), group, description, duration))
    return found


def phony_targets(text: str) -> set[str]:
    """The targets named by `.PHONY:` lines (every command-style target the Makefile offers)."""
    names = set()
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith(".PHONY:"):
            names.update(line.split(":", 1)[1].split())
    return names


def render(entries: list[TargetHelp]) -> str:
    width = max(len(e.target) for e in entries)
    out = ["Usage: make TARGET [VAR=value ...]   (the Makefile's comments above each rule say more)"]
    for group, title in GROUPS.items():
        members = [e for e in entries if e.group == group]
        if not members:
            continue
        out.append(f"\n{title}:")
        out.extend(f"  {e.target:<{width}}  {e.description} ({e.duration})" for e in members)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "Makefile")
    try:
        print(render(parse(path.read_text())))
    except HelpFormatError as err:
        print(f"make help: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `make | head`: the reader has what it wanted
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
