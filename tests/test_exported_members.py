"""Every face's ``__all__`` is what the face holds, computed (as httpx's own test does).

A face is a package ``__init__`` of the project; its public names are those that do not
start with ``_`` and are no submodule, less the plumbing a face imports to build itself
(``from __future__ import annotations``, ``TYPE_CHECKING``, ``runtime.faces`` outside
``runtime``). A lazy
face (PEP 562) lists its names through ``__dir__``, so they count before they load.
"""

from __future__ import annotations
import __future__

import importlib
import pkgutil
import types
import typing
from pathlib import Path

import pytest

from runtime.faces import lazy_names

ROOT = Path(__file__).resolve().parents[1]
ROOMS = (
    "schemas",
    "runtime",
    "aggregator",
    "enforcer",
    "ingest",
    "notify",
    "admin",
    "reconcile",
    "spendbus",
)
#: the faces a room must have, with ``__all__``: what code outside it imports
REQUIRED = (*ROOMS[:-1], "aggregator.counting", "aggregator.sink", "aggregator.replay")
PLUMBING: dict[str, object] = {
    "annotations": __future__.annotations,
    "TYPE_CHECKING": typing.TYPE_CHECKING,
    "lazy_names": lazy_names,
}


def packages() -> list[str]:
    found = []
    for room in ROOMS:
        found.append(room)
        path = [str(ROOT / room)]
        found += [m.name for m in pkgutil.walk_packages(path, f"{room}.") if m.ispkg]
    return sorted(found)


FACES = [name for name in packages() if hasattr(importlib.import_module(name), "__all__")]


def public_members(face: types.ModuleType) -> set[str]:
    members = set()
    for name in dir(face):
        if name.startswith("_"):
            continue
        value = getattr(face, name)
        if isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", "") or ""
        if name in PLUMBING and value is PLUMBING[name] and not home.startswith(face.__name__):
            continue  # imported to build the face, not defined below it
        members.add(name)
    return members


def test_every_room_has_a_face_with_all() -> None:
    assert set(REQUIRED) <= set(FACES)


@pytest.mark.parametrize("name", FACES)
def test_all_is_the_faces_public_members(name: str) -> None:
    face = importlib.import_module(name)
    exported = list(face.__all__)
    assert len(exported) == len(set(exported)), "a name listed twice"
    assert set(exported) == public_members(face)


def test_the_computation_sees_a_name_left_out() -> None:
    face = types.ModuleType("face")
    face.__dict__.update(annotations=__future__.annotations, Thing=object, sub=typing)
    face.__all__ = []  # type: ignore[attr-defined]  # a bare module has no __all__ declared
    assert public_members(face) == {"Thing"}
