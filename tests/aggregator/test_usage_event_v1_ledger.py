"""UsageEvent v2 (``units``, ``service_tier``) over a v1 ledger: the aggregator reads both,
and old ledgers replay unchanged.

The v1 records are written exactly as a v1 producer wrote them: the released v1 schema
(schemas/avro/history/UsageEvent/v1.avsc), its fingerprint in the header, fastavro's
encoding; they are the bytes on any usage.raw written before v2."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from fastavro import parse_schema, schemaless_writer

from aggregator.counting.decode import decode_usage_event
from aggregator.counting.process import BatchProcessor, RawRecord
from schemas.avro_schemas import fingerprint
from schemas.codec import MAGIC, PRICED_USAGE, USAGE_EVENT
from schemas.records import PricedUsage, UsageEvent
from schemas.topics import usage_raw_key
from tests.aggregator.test_process import COST, Store, event, records, reference

V1 = json.loads(
    (resources.files("schemas") / "avro" / "history" / "UsageEvent" / "v1.avsc").read_text()
)
V1_FIELDS = [f["name"] for f in V1["fields"]]


def v1_bytes(record: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(MAGIC + fingerprint(V1))
    schemaless_writer(out, parse_schema(V1), {name: record[name] for name in V1_FIELDS})
    return out.getvalue()


def v1_ledger(events: list[UsageEvent]) -> list[RawRecord]:
    return [RawRecord(0, n, usage_raw_key(e["org_id"]), v1_bytes(e)) for n, e in enumerate(events)]


def unpriced_at(row: PricedUsage) -> dict[str, Any]:
    """``row`` without its ``priced_at`` (when it was priced: the rest must agree)."""
    return {k: v for k, v in row.items() if k != "priced_at"}


def test_v2_adds_defaulted_fields_only() -> None:
    v2 = USAGE_EVENT.schema
    assert [f["name"] for f in v2["fields"]][: len(V1_FIELDS)] == V1_FIELDS
    added = {f["name"]: f for f in v2["fields"][len(V1_FIELDS) :]}
    assert set(added) == {"units", "service_tier", "charge_of"}  # v2, then v3
    assert added["units"]["default"] == {} and added["service_tier"]["default"] is None
    assert fingerprint(V1) in USAGE_EVENT.writers


def test_v1_bytes_decode_with_the_defaults_by_both_readers() -> None:
    record: Mapping[str, Any] = event(0, cache_read_tokens=50, tags={"team": "search"})
    data = v1_bytes(record)
    assert data[:10] != USAGE_EVENT.header  # an older writer's header
    by_codec = USAGE_EVENT.decode(data)
    by_fold = decode_usage_event(data)
    assert by_codec == by_fold
    assert by_codec["units"] == {} and by_codec["service_tier"] is None
    assert by_codec["charge_of"] is None
    assert {k: by_codec[k] for k in V1_FIELDS} == {k: record[k] for k in V1_FIELDS}


def test_v2_bytes_carry_units_and_tier() -> None:
    record = event(0, units={"web_search": 3, "web_fetch": 1}, service_tier="priority")
    data = USAGE_EVENT.encode(record)
    assert data[:10] == USAGE_EVENT.header
    assert decode_usage_event(data) == USAGE_EVENT.decode(data) == record


def test_a_v1_ledger_replays_to_the_same_charges_as_v2_without_units() -> None:
    """Old ledgers replay unchanged: the same costs, counters and priced rows (units
    empty, tier null), whether each event was written by v1 or by v2."""
    events = [event(i) for i in range(4)]
    old_store, new_store = Store(), Store()
    old = old_store.run(BatchProcessor(reference(), source_topic="usage.raw"), v1_ledger(events))
    new = new_store.run(BatchProcessor(reference(), source_topic="usage.raw"), records(events))
    assert old.stats.charged == new.stats.charged == 4
    assert old.stats.cost_nanos == new.stats.cost_nanos == 4 * COST
    assert old_store.counters == new_store.counters
    old_rows = [PRICED_USAGE.decode(v) for _, _, v, _ in old.priced]
    new_rows = [PRICED_USAGE.decode(v) for _, _, v, _ in new.priced]
    for row in old_rows:
        assert row["event"]["units"] == {} and row["event"]["service_tier"] is None
    assert [unpriced_at(row) for row in old_rows] == [unpriced_at(row) for row in new_rows]
    # every priced record is written with the current PricedUsage schema
    assert all(v[:10] == PRICED_USAGE.header for _, _, v, _ in old.priced)


def test_a_mixed_ledger_is_read_in_order() -> None:
    events = [event(i) for i in range(4)]
    mixed = [
        RawRecord(0, n, usage_raw_key(e["org_id"]), v1_bytes(e) if n % 2 else USAGE_EVENT.encode(e))
        for n, e in enumerate(events)
    ]
    out = Store().run(BatchProcessor(reference(), source_topic="usage.raw"), mixed)
    assert [PRICED_USAGE.decode(v)["source_offset"] for _, _, v, _ in out.priced] == [0, 1, 2, 3]
    assert out.stats.cost_nanos == 4 * COST
