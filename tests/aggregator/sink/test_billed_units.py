"""usage_events.units / service_tier (ddl/006_billed_units.sql) on both insert paths, and
the unit_usage view analysts query; rows written before v2 read an empty map and NULL."""

from __future__ import annotations

from typing import Any

from aggregator.sink.rows import USAGE_COLUMN_NAMES, rows_from_priced
from tests.aggregator.sink.kit import (
    WritePath,
    priced,
)


def test_units_and_tier_are_stored_and_listed_per_unit(client: Any, path: WritePath) -> None:
    searched = priced(1, units={"web_search": 3, "web_fetch": 1}, service_tier="priority")
    plain = priced(2)
    assert path.write(path.sink(client), [searched, plain]) == 2
    got = client.query(
        f"SELECT {', '.join(USAGE_COLUMN_NAMES)} FROM usage_events ORDER BY source_offset"
    ).result_rows
    assert got == rows_from_priced([searched, plain])
    units, tier = USAGE_COLUMN_NAMES.index("units"), USAGE_COLUMN_NAMES.index("service_tier")
    assert (got[0][units], got[0][tier]) == ({"web_search": 3, "web_fetch": 1}, "priority")
    assert (got[1][units], got[1][tier]) == ({}, None)
    per_unit = client.query(
        "SELECT unit, sum(count), any(service_tier) FROM unit_usage GROUP BY unit ORDER BY unit"
    ).result_rows
    assert per_unit == [("web_fetch", 1, "priority"), ("web_search", 3, "priority")]


def test_rows_stored_before_the_columns_read_empty(client: Any) -> None:
    """A row inserted without the v2 columns (as before ddl/006) reads the defaults."""
    names = [n for n in USAGE_COLUMN_NAMES if n not in ("units", "service_tier", "charge_of")]
    row = rows_from_priced([priced(5)])[0][: len(names)]
    client.insert("usage_events", [row], column_names=names)
    assert client.query("SELECT units, service_tier FROM usage_events").result_rows == [({}, None)]


def test_a_further_charge_names_its_call_on_both_insert_paths(client: Any, path: WritePath) -> None:
    """usage_events.charge_of (ddl/008): a declined fallback hop's own event names the
    call it is billed apart from; analysts count requests without those rows."""
    call = priced(1, model="claude-sonnet-4-5-20250929")
    hop = priced(2, model="claude-opus-4-5", event_id="ev-0-1.fallback-1", charge_of="ev-0-1")
    assert path.write(path.sink(client), [call, hop]) == 2
    got = client.query(
        f"SELECT {', '.join(USAGE_COLUMN_NAMES)} FROM usage_events ORDER BY source_offset"
    ).result_rows
    assert got == rows_from_priced([call, hop])
    rows = client.query(
        "SELECT model, charge_of FROM usage_events ORDER BY source_offset"
    ).result_rows
    assert rows == [("claude-sonnet-4-5-20250929", None), ("claude-opus-4-5", "ev-0-1")]
    requests = client.query("SELECT count() FROM usage_events WHERE charge_of IS NULL")
    assert requests.result_rows == [(1,)]
