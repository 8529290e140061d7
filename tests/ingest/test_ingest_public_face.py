"""ingest's public face: every name its package ``__init__``s export exists (that the CLI
imports the room only through them, and that the room has no import cycle, is
tests/test_room_imports.py)."""

from __future__ import annotations

import importlib

import pytest

from tests.test_room_imports import PUBLIC_FACES


@pytest.mark.parametrize("package", sorted(PUBLIC_FACES["ingest"]))
def test_every_exported_name_exists(package: str) -> None:
    loaded = importlib.import_module(package)
    names = loaded.__all__
    assert names and len(set(names)) == len(names)
    assert [name for name in names if not hasattr(loaded, name)] == []
