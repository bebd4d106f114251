"""Configuration comes in through arguments. Only the command line reads the environment (click's
envvar), plus the one documented resolution of REFENGINE_ASYNC_SCHEDULING in spec_decode/config.py;
no module flips process-wide state from an environment variable."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "refengine"
# The documented exception: --async-scheduling, else REFENGINE_ASYNC_SCHEDULING, else automatic. And one
# write, never a read: tensor parallelism keeps NVLink multicast off for NCCL, which only reads its
# settings from the environment (docs/invariants.md, tensor parallelism).
ALLOWED = {"spec_decode/config.py", "distributed/parallel_state.py"}


def environment_reads(source: str) -> list[int]:
    """Lines that touch os.environ or call os.getenv / os.putenv."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv", "environb") for alias in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def test_only_the_documented_resolution_reads_the_environment():
    reads = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := environment_reads(path.read_text()))
    }
    assert set(reads) == ALLOWED, reads


def test_the_check_sees_every_spelling():
    source = "import os\nfrom os import environ\na = os.environ.get('X')\nb = os.getenv('Y')\n"
    assert environment_reads(source) == [2, 3, 4]
