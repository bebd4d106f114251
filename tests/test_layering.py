"""The data flows one way: the engine and the server sit on top of the core, the runner, the model, the
sampler and the drafters, and nothing below reaches up. Below them the runner (worker/) sits on the
drafters, the sampler, the rank group (distributed/) and the model, the drafters, the sampler and the
tensor-parallel layers on the model, with no arrow back.
Checked on the source (every import statement, including those inside functions), so a lazy upward
import counts too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "refengine"
LOWER = ("core", "worker", "model", "sample", "spec_decode", "structured_output", "distributed")
UPPER = ("refengine.engine", "refengine.entrypoints")
# The packages each lower package may import (the modules at refengine's top, request, config and
# sampling_params, are shared data types that every layer may read).
MAY_IMPORT = {
    "worker": {"core", "model", "sample", "spec_decode", "distributed"},
    "distributed": {"model"},  # tensor-parallel layers and the rank group: the runner's, above the model
    "spec_decode": {"model", "heads"},
    "sample": {"model"},
    "model": {"tokenizer"},
    "core": {"structured_output"},
    "structured_output": {"core", "tokenizer"},
}


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


def imported_packages(path: Path) -> set[str]:
    """The refengine packages (not top-level modules) `path` imports."""
    packages = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "refengine" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
            packages.add(parts[1])
    return packages


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_lower_layers_import_only_the_layers_below_them(layer):
    arrows = [
        f"{path.relative_to(PACKAGE.parent)} imports refengine.{package}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for package in sorted(imported_packages(path) - MAY_IMPORT[layer] - {layer})
    ]
    assert not arrows, arrows


def test_the_layer_check_sees_a_drafter_importing_the_runner(tmp_path):
    """The drafters once built their attention metadata with the runner's builder: that arrow is found."""
    source = tmp_path / "m.py"
    source.write_text("from refengine.worker.input_batch import InputBatch\nimport refengine.request\n")
    assert imported_packages(source) - MAY_IMPORT["spec_decode"] == {"worker"}
