"""Writes the Avro records as TypedDicts, one module for mypy to check their readers against:
``python -m schemas.recordgen schemas/records.py``.

Every current schema (``schemas.avro_schemas.expanded_schemas``) gives a TypedDict, and so
does every record type named inside one (``CounterCount``, ``ModelPrice``...); an enum gives
a ``Literal`` of its symbols. The types are the values ``schemas.codec`` decodes: fastavro
reads ``timestamp-micros`` as an aware UTC datetime.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from schemas.avro_schemas import NAMESPACE, SCHEMA_NAMES, expanded_schemas

#: the command that writes the module
WRITE_RECORDS: Final = "python -m schemas.recordgen schemas/records.py"
#: the module it writes, beside this file
RECORDS_MODULE: Final = Path(__file__).with_name("records.py")

_PRIMITIVES: Final = {
    "string": "str",
    "long": "int",
    "int": "int",
    "double": "float",
    "float": "float",
    "boolean": "bool",
    "bytes": "bytes",
    "null": "None",
}
#: logical types fastavro decodes to another Python type than its base type's
_LOGICAL: Final = {"timestamp-micros": "datetime", "timestamp-millis": "datetime"}
_WIDTH: Final = 100

_HEADER: Final = '''"""The Avro records as TypedDicts, generated from ``schemas/avro/*.avsc`` by
``python -m schemas.recordgen schemas/records.py``: do not edit.

Each is a record as ``schemas.codec`` decodes it: every field present, a
``timestamp-micros`` field as an aware UTC datetime, an enum as its symbol, a union with
null as ``X | None``. The encoders take the same shape (and timestamps as integer
microseconds too).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict
'''


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name else f"{namespace}.{name}"


def _short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Module:
    """The definitions of the module, each named type once, before its first use."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.defined: set[str] = set()

    def python_type(self, avro: Any, namespace: str) -> str:
        if isinstance(avro, str):
            if avro in _PRIMITIVES:
                return _PRIMITIVES[avro]
            full = _full_name(avro, namespace)
            if full not in self.defined:
                raise ValueError(f"{avro} is used before it is defined")
            return _short_name(full)
        if isinstance(avro, list):
            branches = [self.python_type(branch, namespace) for branch in avro]
            # null last: the field reads as "X | None", the way the code spells it
            return " | ".join(sorted(branches, key=lambda b: b == "None"))
        kind = avro["type"]
        logical = avro.get("logicalType")
        if logical is not None and kind in ("int", "long"):
            if logical not in _LOGICAL:
                raise ValueError(f"no Python type written for logicalType {logical!r}")
            return _LOGICAL[logical]
        if kind == "array":
            return f"list[{self.python_type(avro['items'], namespace)}]"
        if kind == "map":
            return f"dict[str, {self.python_type(avro['values'], namespace)}]"
        if kind == "fixed":
            return "bytes"
        if kind in ("record", "enum"):
            return self.define(avro, namespace)
        return self.python_type(kind, namespace)

    def define(self, named: Mapping[str, Any], namespace: str) -> str:
        namespace = named.get("namespace", namespace)
        full = _full_name(named["name"], namespace)
        name = _short_name(full)
        if full in self.defined:
            return name
        if named["type"] == "enum":
            symbols = ", ".join(f'"{symbol}"' for symbol in named["symbols"])
            self.defined.add(full)
            self.blocks.append(f"{name} = Literal[{symbols}]")
            return name
        # the field types first: a nested record is defined above the record that holds it
        fields = [(f, self.python_type(f["type"], namespace)) for f in named["fields"]]
        self.defined.add(full)
        lines = [f"class {name}(TypedDict):"]
        lines += _docstring(named.get("doc") or f"A {name} record.")
        lines.append("")
        for field, python in fields:
            doc = field.get("doc")
            if doc:
                lines += textwrap.wrap(
                    doc, _WIDTH, initial_indent="    #: ", subsequent_indent="    #: "
                )
            lines.append(f"    {field['name']}: {python}")
        self.blocks.append("\n".join(lines))
        return name


def _docstring(text: str) -> list[str]:
    quoted = f'"""{text}"""'
    if len(quoted) + 4 <= _WIDTH:
        return [f"    {quoted}"]
    wrapped = textwrap.wrap(text, _WIDTH, initial_indent='    """', subsequent_indent="    ")
    return [*wrapped, '    """']


def records_module_source(schemas: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The module's source: a TypedDict per record type of ``schemas`` (default: every
    current schema, in load order), each enum a Literal."""
    if schemas is None:
        current = expanded_schemas()
        schemas = {name: current[name] for name in SCHEMA_NAMES}
    module = _Module()
    for schema in schemas.values():
        module.define(schema, NAMESPACE)
    # isort's blank lines after the imports: two before a class, one before an alias
    gap = "\n\n" if module.blocks[0].startswith("class ") else "\n"
    return _HEADER + gap + "\n\n\n".join(module.blocks) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the module to write")
    args = parser.parse_args()
    args.path.write_text(records_module_source())
    print(f"wrote {args.path}")


if __name__ == "__main__":
    main()
