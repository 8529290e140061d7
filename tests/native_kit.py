"""Where the tests find the repository and the modules mypyc compiles.

Test modules import these from here, never from ``conftest``: pytest loads every
conftest.py under the one module name ``conftest``, so which file that name holds
depends on collection order.
"""

from __future__ import annotations

import importlib.machinery
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compiled_sources() -> list[Path]:
    """The hot modules setup.py compiles with mypyc (pyproject.toml [tool.spendbus.compiled])."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        groups = tomllib.load(handle)["tool"]["spendbus"]["compiled"]
    return [ROOT / path for paths in groups.values() for path in paths]


def stale_extensions() -> list[str]:
    """Extensions older than the source they were built from: CPython imports the
    extension first, so the tests would run the old code."""
    stale = []
    for source in compiled_sources():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            built = source.with_suffix(suffix)
            if built.exists() and built.stat().st_mtime < source.stat().st_mtime:
                stale.append(str(built.relative_to(ROOT)))
    return stale
