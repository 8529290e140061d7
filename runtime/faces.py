"""A face that loads its public names on first use (PEP 562).

A face lists each name with the module that defines it; importing the
face imports none of them, so the CLI reads a setting without Faust, and modules that
import each other through a shelf's face never meet half-initialised.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_names(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names live in ``homes``."""
    namespace = sys.modules[package].__dict__

    def load(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return load, names
