"""The data flows one way: refengine's units (its packages and its top-level modules) stand in TIERS, and
a unit imports only units of lower tiers, so no arrow points up and no two units import each other. The
lower packages are held to a narrower list still (MAY_IMPORT). Inside, refengine's files form no import
circle but the named exceptions. refengine never imports ladder; ladder reads only refengine's
stdlib-only bottom. Checked on the source (every import statement, including those inside functions and
under TYPE_CHECKING), so a lazy import counts too."""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "refengine"
# Top to bottom.
TIERS = (
    ("cli", "entrypoints", "oracle", "train"),  # the commands and the server
    ("engine",),
    ("worker",),  # the runner
    ("core",),  # the scheduler, torch-free
    ("request",),  # reads spec_decode.metrics, sample.splitmix and structured_output.request, all torch-free
    ("spec_decode", "distributed"),
    ("sample", "heads"),
    ("model", "structured_output"),
    ("tokenizer",),
    ("config", "sampling_params", "version", "sharegpt_file", "lazy_exports"),  # stdlib-only data types and readers
)
TIER = {unit: depth for depth, units in enumerate(TIERS) for unit in units}
# The units each lower package may import, narrower than the tiers allow.
MAY_IMPORT = {
    "worker": {"core", "model", "sample", "spec_decode", "distributed", "config", "sampling_params"},
    "core": {"request", "structured_output", "spec_decode", "sample", "config", "sampling_params"},
    "request": {"spec_decode", "sample", "structured_output", "sampling_params"},
    "distributed": {"model"},  # tensor-parallel layers and the rank group: the runner's, above the model
    "spec_decode": {"model", "heads", "config", "sampling_params"},
    "sample": {"model", "sampling_params"},
    "heads": {"model"},
    "model": {"tokenizer", "lazy_exports"},
    "structured_output": {"tokenizer", "sampling_params"},
    "tokenizer": set(),
}
# What ladder, a client of any OpenAI endpoint, may read of refengine: the stdlib-only bottom it shares.
LADDER_MAY_IMPORT = {"version", "sharegpt_file"}
# File circles allowed for now, each a set of module names.
CIRCLE_EXCEPTIONS: tuple[set[str], ...] = ()


def imported_modules(path: Path) -> set[str]:
    return names_imported(path.read_text())


@functools.cache
def names_imported(source: str) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return frozenset(names)


@functools.cache
def units() -> frozenset[str]:
    return frozenset({p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}) | {
        p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))
    }


def unit_files(unit: str) -> list[Path]:
    return [PACKAGE / f"{unit}.py"] if (PACKAGE / f"{unit}.py").is_file() else sorted((PACKAGE / unit).rglob("*.py"))


def imported_units(path: Path) -> set[str]:
    """The refengine units `path` imports; a name of refengine's root (`from refengine import LLM`) is
    "refengine", the root's lazy re-exports."""
    found = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "refengine" and len(parts) > 1:
            found.add(parts[1] if parts[1] in units() else "refengine")
    return found


def unit_arrows(unit: str) -> set[str]:
    return set().union(*(imported_units(path) for path in unit_files(unit))) - {unit}


def test_every_unit_stands_in_a_tier():
    assert units() == set(TIER), "place each new package or top-level module in TIERS"


@pytest.mark.parametrize("unit", sorted(TIER))
def test_units_import_only_lower_tiers(unit):
    upward = [
        f"{path.relative_to(ROOT)} imports refengine.{other}"
        for path in unit_files(unit)
        for other in sorted(imported_units(path) - {unit})
        if TIER.get(other, -1) <= TIER[unit]
    ]
    assert not upward, upward


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT))
def test_lower_layers_import_only_the_layers_below_them(unit):
    arrows = [
        f"{path.relative_to(ROOT)} imports refengine.{other}"
        for path in unit_files(unit)
        for other in sorted(imported_units(path) - MAY_IMPORT[unit] - {unit})
    ]
    assert not arrows, arrows


def test_no_two_units_import_each_other():
    arrows = {unit: unit_arrows(unit) for unit in units()}
    mutual = sorted((a, b) for a in arrows for b in arrows[a] if a < b and a in arrows.get(b, ()))
    assert not mutual, mutual


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def file_graph() -> dict[str, set[str]]:
    """refengine's modules -> the refengine modules each imports (a `from package import module` goes to
    the module, a `from module import name` to the module)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_modules(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts:
                targets.add(".".join(parts))
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_refengine_files_form_no_import_circle_but_the_named_exceptions():
    found = circles(file_graph())
    assert [sorted(c) for c in found if c not in CIRCLE_EXCEPTIONS] == []
    stale = [sorted(c) for c in CIRCLE_EXCEPTIONS if c not in found]
    assert not stale, f"no longer circles: delete them from CIRCLE_EXCEPTIONS: {stale}"


def test_refengine_never_imports_ladder():
    leaks = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name == "ladder" or name.startswith("ladder.")
    ]
    assert not leaks, leaks


def test_ladder_reads_only_refengines_stdlib_bottom():
    arrows = [
        f"{path.relative_to(ROOT)} imports refengine.{unit}"
        for path in sorted((ROOT / "ladder").rglob("*.py"))
        for unit in sorted(imported_units(path) - LADDER_MAY_IMPORT)
    ]
    assert not arrows, arrows
    bottom = {unit for unit in LADDER_MAY_IMPORT if TIER[unit] == len(TIERS) - 1 and not unit_arrows(unit)}
    assert bottom == LADDER_MAY_IMPORT, "what ladder reads must import nothing of refengine"


def test_the_checks_see_lazy_imports_circles_and_the_root(tmp_path):
    """The scans are not vacuous: a lazy import inside a function is found, a drafter importing the
    runner is an arrow, a two-module circle is found, and a name from refengine's root is its own unit."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from refengine.engine.outputs import StepRecord\n")
    assert "refengine.engine.outputs" in imported_modules(source)
    source.write_text("from refengine.worker.input_batch import InputBatch\nimport refengine.request\n")
    assert imported_units(source) - MAY_IMPORT["spec_decode"] == {"worker", "request"}
    source.write_text("from refengine import LLM\n")
    assert imported_units(source) == {"refengine"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
