"""Avro encoding of every topic value, with the Avro single-object header.

Each message is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint
of the writer schema's Parsing Canonical Form + the Avro binary body
(https://avro.apache.org/docs/1.11.1/specification/#single-object-encoding).
A reader looks the fingerprint up among every version this package has ever
shipped (``avro/history/``) and resolves it to the current schema, so old
messages stay readable; an unknown fingerprint is a :class:`DecodeError`
(reason ``unknown_fingerprint``) for the caller to dead-letter.

The schemas, expanded and fingerprinted, come from :mod:`schemas.avro_schemas`.

UsageEvent, written once per upstream call by every proxy, is encoded by a
writer generated from its schema at import
(:func:`schemas.avro_writer.compile_record_writer`):
a fraction of the CPU of fastavro's generic writer (bench/records/history_ingest.md),
byte-identical (a property
test compares the two). It takes only the value types it knows exactly; any
other value is handed to fastavro, which encodes it or raises its own error.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas.avro_schemas import NAMESPACE, expanded_schemas, fingerprint, history_versions
from schemas.avro_writer import BodyWriter, compile_record_writer
from schemas.errors import DecodeError
from schemas.records import (
    Alert,
    BudgetPolicy,
    BudgetRaise,
    DeadLetter,
    GenerationSwitch,
    JobApproval,
    PricedUsage,
    PriceTable,
    Verdict,
)

MAGIC: Final = b"\xc3\x01"
HEADER_LEN: Final = 10
#: a Python object's default repr in an error text (``from <_io.BytesIO object at 0x...>``)
_OBJECT_REPR: Final = re.compile(r" from <[^<>]* at 0x[0-9a-fA-F]+>")

#: the record a codec decodes (a TypedDict of schemas.records); covariant: every codec is a
#: ``Codec[Mapping[str, object]]`` to code that takes any of them
R = TypeVar("R", bound=Mapping[str, object], covariant=True)


@dataclass(frozen=True)
class Codec(Generic[R]):
    """Encoder/decoder of one record type. Decodes every shipped version of it."""

    name: str
    schema: dict[str, Any]
    parsed: Any = field(repr=False)
    header: bytes
    #: fingerprint -> parsed writer schema of an older version (None = the current one)
    writers: dict[bytes, Any] = field(repr=False)
    #: the generated writer of the body (None: fastavro's generic writer only)
    body_writer: BodyWriter | None = field(default=None, repr=False, compare=False)

    def encode(self, record: Mapping[str, object]) -> bytes:
        body_writer = self.body_writer
        if body_writer is not None:
            try:
                return self.header + body_writer(record)
            except Exception:  # a value it does not take: fastavro encodes it or names the error
                pass
        buf = io.BytesIO()
        buf.write(self.header)
        schemaless_writer(buf, self.parsed, record)
        return buf.getvalue()

    def decode(self, data: bytes) -> R:
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
            # fastavro names the stream it read ("cannot read boolean from <_io.BytesIO
            # object at 0x7f...>"): an address, different for every reader of the same bytes
            detail = _OBJECT_REPR.sub("", str(exc))
            raise DecodeError(
                f"malformed {self.name} body: {type(exc).__name__}: {detail}", reason="malformed"
            ) from None
        if body.tell() != len(data):
            raise DecodeError(
                f"malformed {self.name}: {len(data) - body.tell()} trailing bytes",
                reason="malformed",
            )
        return record  # type: ignore[return-value]  # every codec's schema is a record: fastavro reads a dict


#: the codecs whose encoding is on a hot path get a generated writer
_SPECIALISED: Final = frozenset({"UsageEvent"})


def _build(name: str, schema: dict[str, Any]) -> Codec[Any]:
    parsed = parse_schema(copy.deepcopy(schema))
    header = MAGIC + fingerprint(schema)
    writers: dict[bytes, Any] = {}
    for old in history_versions(name):
        fp = fingerprint(old)
        if MAGIC + fp != header:
            writers[fp] = parse_schema(copy.deepcopy(old))
    body_writer = compile_record_writer(schema) if name in _SPECIALISED else None
    return Codec(
        name=name,
        schema=schema,
        parsed=parsed,
        header=header,
        writers=writers,
        body_writer=body_writer,
    )


_CODECS: Final = {name: _build(name, s) for name, s in expanded_schemas().items()}
_FINGERPRINT_OWNER: Final = {
    fp: name for name, c in _CODECS.items() for fp in (c.header[2:], *c.writers)
}


def codec_for(name: str) -> Codec[Any]:
    return _CODECS[name]


#: its records as plain dicts: the fold (aggregator/counting) takes the codec's and its own
#: generated reader's alike, and completes the latter's timestamps in place by field name
USAGE_EVENT: Final[Codec[dict[str, Any]]] = codec_for("UsageEvent")
PRICED_USAGE: Final[Codec[PricedUsage]] = codec_for("PricedUsage")
BUDGET_POLICY: Final[Codec[BudgetPolicy]] = codec_for("BudgetPolicy")
PRICE_TABLE: Final[Codec[PriceTable]] = codec_for("PriceTable")
VERDICT: Final[Codec[Verdict]] = codec_for("Verdict")
ALERT: Final[Codec[Alert]] = codec_for("Alert")
DEAD_LETTER: Final[Codec[DeadLetter]] = codec_for("DeadLetter")
#: its records as plain dicts: the gateway's reader (ingest/gateway/keys_topic.py) takes them so
GATEWAY_KEY: Final[Codec[dict[str, Any]]] = codec_for("VirtualKey")
GENERATION_SWITCH: Final[Codec[GenerationSwitch]] = codec_for("GenerationSwitch")
BUDGET_RAISE: Final[Codec[BudgetRaise]] = codec_for("BudgetRaise")
JOB_APPROVAL: Final[Codec[JobApproval]] = codec_for("JobApproval")


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


def priced_usage_from_raw(raw_usage: bytes, tail: Mapping[str, object]) -> bytes | None:
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
