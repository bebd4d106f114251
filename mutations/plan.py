"""The mutants mutmut 3.8 will make of a source file, listed before any run, by its own generator.

Each planned mutant carries a digest of its mutated function (its own name blanked out) and the lines the
mutation changed, so a recorded survivor names the exact mutation: mutmut numbers mutants within a
function, and an edit to the function renumbers them.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path

from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name


@dataclass(frozen=True, order=True)
class PlannedMutant:
    name: str  # mutmut's full mutant name
    path: str
    mangled: str  # the function: x_f or xǁClassǁm
    digest: str  # sha256 (12 hex) of the mutated function's text, its name blanked out
    change: str  # the mutated lines, for a reviewer: "remaining = placeholders - rejected -> remaining = None"


def plan_file(root: Path, path: str, functions: set[str] | None = None) -> list[PlannedMutant]:
    """The mutants of `path` (of `functions` only, when given), in mutmut's naming."""
    mutated = mutate_file_contents(path, (root / path).read_text(encoding="utf-8"))
    lines = mutated.code.splitlines()

    def body(function: str) -> list[str]:
        span = mutated.line_span_by_function_name[function]
        return [line.replace(function, "MUTANT") for line in lines[span.start - 1 : span.end]]

    planned = []
    for local in mutated.mutant_names:
        mangled = local.partition("__mutmut_")[0]
        if functions is not None and mangled not in functions:
            continue
        text = body(local)
        original = body(f"{mangled}__mutmut_orig")
        diff = [d for d in difflib.ndiff(original, text) if d[:1] in "-+"]
        change = " -> ".join(d[2:].strip() for d in diff)
        digest = hashlib.sha256("\n".join(text).encode()).hexdigest()[:12]
        planned.append(PlannedMutant(get_mutant_name(Path(path), local), path, mangled, digest, change))
    return planned
