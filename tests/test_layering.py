"""The data flows one way: the engine and the server sit on top of the core, the runner, the model, the
sampler and the drafters, and nothing below reaches up. Checked on the source (every import statement,
including those inside functions), so a lazy upward import counts too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "refengine"
LOWER = ("core", "worker", "model", "sample", "spec_decode", "structured_output", "distributed")
UPPER = ("refengine.engine", "refengine.entrypoints")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("layer", LOWER)
def test_lower_layers_do_not_import_the_engine_or_the_server(layer):
    leaks = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in sorted(imported_modules(path))
        if any(name == upper or name.startswith(upper + ".") for upper in UPPER)
    ]
    assert not leaks, leaks


def test_the_check_sees_an_upward_import(tmp_path):
    """The scan is not vacuous: a lazy import of the engine inside a function is found."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from refengine.engine.outputs import StepRecord\n")
    assert "refengine.engine.outputs" in imported_modules(source)
