"""reports/README.md, generated: one row per report with its question, target, provenance and freshness.

What each report answers, which make target writes it and which code it measures are declared in
benchmarks/reports_index.toml (reviewed by hand); the commit, date and device are read from the report's own
header. A report is STALE when a commit since its own touched the code it measures (`git rev-list --count`),
so a ladder change does not mark a GPU report stale. `make reports-index` rewrites the index;
tests/test_reports_index.py checks that the committed one equals a fresh generation (never that reports are
fresh: GPU figures need a GPU).
"""

import argparse
import importlib.util
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

DECLARATIONS = Path(__file__).with_name("reports_index.toml")
INDEX = Path("reports/README.md")
HEADER_LINES = 40  # a report's provenance sits in its first lines; quoted commits further down are not its own

# How the report generators name their commit, in order of preference (the first pattern that matches wins).
COMMIT_PATTERNS = [
    re.compile(r"specladder [^\n]*?\(([0-9a-f]{7,40})\)"),  # ladder.host.provenance and ladder compare
    re.compile(r"at commit\(s\) ([0-9a-f]{7,40}(?:, [0-9a-f]{7,40})*)"),  # refengine oracle --write-report
    re.compile(r"\b[Cc]ommit `?([0-9a-f]{7,40})\b"),  # mutations, acceptance, soak, cpu-bench, prefix-cache-h200
    re.compile(r'"commit": "([0-9a-f]{7,40})"'),  # benchmarks/gpu_bench.py's JSON
]
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
GPU = [re.compile(p) for p in (r'"device": "([^"]+)"', r"\b(NVIDIA [A-Z]\d+\w*)")]
# "{cpu_model()} x{cores}" (ladder.host): any model name, it varies by host ("AMD EPYC Processor x2", "AMD EPYC x2")
CPU_CORES = [re.compile(p) for p in (r"\S x(\d+)\b", r"\b(\d+) CPUs\b", r"\b(\d+) cores\b", r"\b(\d+) CPU cores\b")]
CPU_BUILD = re.compile(r"torch [\d.]+\+cpu\b")  # a CPU build of torch: the run was on the CPU


class ReportsIndexError(ValueError):
    """A declaration or a report the index cannot stand on: no target, no commit, an unknown commit."""


@dataclass(frozen=True)
class Declared:
    path: str
    question: str
    target: str
    measures: tuple[str, ...]
    attachments: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    declared: Declared
    commit: str
    date: str
    device: str
    commits_since: int


def load_declarations(path: Path = DECLARATIONS) -> list[Declared]:
    entries = tomllib.loads(path.read_text())["report"]
    out = []
    for e in entries:
        for key in ("path", "question", "target", "measures"):
            if not e.get(key):
                raise ReportsIndexError(f"{path.name}: the report {e.get('path', '?')} declares no {key}")
        out.append(Declared(e["path"], e["question"], e["target"], tuple(e["measures"]), tuple(e.get("attachments", ()))))
    return out


def make_targets(makefile: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9][\w.-]*) *:(?!=)", makefile, re.M)}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolves(repo: Path, commit: str) -> bool:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    return done.returncode == 0


def header_commits(head: str) -> list[str]:
    for pattern in COMMIT_PATTERNS:
        found = pattern.search(head)
        if found:
            return [c.strip() for c in found.group(1).split(",")]
    return []


def device_of(head: str) -> str:
    for pattern in GPU:
        gpu = pattern.search(head)
        if gpu:
            return gpu.group(1)
    for pattern in CPU_CORES:
        cores = pattern.search(head)
        if cores:
            return f"CPU, {cores.group(1)} cores"
    return "CPU" if CPU_BUILD.search(head) else "not stated"


def row(root: Path, repo: Path, declared: Declared) -> Row:
    report = root / declared.path
    if not report.is_file():
        raise ReportsIndexError(f"{declared.path}: declared in {DECLARATIONS.name} but not in the tree")
    head = "\n".join(report.read_text(encoding="utf-8").splitlines()[:HEADER_LINES])
    commits = header_commits(head)
    if not commits:
        raise ReportsIndexError(f"{declared.path}: its header names no commit (patterns in {Path(__file__).name})")
    for commit in commits:
        if not resolves(repo, commit):
            raise ReportsIndexError(f"{declared.path}: names commit {commit}, which this clone's history does not hold")
    # Several commits (slices merged from runs on different trees): the oldest one is the report's age.
    counts = {c: int(git(repo, "rev-list", "--count", f"{c}..HEAD", "--", *declared.measures)) for c in commits}
    commit = max(commits, key=lambda c: counts[c])
    date = DATE.search(head)
    # A header without a date: the date of the commit it names, which the run cannot precede.
    when = date.group(1) if date else f"{git(repo, 'show', '-s', '--format=%cs', commit)} (its commit's)"
    return Row(declared, commit[:7], when, device_of(head), counts[commit])


def check_coverage(root: Path, declared: list[Declared]) -> None:
    """Every file under reports/ belongs to a declared report, so that a new report cannot hide from the index."""
    owned = [d.path for d in declared] + [a for d in declared for a in d.attachments] + [str(INDEX)]
    for path in sorted((root / "reports").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not any(rel == o or rel.startswith(o.rstrip("/") + "/") for o in owned):
            raise ReportsIndexError(f"{rel}: no report in {DECLARATIONS.name} declares it (as its path or an attachment)")


def unwritten_targets(makefile: str, declared: list[Declared]) -> list[str]:
    """The report targets (`make help`'s two report groups) that no declared report names: never run, or run
    without its report being committed."""
    spec = importlib.util.spec_from_file_location("make_help", Path(__file__).parents[1] / "scripts/make_help.py")
    make_help = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_help)
    named = {d.target for d in declared} | {"reports-index"}
    return [e.target for e in make_help.parse(makefile) if e.group.endswith("-report") and e.target not in named]


def render(rows: list[Row], unwritten: list[str]) -> str:
    stale = sum(r.commits_since > 0 for r in rows)
    lines = [
        "# Reports",
        "",
        "Generated by `make reports-index` (`benchmarks/reports_index.py`, from the declarations in",
        "`benchmarks/reports_index.toml` and each report's own header); do not edit by hand. One row per report:",
        "the question it answers, the make target that writes it (`make help` lists them, with their durations),",
        "the commit, date and device its header names, and the commits since then to the code it measures (the",
        "paths in the last column). **STALE** means that code has changed since the report ran: rerun its target.",
        "",
        f"{len(rows)} reports, {stale} of them STALE.",
        "",
        "| report | question | target | commit | date | device | commits since | fresh? | code it measures |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r.declared
        name = d.path.removeprefix("reports/")
        fresh = "**STALE**" if r.commits_since else "current"
        measures = ", ".join(f"`{m}`" for m in d.measures)
        lines.append(f"| [{name}]({name}) | {d.question} | `make {d.target}` | `{r.commit}` | {r.date} | {r.device} "
                     f"| {r.commits_since} | {fresh} | {measures} |")
    if unwritten:
        lines += ["", "Report targets with no report here yet: " + ", ".join(f"`make {u}`" for u in unwritten) + "."]
    return "\n".join(lines) + "\n"


def generate(root: Path, repo: Path | None = None) -> str:
    """The index for the tree at root; repo is the git checkout whose history it reads (root by default)."""
    repo = repo or root
    declared = load_declarations()
    makefile = (root / "Makefile").read_text()
    targets = make_targets(makefile)
    for d in declared:
        if d.target not in targets:
            raise ReportsIndexError(f"{d.path}: its target `make {d.target}` is not a rule of the Makefile")
    check_coverage(root, declared)
    rows = [row(root, repo, d) for d in sorted(declared, key=lambda d: d.path)]
    return render(rows, unwritten_targets(makefile, declared))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, default=None, help="default: ROOT/reports/README.md")
    args = parser.parse_args(argv)
    try:
        text = generate(args.root)
    except (ReportsIndexError, subprocess.CalledProcessError) as err:
        print(f"reports-index: {err}", file=sys.stderr)
        return 2
    (args.out or args.root / INDEX).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
