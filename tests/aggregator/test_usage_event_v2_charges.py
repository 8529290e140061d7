"""UsageEvent v3 (``charge_of``) over v2 records, and what a further charge counts: its
cost and tokens in every counter of the call, no request of its own (nor in the budget
history the sink stores)."""

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
from schemas.topics import usage_raw_key
from tests.aggregator.test_process import COST, Store, event, records, reference

V2 = json.loads(
    (resources.files("schemas") / "avro" / "history" / "UsageEvent" / "v2.avsc").read_text()
)
V2_FIELDS = [f["name"] for f in V2["fields"]]


def v2_bytes(record: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(MAGIC + fingerprint(V2))
    schemaless_writer(out, parse_schema(V2), {name: record[name] for name in V2_FIELDS})
    return out.getvalue()


def test_v3_adds_charge_of_only_and_v2_bytes_read_it_null_by_both_readers() -> None:
    v3 = USAGE_EVENT.schema
    assert [f["name"] for f in v3["fields"]] == [*V2_FIELDS, "charge_of"]
    record: Mapping[str, Any] = event(0, units={"web_search": 2}, service_tier="priority")
    data = v2_bytes(record)
    assert data[:10] != USAGE_EVENT.header  # the v2 writer's header
    by_codec, by_fold = USAGE_EVENT.decode(data), decode_usage_event(data)
    assert by_codec == by_fold and by_codec["charge_of"] is None
    assert {k: by_codec[k] for k in V2_FIELDS} == {k: record[k] for k in V2_FIELDS}
    charge = event(1, charge_of="ev-0")
    assert decode_usage_event(USAGE_EVENT.encode(charge)) == charge


def test_a_further_charge_adds_its_cost_and_tokens_but_no_request() -> None:
    call = event(0, session_id="job-1", grant_id="g-1")
    hop = event(1, session_id="job-1", grant_id="g-1", event_id="ev-0.fallback-1", charge_of="ev-0")
    store = Store()
    out = store.run(BatchProcessor(reference(), source_topic="usage.raw"), records([call, hop]))
    assert out.stats.charged == 2 and out.stats.cost_nanos == 2 * COST
    assert store.totals("grant", "acme", "g-1") == (2 * COST, 2 * 1100, 1)
    assert store.totals("org-day", "acme") == (2 * COST, 2 * 1100, 1)
    # the budget history stored with each priced event says the same
    rows = [PRICED_USAGE.decode(v) for _, _, v, _ in out.priced]
    assert [row["event"]["charge_of"] for row in rows] == [None, "ev-0"]
    for row, requests in zip(rows, (1, 0), strict=True):
        assert {count["requests"] for count in row["counts"]} == {requests}


def test_a_mixed_ledger_of_v2_and_v3_records_replays_the_same() -> None:
    events = [event(i) for i in range(4)]
    mixed = [
        RawRecord(0, n, usage_raw_key(e["org_id"]), v2_bytes(e) if n % 2 else USAGE_EVENT.encode(e))
        for n, e in enumerate(events)
    ]
    old, new = Store(), Store()
    old.run(BatchProcessor(reference(), source_topic="usage.raw"), mixed)
    new.run(BatchProcessor(reference(), source_topic="usage.raw"), records(events))
    assert old.counters == new.counters
