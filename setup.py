"""Builds the hot modules listed in pyproject.toml's [tool.spendbus.compiled] with mypyc.

They stay plain, typed Python: mypyc (mypy's compiler, the one black and mypy ship
with) turns each into a C extension that CPython imports before the .py beside it.
One group per room, so a room's modules call each other as C functions.
SPENDBUS_PURE=1 skips the build: every module then runs interpreted (slower, same
behaviour); so does a machine without a C compiler, with a warning (as msgpack and
aiokafka install). SPENDBUS_NATIVE_GROUPS=enforcer,taps builds only those groups.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def compiled_groups() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return dict(tomllib.load(handle)["tool"]["spendbus"]["compiled"])


def extensions() -> list[Any]:
    if os.environ.get("SPENDBUS_PURE") == "1":
        return []
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(
            f"spendbus: no C compiler ({compiler}): the hot modules run interpreted (slower)",
            file=sys.stderr,
        )
        return []
    from mypyc.build import mypycify

    groups = compiled_groups()
    if only := os.environ.get("SPENDBUS_NATIVE_GROUPS"):
        groups = {name: groups[name] for name in only.split(",")}
    # The types are checked by `make check` (strict, every library installed). The
    # compile reads no config: an isolated wheel build has only this file's build
    # requirements, so the strict config's plugin and typed libraries are absent there;
    # a missing library's values are Any (object) to mypyc, as they were before.
    options = ["--config-file=", "--python-version=3.11", "--ignore-missing-imports"]
    built: list[Any] = []
    for name, paths in groups.items():
        # the group's shared library is a top-level module (mypyc derives each module's
        # __file__ from its place); an editable install maps it when it built it
        built += mypycify([*options, *paths], opt_level="3", group_name=f"spendbus_{name}_native")
    return built


setup(ext_modules=extensions())
