"""The sink's flush order: exact sums, each event once after a redelivery, a failed or
half-done insert, a crash at any step; rollups equal to usage_events."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregator.sink import (
    ROLLUP_DRIFT,
    SinkRejected,
    SinkUnavailable,
    rebuild_rollups,
    run_query,
)
from aggregator.sink.rows import month_of
from schemas.errors import SpendbusError
from tests.aggregator.sink.kit import (
    T0,
    FlakyClient,
    WritePath,
    batch,
    priced,
    scalar,
    totals,
)

# -- exactness ----------------------------------------------------------------------


def test_sums_are_exact_over_50k_rows_in_10k_batches(client: Any, path: WritePath) -> None:
    rng = random.Random(7)
    sink = path.sink(client)
    expected_cost: Counter[str] = Counter()
    expected_tokens = 0
    offsets = [0] * 4
    for _ in range(5):
        records = []
        for _ in range(10_000):
            p = rng.randrange(4)
            cost = rng.randrange(0, 5_000_000_000)
            rec = priced(offsets[p], partition=p, cost_nanos=cost, org_id=f"org-{rng.randrange(7)}")
            offsets[p] += 1
            expected_cost[rec["event"]["org_id"]] += cost
            expected_tokens += rec["event"]["input_tokens"] + rec["event"]["output_tokens"]
            records.append(rec)
        assert path.write(sink, records) == 10_000
    assert totals(client) == (50_000, sum(expected_cost.values()), 50_000)
    by_org = dict(
        client.query("SELECT org_id, sum(cost_nanos) FROM usage_events GROUP BY org_id").result_rows
    )
    assert by_org == dict(expected_cost)
    assert scalar(client, "SELECT sum(billed_tokens) FROM spend_hourly") == expected_tokens
    _assert_rollups_equal_usage_events(client)
    # the same with every part merged: merges change the storage, never the answers
    for table in ("usage_events", "spend_hourly", "spend_daily"):
        client.command(f"OPTIMIZE TABLE {table} FINAL")
    assert totals(client) == (50_000, sum(expected_cost.values()), 50_000)
    _assert_rollups_equal_usage_events(client)


def _assert_rollups_equal_usage_events(client: Any) -> None:
    measures = (
        "count() AS events",
        "countIf(outcome IN ('refused', 'failed_closed'))",
        "countIf(usage_source = 'estimated')",
        "countIf(unpriced)",
        "sum(input_tokens)",
        "sum(cache_read_tokens)",
        "sum(cache_write_tokens)",
        "sum(cache_write_1h_tokens)",
        "sum(output_tokens)",
        "sum(reasoning_tokens)",
        "sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens)",
        "sum(cost_nanos)",
    )
    sums = (
        "sum(events)",
        "sum(refused_events)",
        "sum(estimated_events)",
        "sum(unpriced_events)",
        "sum(input_tokens)",
        "sum(cache_read_tokens)",
        "sum(cache_write_tokens)",
        "sum(cache_write_1h_tokens)",
        "sum(output_tokens)",
        "sum(reasoning_tokens)",
        "sum(billed_tokens)",
        "sum(cost_nanos)",
    )
    dims = "org_id, secret_id, ifNull(project_id, ''), ifNull(grant_id, ''), ifNull(user_id, '')"
    dims += ", provider, model"
    roll_dims = "org_id, secret_id, project_id, grant_id, user_id, provider, model"
    for bucket, source, table in (
        ("toStartOfHour(toDateTime(occurred_at, 'UTC'))", "hour", "spend_hourly"),
        ("toDate(occurred_at, 'UTC')", "day", "spend_daily"),
    ):
        base = client.query(
            f"SELECT {bucket} AS b, {dims}, {', '.join(measures)} FROM usage_events "
            f"GROUP BY b, {dims} ORDER BY ALL"
        ).result_rows
        rolled = client.query(
            f"SELECT {source} AS b, {roll_dims}, {', '.join(sums)} FROM {table} "
            f"GROUP BY b, {roll_dims} ORDER BY ALL"
        ).result_rows
        assert rolled == base, table
    assert run_query(client, ROLLUP_DRIFT)[1] == []


def test_a_redelivered_overlapping_batch_lands_once(client: Any, path: WritePath) -> None:
    sink = path.sink(client)
    assert path.write(sink, batch(range(0, 6_000), partitions=2)) == 12_000
    # after a crash the consumer re-reads a suffix of each partition, then goes on
    again = batch(range(4_000, 10_000), partitions=2)
    assert path.write(sink, again) == 8_000
    assert totals(client)[0::2] == (20_000, 20_000)
    # a restarted sink reads its fences from ClickHouse and skips the same way
    restarted = path.sink(client)
    assert path.write(restarted, again) == 0
    assert restarted.fences == sink.fences == {(0, month_of(T0)): 9_999, (1, month_of(T0)): 9_999}
    # repeats inside one batch (the producer published a record twice) count once
    twice = batch(range(10_000, 10_010)) * 2
    assert path.write(restarted, twice) == 10
    assert totals(client)[0::2] == (20_010, 20_010)
    _assert_rollups_equal_usage_events(client)


def test_fences_are_per_month_so_a_half_committed_insert_is_completed(
    client: Any, path: WritePath
) -> None:
    """One INSERT spanning two months is two parts, committed one after the other.

    Simulate a crash between the two commits: only the January rows (which carry
    the highest offsets) are stored. A per-partition max would skip the February
    rows; the per-(partition, month) fences store them.
    """
    jan = datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    feb = datetime(2026, 2, 1, 0, 30, tzinfo=UTC)
    records = [priced(o, occurred_at=feb if o < 50 else jan) for o in range(100)]
    path.write(path.sink(client), [r for r in records if r["source_offset"] >= 50])
    restarted = path.sink(client)
    assert path.write(restarted, records) == 50
    assert totals(client)[0::2] == (100, 100)
    assert restarted.fences == {(0, 202601): 99, (0, 202602): 49}


# -- the flush order (aggregator/sink/README.md) ------------------------------------


def test_a_failed_insert_leaves_the_fences_and_the_retried_batch_lands_once(
    client: Any, path: WritePath
) -> None:
    flaky: Any = FlakyClient(client)
    sink = path.sink(flaky)
    path.write(sink, batch(range(0, 100)))
    fences_before = sink.fences
    flaky.fail = "before"  # e.g. connection refused

    with pytest.raises(SinkUnavailable) as info:
        path.write(sink, batch(range(100, 200)))
    assert info.value.retriable and isinstance(info.value, SpendbusError)
    assert sink.fences == fences_before  # step 2 did not happen
    assert sink.pending == 100
    assert totals(client)[0] == 100

    assert path.write(sink, batch(range(100, 200))) == 100  # the caller retries the same batch
    assert sink.fences == {(0, month_of(T0)): 199}
    assert sink.pending == 0
    assert totals(client)[0::2] == (200, 200)


def test_an_insert_that_failed_after_landing_is_retried_once_down_to_the_rollups(
    client: Any, path: WritePath
) -> None:
    flaky: Any = FlakyClient(client, fail="after")  # e.g. an HTTP timeout after the commit
    sink = path.sink(flaky)
    with pytest.raises(SinkUnavailable):
        path.write(sink, batch(range(0, 500), partitions=2))
    assert sink.fences == {} and sink.pending == 1_000
    assert totals(client)[0] == 1_000  # it did land
    assert path.write(sink, batch(range(0, 500), partitions=2)) == 1_000  # sent again, same token
    assert totals(client)[0::2] == (1_000, 1_000)
    assert scalar(client, "SELECT sum(events) FROM spend_hourly") == 1_000
    _assert_rollups_equal_usage_events(client)


def test_a_view_failing_after_the_table_part_committed_is_completed_by_the_retry(
    client: Any, path: WritePath
) -> None:
    """ClickHouse commits the usage_events part before the views: a failing view
    leaves the table written and the rollups not. The retry (same rows, same
    token) is dropped by the table and fills the views, once."""
    client.command("ALTER TABLE spend_daily ADD CONSTRAINT broken CHECK events < 0")
    sink = path.sink(client)
    with pytest.raises(SinkRejected) as info:
        path.write(sink, batch(range(0, 300)))
    assert not info.value.retriable
    assert totals(client)[0] == 300
    assert scalar(client, "SELECT count() FROM spend_daily") == 0
    client.command("ALTER TABLE spend_daily DROP CONSTRAINT broken")
    assert path.write(sink, batch(range(0, 300))) == 300
    assert totals(client)[0::2] == (300, 300)
    assert scalar(client, "SELECT sum(events) FROM spend_daily") == 300
    assert scalar(client, "SELECT sum(events) FROM spend_hourly") == 300
    _assert_rollups_equal_usage_events(client)


@pytest.mark.parametrize("crash_after_step", [0, 1, 2])
def test_a_crash_at_any_flush_step_then_redelivery_stores_each_event_once(
    client: Any, path: WritePath, crash_after_step: int
) -> None:
    """Steps: 1. insert rows, 2. advance the fences, 3. commit the Kafka offsets.

    A crash (the process dies: the in-memory fences and pending insert are lost)
    after step 0, 1 or 2 means the offsets were not committed, so Kafka
    redelivers from the last commit. Whatever the step, each event is stored once.
    """
    records = batch(range(0, 1_000), partitions=2)
    committed = 0  # Kafka: the position the next consumer starts from (as a list index)
    order: list[str] = []

    class Spy(FlakyClient):
        def write(self, send: Any, *args: Any, **kwargs: Any) -> Any:
            # step 1 runs while the fences are still where they were
            assert sink.fences == {}
            order.append("insert")
            if crash_after_step == 0:
                raise SystemExit("killed before the insert")
            result = send(*args, **kwargs)
            if crash_after_step == 1:
                raise SystemExit("killed between insert and fences")
            return result

    spy: Any = Spy(client)
    sink = path.sink(spy)
    try:
        path.write(sink, records)
        order.append("fences")
        assert sink.fences == {(0, month_of(T0)): 999, (1, month_of(T0)): 999}
        if crash_after_step == 2:
            raise SystemExit("killed between fences and commit")
        committed = len(records)
        order.append("commit")
    except SystemExit:
        pass
    assert order == ["insert", "fences"][: max(1, crash_after_step)]
    assert committed == 0

    # a new process: fresh sink, Kafka redelivers everything after the commit
    restarted = path.sink(client)
    path.write(restarted, records[committed:])
    assert totals(client)[0::2] == (2_000, 2_000)
    _assert_rollups_equal_usage_events(client)


def test_forget_makes_a_reassigned_partition_read_its_fences_again(
    client: Any, path: WritePath
) -> None:
    """Rebalance: partition 0 moves from worker A to B and back. B's fences were
    read before A wrote more; A's before B did. forget() on revocation makes
    each read the fences again when the partition comes back."""
    a, b = path.sink(client), path.sink(client)
    path.write(a, batch(range(0, 100)))
    path.write(b, batch(range(0, 100)))  # B held it once: fence 99
    path.write(a, batch(range(100, 300)))  # A wrote up to 299, committed Kafka up to 200
    b.forget([0])  # ...B was told when it lost it
    assert path.write(b, batch(range(200, 400))) == 100  # B resumes from the commit at 200
    a.forget([0])
    assert path.write(a, batch(range(350, 450))) == 50
    assert totals(client)[0::2] == (450, 450)


def test_a_rollup_that_missed_rows_is_seen_and_rebuilt_from_usage_events(
    client: Any, path: WritePath
) -> None:
    sink = path.sink(client)
    path.write(sink, batch(range(0, 200), partitions=3))
    client.command(
        "ALTER TABLE spend_daily DELETE WHERE org_id = 'org-1' SETTINGS mutations_sync = 1"
    )
    drift = run_query(client, ROLLUP_DRIFT)[1]
    assert drift and all(table > rollup for _, table, rollup, *_ in drift)
    rollups = ["spend_hourly", "spend_daily", "spend_daily_by_dimension"]
    assert rebuild_rollups(client) == rollups
    assert rebuild_rollups(client) == rollups  # twice: same result
    _assert_rollups_equal_usage_events(client)
    path.write(sink, batch(range(200, 300), partitions=3))  # the views go on from there
    _assert_rollups_equal_usage_events(client)


def test_an_unknown_table_is_not_retriable(client: Any, path: WritePath) -> None:
    client.command("DROP TABLE usage_events")
    with pytest.raises(SinkRejected):
        path.write(path.sink(client), batch(range(3)))


# -- budget_state -------------------------------------------------------------------
