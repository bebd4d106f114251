"""No module docstring in refengine/ runs over 12 lines: a module says what it is and why, and links to its
design page in docs/design/, where the long explanations live."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 12


def docstring_lines(source: str) -> int:
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return 0 if doc is None else len(doc.splitlines())


def test_no_module_docstring_runs_over_12_lines():
    long = {
        path.relative_to(ROOT).as_posix(): n
        for path in sorted((ROOT / "refengine").rglob("*.py"))
        if (n := docstring_lines(path.read_text())) > MAX_LINES
    }
    assert not long, f"module docstrings over {MAX_LINES} lines (move the design into docs/design/): {long}"


def test_the_count_is_of_the_docstrings_lines():
    assert docstring_lines('"""One line."""\nx = 1\n') == 1
    assert docstring_lines('"""Title.\n\n' + "line\n" * 12 + '"""\n') == 14
    assert docstring_lines("x = 1\n") == 0
