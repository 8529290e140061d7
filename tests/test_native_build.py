"""The hot modules run compiled: setup.py builds each with mypyc, and CPython imports
the extension. SPENDBUS_PURE=1 builds none, and then each runs interpreted."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native_kit import ROOT, compiled_sources

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


def test_an_installed_spendbus_imports_them_compiled_from_anywhere(tmp_path: Path) -> None:
    """As the ``spendbus`` command does: another directory, the project root not on the
    path. Each extension and its group's shared library must be found where the package
    is installed (a library left at the project root was found by the tests only)."""
    names = [module_name(source) for source in SOURCES]
    code = f"import importlib; print('\\n'.join(importlib.import_module(n).__file__ for n in {names!r}))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr
    files = loaded.stdout.split()
    assert len(files) == len(names)
    if os.environ.get("SPENDBUS_PURE") != "1":
        assert all(f.endswith(".so") for f in files), files
