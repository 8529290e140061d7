"""PricedUsage bytes on the hot path: the raw event's bytes plus a hand-written tail.

A PricedUsage body is the UsageEvent body followed by seven fields (Avro writes
a record as its fields one after another), so the aggregator reuses the bytes it
read and writes only the tail. ``schemas.codec.priced_usage_from_raw`` does that
with fastavro (~12 µs a record); the tail is small and fixed, so here it is
written directly (~2 µs). The writer checks at import that the schema's tail is
the one it knows; on any other shape it defers to the codec, and a test holds the
two byte-identical.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from schemas.codec import HEADER_LEN, PRICED_USAGE, USAGE_EVENT, priced_usage_from_raw
from schemas.periods import to_micros

#: the tail this writer knows: (field name, Avro type) after the leading ``event`` field
KNOWN_TAIL: Final = (
    ("cost_nanos", "long"),
    ("price_version", ("null", "string")),
    ("price_match", ("null", "string")),
    ("unpriced", "boolean"),
    ("source_partition", "int"),
    ("source_offset", "long"),
    ("priced_at", ("long", "timestamp-micros")),
)


def _shape(avro_type: object) -> object:
    if isinstance(avro_type, list):
        return tuple(avro_type)
    if isinstance(avro_type, dict):
        return (avro_type["type"], avro_type.get("logicalType"))
    return avro_type


def _tail_is_known() -> bool:
    fields = PRICED_USAGE.schema["fields"]
    if not fields or fields[0]["name"] != "event":
        return False
    return tuple((f["name"], _shape(f["type"])) for f in fields[1:]) == KNOWN_TAIL


TAIL_IS_KNOWN: Final = _tail_is_known()
_USAGE_HEADER: Final = USAGE_EVENT.header
_PRICED_HEADER: Final = PRICED_USAGE.header


def zigzag_varint(n: int) -> bytes:
    """Avro's int/long encoding: zig-zag, then base-128 varint."""
    if 0 <= n < 64:
        return _SMALL[n]
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL: Final = [bytes((n << 1,)) for n in range(64)]


def optional_string(value: str | None) -> bytes:
    """A ``["null", "string"]`` union value."""
    if value is None:
        return b"\x00"
    data = value.encode()
    return b"\x02" + zigzag_varint(len(data)) + data


class PricedWriter:
    """Writes PricedUsage records of one batch (one ``priced_at``)."""

    def __init__(self, priced_at: datetime) -> None:
        self.priced_at = priced_at
        self._priced_at = zigzag_varint(to_micros(priced_at))
        #: (price_version, price_match, unpriced) -> their encoded bytes
        self._price_parts: dict[tuple[str | None, str | None, bool], bytes] = {}

    def write(
        self,
        raw_usage: bytes,
        cost_nanos: int,
        price_version: str | None,
        price_match: str | None,
        unpriced: bool,
        source_partition: int,
        source_offset: int,
    ) -> bytes | None:
        """The PricedUsage bytes, or None when ``raw_usage`` was written with another schema."""
        if not TAIL_IS_KNOWN:
            return priced_usage_from_raw(
                raw_usage,
                {
                    "cost_nanos": cost_nanos,
                    "price_version": price_version,
                    "price_match": price_match,
                    "unpriced": unpriced,
                    "source_partition": source_partition,
                    "source_offset": source_offset,
                    "priced_at": self.priced_at,
                },
            )
        if raw_usage[:HEADER_LEN] != _USAGE_HEADER:
            return None
        parts_key = (price_version, price_match, unpriced)
        parts = self._price_parts.get(parts_key)
        if parts is None:
            parts = self._price_parts[parts_key] = (
                optional_string(price_version)
                + optional_string(price_match)
                + (b"\x01" if unpriced else b"\x00")
            )
        return b"".join(
            (
                _PRICED_HEADER,
                memoryview(raw_usage)[HEADER_LEN:],
                zigzag_varint(cost_nanos),
                parts,
                zigzag_varint(source_partition),
                zigzag_varint(source_offset),
                self._priced_at,
            )
        )
