"""ingest's public face: the CLI imports the room only through its package ``__init__``s,
every name they export exists, and no module of the room imports itself back (function-
level and TYPE_CHECKING imports included), read from the source with ast."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the packages whose ``__init__`` is public; every other ingest module is internal
PUBLIC = ("ingest", "ingest.gateway", "ingest.publisher", "ingest.taps")


def modules(room: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / room).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


INGEST = modules("ingest")


def imported(module: str, path: Path) -> set[str]:
    """The modules ``module`` imports (``from pkg import sub`` is ``pkg.sub``)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, node.module] if node.module else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in INGEST else base)
    return out


def test_the_cli_imports_ingest_only_through_its_packages() -> None:
    reached = [
        f"{path.relative_to(ROOT)} imports {target}"
        for module, path in modules("spendbus").items()
        for target in imported(module, path)
        if target.split(".")[0] == "ingest" and target not in PUBLIC
    ]
    assert not reached, "\n".join(reached)


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_name_exists(package: str) -> None:
    loaded = importlib.import_module(package)
    names = loaded.__all__
    assert names and len(set(names)) == len(names)
    assert [name for name in names if not hasattr(loaded, name)] == []


def test_no_import_cycle_inside_ingest() -> None:
    edges = {
        module: {t for t in imported(module, path) if t in INGEST and t != module}
        for module, path in INGEST.items()
    }
    # a package's __init__ is imported before its modules: not an edge back to it
    for module, targets in edges.items():
        targets -= {p for p in INGEST if module.startswith(p + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_a_cycle_would_be_seen(tmp_path: Path) -> None:
    """The reading sees a function-level relative import (what hid proxy <-> realtime)."""
    source = tmp_path / "realtime.py"
    source.write_text("def handle():\n    from .proxy import Call\n")
    assert "ingest.gateway.proxy" in imported("ingest.gateway.realtime", source)
