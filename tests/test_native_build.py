"""The hot modules run compiled: setup.py builds each with mypyc, and CPython imports
the extension. SPENDBUS_PURE=1 builds none, and then each runs interpreted."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, compiled_sources

SOURCES = compiled_sources()


def module_name(source: Path) -> str:
    return ".".join(source.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("source", SOURCES, ids=module_name)
def test_each_listed_module_is_imported_compiled(source: Path) -> None:
    module = importlib.import_module(module_name(source))
    loaded = Path(module.__file__ or "")
    if os.environ.get("SPENDBUS_PURE") == "1":
        assert loaded == source
    else:
        assert loaded.parent == source.parent and loaded.suffix == ".so", (
            f"{module.__name__} runs interpreted from {loaded}: run `make native`"
        )
        assert loaded.stat().st_mtime >= source.stat().st_mtime


def test_the_list_names_existing_sources() -> None:
    assert SOURCES and all(s.suffix == ".py" and s.exists() for s in SOURCES)
