"""Avro encoding of every topic value, with the Avro single-object header.

Each message is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint
of the writer schema's Parsing Canonical Form + the Avro binary body
(https://avro.apache.org/docs/1.11.1/specification/#single-object-encoding).
A reader looks the fingerprint up among every version this package has ever
shipped (``avro/history/``) and resolves it to the current schema, so old
messages stay readable; an unknown fingerprint is a :class:`DecodeError`
(reason ``unknown_fingerprint``) for the caller to dead-letter.

Schemas live in ``avro/*.avsc``; named types defined in one file may be used
by another (``spendbus.UsageEvent`` inside ``PricedUsage``). Fingerprints are
taken over the self-contained, expanded schema.
"""

from __future__ import annotations

import copy
import io
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Final

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint as avro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from schemas.errors import DecodeError

MAGIC: Final = b"\xc3\x01"
HEADER_LEN: Final = 10
#: load order: a schema comes after the schemas whose named types it uses
SCHEMA_NAMES: Final = (
    "UsageEvent",
    "BudgetPolicy",
    "Verdict",
    "PricedUsage",
    "PriceTable",
    "Alert",
    "DeadLetter",
)
NAMESPACE: Final = "spendbus"

Record = dict[str, Any]


def fingerprint(schema: dict[str, Any]) -> bytes:
    """The 8 header bytes for ``schema`` (a self-contained schema)."""
    # fastavro gives the CRC-64-AVRO as hex of the little-endian bytes the header carries
    return bytes.fromhex(avro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def _avro_dir() -> Any:
    return resources.files("schemas") / "avro"


def _raw(name: str) -> dict[str, Any]:
    return json.loads((_avro_dir() / f"{name}.avsc").read_text())


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


@dataclass(frozen=True)
class Codec:
    """Encoder/decoder of one record type. Decodes every shipped version of it."""

    name: str
    schema: dict[str, Any]
    parsed: Any = field(repr=False)
    header: bytes
    #: fingerprint -> parsed writer schema of an older version (None = the current one)
    writers: dict[bytes, Any] = field(repr=False)

    def encode(self, record: Record) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        schemaless_writer(buf, self.parsed, record)
        return buf.getvalue()

    def decode(self, data: bytes) -> Record:
        """Decode a message of this type; raise DecodeError naming the problem."""
        if data is None:
            raise DecodeError("no value (null message)", reason="null_value")
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise DecodeError(
                "not an Avro single-object message (missing C3 01 header)", reason="bad_magic"
            )
        fp = bytes(data[2:HEADER_LEN])
        if fp == self.header[2:]:
            writer = self.parsed
            reader = None
        elif fp in self.writers:
            writer = self.writers[fp]
            reader = self.parsed
        else:
            other = _FINGERPRINT_OWNER.get(fp)
            if other is not None:
                raise DecodeError(
                    f"expected {self.name}, got a {other} message", reason="wrong_schema"
                )
            raise DecodeError(
                f"unknown schema fingerprint {fp.hex()} (written by a newer or foreign producer?)",
                reason="unknown_fingerprint",
            )
        body = io.BytesIO(data)
        body.seek(HEADER_LEN)
        try:
            record = schemaless_reader(body, writer, reader)
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
            raise DecodeError(
                f"malformed {self.name} body: {type(exc).__name__}: {exc}", reason="malformed"
            ) from None
        if body.tell() != len(data):
            raise DecodeError(
                f"malformed {self.name}: {len(data) - body.tell()} trailing bytes",
                reason="malformed",
            )
        return record  # type: ignore[return-value]


def _build(name: str, schema: dict[str, Any]) -> Codec:
    parsed = parse_schema(copy.deepcopy(schema))
    header = MAGIC + fingerprint(schema)
    writers: dict[bytes, Any] = {}
    for old in history_versions(name):
        fp = fingerprint(old)
        if MAGIC + fp != header:
            writers[fp] = parse_schema(copy.deepcopy(old))
    return Codec(name=name, schema=schema, parsed=parsed, header=header, writers=writers)


_CODECS: Final = {name: _build(name, s) for name, s in expanded_schemas().items()}
_FINGERPRINT_OWNER: Final = {
    fp: name for name, c in _CODECS.items() for fp in (c.header[2:], *c.writers)
}


def codec_for(name: str) -> Codec:
    return _CODECS[name]


USAGE_EVENT: Final = codec_for("UsageEvent")
PRICED_USAGE: Final = codec_for("PricedUsage")
BUDGET_POLICY: Final = codec_for("BudgetPolicy")
PRICE_TABLE: Final = codec_for("PriceTable")
VERDICT: Final = codec_for("Verdict")
ALERT: Final = codec_for("Alert")
DEAD_LETTER: Final = codec_for("DeadLetter")


def _priced_tail() -> tuple[Any, bool]:
    """The PricedUsage fields after ``event``, as a record of their own.

    Avro writes a record as its fields one after another, so a PricedUsage body
    is the UsageEvent body followed by these fields: the aggregator can reuse
    the bytes it read instead of encoding the event again.
    """
    priced = PRICED_USAGE.schema
    starts_with_event = priced["fields"][0]["name"] == "event"
    tail = {
        "type": "record",
        "name": "PricedUsageTail",
        "namespace": NAMESPACE,
        "fields": priced["fields"][1:],
    }
    return parse_schema(tail), starts_with_event


_PRICED_TAIL, _PRICED_STARTS_WITH_EVENT = _priced_tail()


def priced_usage_from_raw(raw_usage: bytes, tail: Record) -> bytes | None:
    """PricedUsage bytes = header + the raw UsageEvent body + the tail fields.

    Only when ``raw_usage`` was written with the current UsageEvent schema (else
    None: the caller encodes the decoded event). Byte-identical to
    ``PRICED_USAGE.encode({"event": USAGE_EVENT.decode(raw_usage), **tail})``.
    """
    if not _PRICED_STARTS_WITH_EVENT or raw_usage[:HEADER_LEN] != USAGE_EVENT.header:
        return None
    buf = io.BytesIO()
    buf.write(PRICED_USAGE.header)
    buf.write(memoryview(raw_usage)[HEADER_LEN:])
    schemaless_writer(buf, _PRICED_TAIL, tail)
    return buf.getvalue()
