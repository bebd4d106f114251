"""Build a mutant's bytes from the target's bytes: exact-once text edits, then a compile check."""

from __future__ import annotations

from mutations.model import Mutant, Status


class MutantRejected(Exception):
    """The mutant cannot be run: it does not apply (DOES_NOT_APPLY) or is not valid Python (INVALID_MUTANT)."""

    def __init__(self, status: Status, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def mutate_source(mutant: Mutant, source: bytes) -> bytes:
    """Return the mutated bytes, or raise MutantRejected.

    Every edit's `old` text must occur exactly once at the moment it is applied: zero means the target
    drifted, two or more means the text does not pin down one place. Either way a human re-authors the
    mutant; guessing would silently test a different bug.
    """
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MutantRejected(Status.DOES_NOT_APPLY, f"{mutant.file} is not UTF-8: {exc}") from exc
    for number, edit in enumerate(mutant.edits, start=1):
        count = text.count(edit.old)
        if count != 1:
            where = f" (edit {number} of {len(mutant.edits)})" if len(mutant.edits) > 1 else ""
            raise MutantRejected(
                Status.DOES_NOT_APPLY, f"search text occurs {count} times in {mutant.file}, expected 1{where}"
            )
        text = text.replace(edit.old, edit.new, 1)
    mutated = text.encode("utf-8")
    if mutated == source:
        # A no-op mutant would "survive" and blame the tests for a mutation that never happened.
        raise MutantRejected(Status.INVALID_MUTANT, "the mutation leaves the file unchanged")
    if not mutant.file.endswith(".py"):
        return mutated  # a document: nothing to compile
    try:
        compile(mutated, mutant.file, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise MutantRejected(Status.INVALID_MUTANT, f"mutated {mutant.file} does not compile: {exc}") from exc
    return mutated
