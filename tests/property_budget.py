"""Example budgets of the tests that search (issue 56): each property is two tests of one check.
`test_X` runs in `make test` under the "ci" profile: derandomized, a fixed number of examples, no
database, so CI sees the same examples every run. `test_X_slow`, marked slow, runs under `make test-slow`
with the "search" profile: random examples, shrunk on failure, and a larger budget. The marker is the switch
(`pytest -m slow` picks the search), never a process-global setting.

A check takes a Counter first: it counts the variants its examples ran (a preemption, a chunked step, a
draft), and the test fails when one named in `variants` never happened across the examples."""

import inspect
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, Phase, given, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# No shrinking in CI: a failure reports the example as drawn, at once (a mutant's run stays short).
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=_QUIET,
    phases=[Phase.explicit, Phase.generate],
)  # fmt: skip
settings.register_profile("search", derandomize=False, database=None, deadline=None, suppress_health_check=_QUIET)


def _test(check: Callable, profile: str, examples: int, variants: Sequence[str], pinned: Sequence[dict],
          strategies: dict) -> Callable:
    signature = inspect.signature(check)
    fixtures = [p for name, p in list(signature.parameters.items())[1:] if name not in strategies]

    def test(**kwargs) -> None:
        counts: Counter = Counter()
        for case in pinned:  # cases that every run holds, whatever the draws give
            check(counts, **kwargs, **case)
        def counted(*args, **drawn) -> None:
            check(counts, *args, **drawn)

        counted.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
        counted.__name__ = check.__name__
        searched = given(**strategies)(counted)
        settings(settings.get_profile(profile), max_examples=examples)(searched)(**kwargs)
        missing = [v for v in variants if not counts[v]]
        assert not missing, f"never happened across {examples} examples: {missing} (counts {dict(counts)})"

    test.__signature__ = signature.replace(parameters=fixtures)
    test.__doc__ = check.__doc__
    return test


def property_tests(
    check: Callable, ci: int, slow: int, variants: Sequence[str] = (), pinned: Sequence[dict] = (), **strategies
) -> tuple[Callable, Callable]:
    """`check(counts, *fixtures, **drawn)` as the CI test of `ci` examples and the slow test of `slow`; each
    runs the `pinned` cases (explicit values of the drawn arguments) first."""
    return (
        _test(check, "ci", ci, variants, pinned, strategies),
        pytest.mark.slow(_test(check, "search", slow, variants, pinned, strategies)),
    )
