"""A package's names, loaded on first use (PEP 562): importing the package imports none of its modules,
so `refengine` and `refengine.model` import without torch. Stdlib only."""

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """The package's module `__getattr__` (each exported name from the module `exports` maps it to) and
    its `__all__`."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__, sorted(exports)
