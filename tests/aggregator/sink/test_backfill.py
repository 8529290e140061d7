"""A rollup added to a store that already holds events: its view created and its table
filled from usage_events' history exactly once (aggregator/sink/backfill.py), on the real
embedded engine."""

from __future__ import annotations

import threading
import time
from typing import Any

from aggregator.sink import ClickHouseSink, apply_schema, rebuild_rollups, run_query
from aggregator.sink.backfill import FILLED, FILLING, comment_of, engine_clock, rows_between
from aggregator.sink.query import ROLLUP_DRIFT
from tests.aggregator.sink.kit import priced

ROLLUP = "spend_daily_by_dimension"
#: each dimension and its column in usage_events, as a report groups it
DIMENSIONS = {
    "project": "ifNull(project_id, '')",
    "secret": "secret_id",
    "user": "ifNull(user_id, '')",
    "model": "toString(model)",
}


def events(offsets: range) -> list[Any]:
    return [
        priced(o, user_id=f"user-{o % 7}", project_id=None if o % 4 == 0 else f"p{o % 3}")
        for o in offsets
    ]


def assert_rollup_equals_usage_events(client: Any) -> None:
    for dimension, column in DIMENSIONS.items():
        base = client.query(
            f"SELECT toDate(occurred_at, 'UTC') AS day, org_id, {column} AS value, count(), "
            "sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens), "
            "sum(cost_nanos) FROM usage_events GROUP BY ALL ORDER BY ALL"
        ).result_rows
        rolled = client.query(
            "SELECT day, org_id, value, sum(events), sum(billed_tokens), sum(cost_nanos) "
            f"FROM {ROLLUP} WHERE dimension = '{dimension}' GROUP BY ALL ORDER BY ALL"
        ).result_rows
        assert rolled == base, dimension
    assert run_query(client, ROLLUP_DRIFT)[1] == []


def test_a_store_with_history_gets_the_rollup_filled_once(client: Any) -> None:
    # the store as it was before the rollup existed
    client.command(f"DROP VIEW {ROLLUP}_mv")
    client.command(f"DROP TABLE {ROLLUP}")
    sink = ClickHouseSink(client)
    assert sink.write(events(range(0, 300))) == 300
    apply_schema(client)  # the view and the fill of the 300 events it never saw
    assert comment_of(client, ROLLUP) == FILLED
    assert_rollup_equals_usage_events(client)
    assert sink.write(events(range(300, 420))) == 120  # after: through the view only
    apply_schema(client)  # again: nothing filled twice
    assert_rollup_equals_usage_events(client)
    assert ROLLUP in rebuild_rollups(client)
    assert_rollup_equals_usage_events(client)


def test_a_fill_killed_half_way_is_done_again_from_the_start(client: Any) -> None:
    sink = ClickHouseSink(client)
    sink.write(events(range(0, 200)))
    # what a process killed mid-fill leaves: the view there, the table part-filled
    client.command(f"ALTER TABLE {ROLLUP} MODIFY COMMENT '{FILLING}'")
    client.command(
        f"ALTER TABLE {ROLLUP} DELETE WHERE org_id = 'org-1' SETTINGS mutations_sync = 1"
    )
    assert run_query(client, ROLLUP_DRIFT)[1] != []
    apply_schema(client)
    assert comment_of(client, ROLLUP) == FILLED
    assert_rollup_equals_usage_events(client)


def test_an_insert_planned_while_the_view_was_created_is_seen(client: Any) -> None:
    sink = ClickHouseSink(client)
    sink.write(events(range(0, 10)))
    time.sleep(0.002)  # the clock past the first insert's millisecond
    before = engine_clock(client)
    assert rows_between(client, before, engine_clock(client)) == 0
    sink.write(events(range(10, 20)))  # planned in the window: may or may not feed the view
    assert rows_between(client, before, engine_clock(client)) == 10


def test_inserts_racing_the_fill_are_counted_once(client: Any) -> None:
    client.command(f"DROP VIEW {ROLLUP}_mv")
    client.command(f"DROP TABLE {ROLLUP}")
    sink = ClickHouseSink(client)
    sink.write(events(range(0, 100)))
    stop = threading.Event()
    written = []

    def keep_inserting() -> None:
        # a second sink on the same store, one small insert after another
        other = ClickHouseSink(client)
        offset = 100
        while not stop.is_set():
            written.append(other.write(events(range(offset, offset + 5))))
            offset += 5
            time.sleep(0.01)  # a sink's batches come apart in time

    inserter = threading.Thread(target=keep_inserting)
    inserter.start()
    try:
        while sum(written) < 20:
            time.sleep(0.01)
        apply_schema(client)
        settled = sum(written)
        while sum(written) < settled + 20:  # and more after the fill
            time.sleep(0.01)
    finally:
        stop.set()
        inserter.join()
    assert_rollup_equals_usage_events(client)
