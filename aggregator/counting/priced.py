"""PricedUsage bytes on the hot path: the raw event's bytes plus a hand-written tail.

A PricedUsage body is the UsageEvent body followed by eight fields (Avro writes
a record as its fields one after another), so the aggregator reuses the bytes it
read and writes only the tail. ``schemas.codec.priced_usage_from_raw`` does that
with fastavro; the tail is small and fixed, so here it is written directly, at a
fraction of the cost. The last field, ``counts`` (the counters the event counts
in: the budget history, ``infra/clickhouse/README.md``), is the same for every event of
one counter set, period and bucket, so its items are encoded once (``CountEntry``) and
joined. The writer checks at import that the schema's tail is the one it knows; on any
other shape it defers to the codec, and tests hold the two byte-identical.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from schemas.budgets import Budget
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
    ("counts", ("array", None)),
)
#: the fields of one ``counts`` item (a CounterCount) this writer knows, in order
KNOWN_COUNT: Final = (
    ("counter_key", "string"),
    ("budget_id", "string"),
    ("scope_values", ("array", None)),
    ("window", "string"),
    ("period", "string"),
    ("bucket", "long"),
    ("requests", "int"),
    ("limit_nanos", ("null", "long")),
    ("limit_tokens", ("null", "long")),
    ("limit_requests", ("null", "long")),
    ("alert_at", ("array", None)),
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
    if tuple((f["name"], _shape(f["type"])) for f in fields[1:]) != KNOWN_TAIL:
        return False
    items = fields[-1]["type"]["items"]
    return isinstance(items, dict) and (
        tuple((f["name"], _shape(f["type"])) for f in items["fields"]) == KNOWN_COUNT
    )


TAIL_IS_KNOWN: Final = _tail_is_known()
_USAGE_HEADER: Final = USAGE_EVENT.header
_PRICED_HEADER: Final = PRICED_USAGE.header


def zigzag_varint(n: int) -> bytes:
    """Avro's int/long encoding: zig-zag, then base-128 varint."""
    if 0 <= n < 64:
        return _SMALL[n]
    z = (n << 1) ^ (n >> 63)
    # the varint's bytes gathered in one integer, little-endian: one conversion at the end
    # instead of a method call per byte
    packed = 0
    length = 0
    while z > 0x7F:
        packed |= ((z & 0x7F) | 0x80) << (length * 8)
        z >>= 7
        length += 1
    packed |= z << (length * 8)
    return packed.to_bytes(length + 1, "little")


_SMALL: Final = [bytes((n << 1,)) for n in range(64)]


def optional_string(value: str | None) -> bytes:
    """A ``["null", "string"]`` union value."""
    if value is None:
        return b"\x00"
    data = value.encode()
    return b"\x02" + zigzag_varint(len(data)) + data


def _string(value: str) -> bytes:
    data = value.encode()
    return zigzag_varint(len(data)) + data


def _optional_long(value: int | None) -> bytes:
    return b"\x00" if value is None else b"\x02" + zigzag_varint(value)


class CountEntry:
    """One CounterCount of a priced event, as a record and as its Avro bytes.

    The same for every event of one counter, period, bucket and request flag under one
    budget policy, so the fold builds it once (``CountCache``) and joins the bytes.
    """

    def __init__(
        self,
        budget: Budget,
        counter_key: str,
        scope_values: tuple[str, ...],
        period: str,
        bucket: int,
        requests: int,
    ) -> None:
        window = budget.window.spec
        self.record: dict[str, Any] = {
            "counter_key": counter_key,
            "budget_id": budget.budget_id,
            "scope_values": list(scope_values),
            "window": window,
            "period": period,
            "bucket": bucket,
            "requests": requests,
            "limit_nanos": budget.limit_nanos,
            "limit_tokens": budget.limit_tokens,
            "limit_requests": budget.limit_requests,
            "alert_at": [float(t) for t in budget.alert_at],
        }
        values = b"".join([_string(v) for v in scope_values])
        alerts = b"".join([struct.pack("<d", float(t)) for t in budget.alert_at])
        self.data: bytes = b"".join(
            (
                _string(counter_key),
                _string(budget.budget_id),
                (zigzag_varint(len(scope_values)) + values + b"\x00") if scope_values else b"\x00",
                _string(window),
                _string(period),
                zigzag_varint(bucket),
                zigzag_varint(requests),
                _optional_long(budget.limit_nanos),
                _optional_long(budget.limit_tokens),
                _optional_long(budget.limit_requests),
                (zigzag_varint(len(budget.alert_at)) + alerts + b"\x00")
                if budget.alert_at
                else b"\x00",
            )
        )


class CountCache:
    """CountEntry objects by (counter key, period, bucket, requests) for one set of budgets
    (``reset`` when they change), bounded: clearing only costs rebuilding entries."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._entries: dict[tuple[str, str, int, int], CountEntry] = {}

    def reset(self) -> None:
        self._entries.clear()

    def get(
        self,
        budget: Budget,
        counter_key: str,
        scope_values: tuple[str, ...],
        period: str,
        bucket: int,
        requests: int,
    ) -> CountEntry:
        where = (counter_key, period, bucket, requests)
        entry = self._entries.get(where)
        if entry is None:
            if len(self._entries) >= self.limit:
                self._entries.clear()
            entry = self._entries[where] = CountEntry(
                budget, counter_key, scope_values, period, bucket, requests
            )
        return entry


def counts_bytes(counts: Sequence[CountEntry]) -> bytes:
    """The ``counts`` array: one block of every entry, then the end marker."""
    if not counts:
        return b"\x00"
    parts = [zigzag_varint(len(counts))]
    for count in counts:
        parts.append(count.data)
    parts.append(b"\x00")
    return b"".join(parts)


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
        counts: Sequence[CountEntry] = (),
        counts_data: bytes | None = None,
    ) -> bytes | None:
        """The PricedUsage bytes, or None when ``raw_usage`` was written with another schema.

        ``counts_data`` is ``counts_bytes(counts)`` when the caller has it already."""
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
                    "counts": [c.record for c in counts],
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
                counts_bytes(counts) if counts_data is None else counts_data,
            )
        )
