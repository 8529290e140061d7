"""Builds the hot modules listed in pyproject.toml's [tool.spendbus] compiled with mypyc.

They stay plain, typed Python: mypyc (mypy's compiler, the one black and mypy ship
with) turns each into a C extension that CPython imports before the .py beside it.
Set SPENDBUS_PURE=1 to skip the build and run every module interpreted (slower,
same behaviour); the test suite runs either way.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return list(tomllib.load(handle)["tool"]["spendbus"]["compiled"])


def extensions() -> list:
    if os.environ.get("SPENDBUS_PURE") == "1":
        return []
    from mypyc.build import mypycify

    # One group, so calls between the compiled modules stay native C calls.
    return mypycify(compiled_modules(), opt_level="3", group_name="spendbus_native")


setup(ext_modules=extensions())
