"""The Avro schemas as shipped: loaded, expanded to stand alone, every released version,
and the fingerprint of each.

Schemas live in ``avro/*.avsc``; named types defined in one file may be used
by another (``spendbus.UsageEvent`` inside ``PricedUsage``), so those files parse only
together, in ``SCHEMA_NAMES`` order. Fingerprints are taken over the self-contained,
expanded schema: the 8-byte little-endian CRC-64-AVRO of its Parsing Canonical Form.
Every released version is kept under ``avro/history/``, and the current ones, expanded,
under ``avro/standalone/`` for libraries that read one file at a time
(``python -m schemas.avscgen`` writes them; a test holds them current).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any, Final

from fastavro.schema import fingerprint as avro_fingerprint
from fastavro.schema import to_parsing_canonical_form

#: load order: a schema comes after the schemas whose named types it uses
SCHEMA_NAMES: Final = (
    "UsageEvent",
    "BudgetPolicy",
    "Verdict",
    "PricedUsage",
    "PriceTable",
    "Alert",
    "DeadLetter",
    "VirtualKey",
    "GenerationSwitch",
    "BudgetRaise",
    "JobApproval",
)
NAMESPACE: Final = "spendbus"


def fingerprint(schema: dict[str, Any]) -> bytes:
    """The 8 header bytes for ``schema`` (a self-contained schema)."""
    # fastavro gives the CRC-64-AVRO as hex of the little-endian bytes the header carries
    return bytes.fromhex(avro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def _avro_dir() -> Any:
    return resources.files("schemas") / "avro"


def _raw(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((_avro_dir() / f"{name}.avsc").read_text())
    return schema


def _expand(node: Any, defined: dict[str, Any], seen: set[str]) -> Any:
    """Inline named-type references so a schema stands alone (first use inlined, later by name)."""
    if isinstance(node, str):
        full = node if "." in node else f"{NAMESPACE}.{node}"
        if full in defined and full not in seen:
            return _expand(copy.deepcopy(defined[full]), defined, seen)
        return node
    if isinstance(node, list):
        return [_expand(item, defined, seen) for item in node]
    if isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            seen.add(f"{node.get('namespace', NAMESPACE)}.{node['name']}")
        out = dict(node)
        if "fields" in out:
            out["fields"] = [
                {**f, "type": _expand(f["type"], defined, seen)} for f in out["fields"]
            ]
        for key in ("items", "values"):
            if key in out:
                out[key] = _expand(out[key], defined, seen)
        if isinstance(out.get("type"), list | dict) or (
            isinstance(out.get("type"), str) and out["type"] not in _PRIMITIVE_OR_COMPLEX
        ):
            out["type"] = _expand(out["type"], defined, seen)
        return out
    return node


_PRIMITIVE_OR_COMPLEX: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
    | {"record", "enum", "array", "map", "fixed"}
)


def _collect_named(node: Any, namespace: str, out: dict[str, Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_named(item, namespace, out)
    elif isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            ns = node.get("namespace", namespace)
            out[f"{ns}.{node['name']}"] = node
            namespace = ns
        for f in node.get("fields", []):
            _collect_named(f["type"], namespace, out)
        for key in ("items", "values"):
            if key in node:
                _collect_named(node[key], namespace, out)
        if isinstance(node.get("type"), list | dict):
            _collect_named(node["type"], namespace, out)


@cache
def expanded_schemas() -> dict[str, dict[str, Any]]:
    """Every current schema, self-contained, by short name."""
    defined: dict[str, Any] = {}
    result: dict[str, dict[str, Any]] = {}
    for name in SCHEMA_NAMES:
        raw = _raw(name)
        result[name] = _expand(raw, defined, set())
        _collect_named(raw, NAMESPACE, defined)
    return result


def history_versions(name: str) -> list[dict[str, Any]]:
    """Every released version of ``name``, oldest first (``avro/history/<name>/v<N>.avsc``)."""
    folder = _avro_dir() / "history" / name
    if not folder.is_dir():
        return []
    files = sorted(
        (p for p in folder.iterdir() if p.name.endswith(".avsc")),
        key=lambda p: int(p.name[1:].split(".")[0]),
    )
    return [json.loads(p.read_text()) for p in files]


def defining_files() -> dict[str, str]:
    """Each named type's full name and the ``avro/*.avsc`` file that defines it."""
    files: dict[str, str] = {}
    for name in SCHEMA_NAMES:
        defined: dict[str, Any] = {}
        _collect_named(_raw(name), NAMESPACE, defined)
        for full in defined:
            files.setdefault(full, f"{name}.avsc")
    return files
