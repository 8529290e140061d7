"""aggregator/__init__: every public name resolves to what its module defines, lazily."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import aggregator

ROOT = Path(__file__).resolve().parents[2]


def test_all_lists_exactly_the_names_it_can_load() -> None:
    assert sorted(aggregator.__all__) == sorted(aggregator._HOMES)
    assert set(aggregator.__all__) <= set(dir(aggregator))


@pytest.mark.parametrize("name", aggregator.__all__)
def test_each_name_is_its_home_modules_object(name: str) -> None:
    value = getattr(aggregator, name)
    assert value is getattr(importlib.import_module(aggregator._HOMES[name]), name)
    # a submodule of the same name would shadow the name once it is imported
    assert not isinstance(value, types.ModuleType)


def test_no_public_name_is_also_a_submodule() -> None:
    submodules = {info.name for info in pkgutil.iter_modules(aggregator.__path__)}
    assert not submodules & set(aggregator.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        aggregator.no_such_name  # noqa: B018


def test_reading_a_setting_name_does_not_import_faust() -> None:
    code = (
        "import sys; from aggregator import AggregatorConfig, apply_schema; "
        "print('faust' in sys.modules, 'aggregator.app' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]
