"""The repository's own catalogue: every entry still applies exactly once, compiles, and names test files
that exist. This is `mutations check-apply` as part of the test suite, so engine edits that move a
mutant's target text fail fast here instead of at the next full mutation run."""

from pathlib import Path

from mutations.catalogue import load_catalogue
from mutations.runner import check_apply

REPO = Path(__file__).parents[2]


def test_repository_catalogue_applies():
    catalogue = load_catalogue(REPO / "mutations" / "catalogue.toml")
    failures = [f"{c.id}: {c.status} {c.detail}" for c in check_apply(catalogue.mutants, REPO) if c.status]
    assert not failures, "\n".join(failures)
