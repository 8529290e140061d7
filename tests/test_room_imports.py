"""The rooms' import rules, read from the source with ast (function-level imports too).

Stages (ingest/, aggregator/, enforcer/, notify/, admin/, reconcile/) import no other part of the project
but schemas/ (the contract) and runtime/ (the I/O kit they share); runtime/ imports only
schemas/; schemas/ imports nothing else of the project. The CLI (spendbus/) reaches
aggregator/, ingest/, enforcer/, notify/ and reconcile/ only through their public ``__init__``
(ingest's subpackages that export names with ``__all__`` are public too). Inside the
aggregator, each shelf imports only the shelves below it. Inside each room the modules
import each other without a cycle, counting the imports written inside functions and
under ``if TYPE_CHECKING:`` (both only hide one).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("ingest", "aggregator", "enforcer", "notify", "admin", "reconcile")
SHARED = ("schemas", "runtime")
ROOMS = (*SHARED, *STAGES, "spendbus")


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is written."""

    importer: str  # the dotted module that imports
    path: Path
    line: int
    target: str  # the dotted module imported


def module_files(room: str) -> dict[str, Path]:
    """Every module of a room by its dotted name (a package by its ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in sorted((ROOT / room).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


ALL_MODULES: dict[str, Path] = {
    name: path for room in ROOMS for name, path in module_files(room).items()
}


def imports_in(
    source: str, module: str, is_package: bool, known: Collection[str] = ALL_MODULES.keys()
) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import, nested ones included.

    A relative import is resolved against the module's package; ``from pkg import name``
    imports ``pkg.name`` when that is one of the ``known`` modules, else ``pkg``.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for imported in dict.fromkeys(
                f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target
                for alias in node.names
            ):
                yield node.lineno, imported


def room_imports(room: str) -> list[Import]:
    found: list[Import] = []
    for module, path in module_files(room).items():
        source = path.read_text()
        for line, target in imports_in(source, module, path.name == "__init__.py"):
            found.append(Import(module, path, line, target))
    return found


#: the packages whose ``__init__`` the CLI imports a room through (their ``__all__``)
PUBLIC_FACES = {
    "aggregator": {"aggregator"},
    "ingest": {"ingest", "ingest.gateway", "ingest.publisher", "ingest.taps"},
    "enforcer": {"enforcer"},
    "notify": {"notify"},
    "admin": {"admin"},
    "reconcile": {"reconcile"},
}


def broken_rule(room: str, target: str) -> str | None:
    """Which rule importing ``target`` from ``room`` breaks, if any."""
    top = target.split(".")[0]
    if top not in ROOMS or top == room:
        return None
    if room in STAGES and top not in SHARED:
        return "a stage imports only schemas/ and runtime/ of the project"
    if room == "runtime" and top != "schemas":
        return "runtime/ imports only schemas/ of the project"
    if room == "schemas":
        return "schemas/ imports nothing else of the project"
    if room == "spendbus" and top in PUBLIC_FACES and target not in PUBLIC_FACES[top]:
        return f"spendbus/ imports {top}/ only through {sorted(PUBLIC_FACES[top])}"
    return None


@pytest.mark.parametrize("room", ROOMS)
def test_the_room_keeps_its_import_rules(room: str) -> None:
    imports = room_imports(room)
    assert imports, f"no imports read in {room}/"
    broken = [
        f"{found.path.relative_to(ROOT)}:{found.line} imports {found.target}: {rule}"
        for found in imports
        if (rule := broken_rule(room, found.target)) is not None
    ]
    assert not broken, "\n".join(broken)


def import_cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Each set of modules that import each other in a ring, as one ring through them.

    Tarjan's strongly connected components; a component of two or more modules, or one
    that imports itself, holds a cycle, shown as the path that closes it.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, ()):
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [ring_through(graph, component) for component in components]


def ring_through(graph: Mapping[str, Collection[str]], component: list[str]) -> list[str]:
    """A path from the component's first module back to it, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for module in frontier:
            for imported in sorted(graph.get(module, ())):
                if imported == start:
                    return [*paths[module], start]
                if imported in members and imported not in paths:
                    paths[imported] = [*paths[module], imported]
                    following.append(imported)
        frontier = following
    raise AssertionError(f"no ring through {component}")


def room_graph(room: str) -> dict[str, set[str]]:
    """Which of the room's modules each of its modules imports."""
    modules = module_files(room)
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for found in room_imports(room):
        if found.target in modules:
            graph[found.importer].add(found.target)
    return graph


@pytest.mark.parametrize("room", ROOMS)
def test_the_room_has_no_import_cycle(room: str) -> None:
    cycles = import_cycles(room_graph(room))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


SAMPLE = """
import enforcer.check
from aggregator import counting, Worker
from . import sibling
from ..config import GatewayConfig
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spendbus.cli import main

def later() -> None:
    from notify.service import Notifier
"""


def test_every_kind_of_import_is_read() -> None:
    """Nested, relative, submodule-by-name and TYPE_CHECKING imports are all seen."""
    known = {"aggregator.counting", "ingest.gateway.sibling"}
    found = [t for _, t in imports_in(SAMPLE, "ingest.gateway.proxy", False, known)]
    assert sorted(found) == [
        "aggregator",
        "aggregator.counting",
        "enforcer.check",
        "ingest.config",
        "ingest.gateway.sibling",
        "notify.service",
        "spendbus.cli",
        "typing",
    ]
    assert [t for _, t in imports_in("from . import x", "ingest.gateway", True, known)] == [
        "ingest.gateway"
    ]


def test_the_rules_and_the_cycle_finder_can_fail() -> None:
    assert broken_rule("ingest", "enforcer.check") is not None
    assert broken_rule("notify", "aggregator") is not None
    assert broken_rule("ingest", "schemas.codec") is None
    assert broken_rule("ingest", "runtime.kafka") is None
    assert broken_rule("runtime", "aggregator") is not None
    assert broken_rule("schemas", "runtime.kafka") is not None
    assert broken_rule("spendbus", "notify.service") is not None
    assert broken_rule("schemas", "spendbus.cli") is not None
    assert broken_rule("spendbus", "aggregator") is None
    assert broken_rule("spendbus", "aggregator.counting") is not None
    assert broken_rule("spendbus", "ingest.gateway") is None
    assert broken_rule("spendbus", "ingest.gateway.proxy") is not None
    assert broken_rule("spendbus", "schemas.codec") is None
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


#: the aggregator's shelves, each with the shelves it may import (the root's config,
#: metrics, rebalance, errors and faces are below every shelf; app and agents above)
SHELVES: dict[str, set[str]] = {
    "counting": set(),
    "sink": set(),
    "replay": {"counting", "sink"},
    "alerts": {"counting", "replay"},
}
ROOT_ABOVE_SHELVES = {"aggregator", "aggregator.app", "aggregator.agents"}


def shelf_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "aggregator" and parts[1] in SHELVES else None


def test_each_shelf_imports_only_the_shelves_below_it() -> None:
    broken = []
    for found in room_imports("aggregator"):
        shelf = shelf_of(found.importer)
        if shelf is None or not found.target.startswith("aggregator"):
            continue
        target_shelf = shelf_of(found.target)
        if found.target in ROOT_ABOVE_SHELVES or (
            target_shelf not in (None, shelf) and target_shelf not in SHELVES[shelf]
        ):
            broken.append(f"{found.path.relative_to(ROOT)}:{found.line} imports {found.target}")
    assert not broken, "\n".join(broken)
    assert shelf_of("aggregator.counting.fold") == "counting"
    assert shelf_of("aggregator.config") is None


def test_no_module_imports_a_conftest_by_name() -> None:
    """pytest loads every conftest.py as the one module ``conftest``, so ``from conftest
    import X`` gets whichever conftest was collected last (a clean clone's CI saw the
    sink folder's). Shared test helpers live in ``*_kit.py`` modules instead."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, target in imports_in(path.read_text(), path.stem, False, known=())
        if target.split(".")[0] == "conftest"
    ]
    assert offenders == []
    assert [t for _, t in imports_in("from conftest import ROOT", "x", False, ())] == ["conftest"]
