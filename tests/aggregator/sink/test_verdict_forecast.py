"""Verdict v2 (the forecast) in budget_state: the columns of ddl/010, filled from v2
verdicts on both insert paths, NULL from the v1 records the released aggregator wrote
(verdict_v1_kit.py), alone or in one batch with v2 ones."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aggregator.counting.fold import CounterState, apply
from aggregator.counting.verdict_codec import encode_verdict
from aggregator.sink import ClickHouseSink
from schemas.budgets import budgets_from_yaml
from schemas.codec import VERDICT
from schemas.periods import to_micros
from tests.aggregator.sink.kit import Message
from tests.verdict_v1_kit import DAILY_KEY, DAILY_V1, ROLLING_KEY, ROLLING_V1

DAILY = budgets_from_yaml(
    [{"id": "acme-daily", "scope": "org", "window": "day", "limit_usd": "10"}]
)[0]
FORECAST = "burn_nanos, burn_tokens, burn_requests, burn_span_us, exhausts_at"


def v2_daily() -> bytes:
    """The same counter as DAILY_V1 folded by this aggregator: a v2 verdict (seq 4)."""
    state = CounterState()
    for i, minute in enumerate((0, 10, 20, 30)):
        event = {
            "occurred_at": datetime(2026, 12, 3, 10, minute, tzinfo=UTC),
            "outcome": "allowed",
            "input_tokens": 100,
            "output_tokens": 50,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        }
        apply(state, DAILY, event, 2_000_000_000, 0, i)
    emitted = to_micros(datetime(2026, 12, 3, 10, 31, tzinfo=UTC))
    return encode_verdict(DAILY, DAILY_KEY, ("acme",), state, emitted)


def rows(client: Any) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in client.query(
            f"SELECT counter_key, seq, {FORECAST} FROM budget_state ORDER BY counter_key, seq"
        ).result_rows
    ]


def test_v1_verdicts_store_null_forecasts_beside_v2_ones(client: Any) -> None:
    v2 = v2_daily()
    decoded = VERDICT.decode(v2)
    # $8 by 10:30 at $8 over 09:35..10:30 (55 min): $2 left last 13m45s
    assert decoded["burn_nanos"] == 8 * 10**9 and decoded["burn_span_us"] == 55 * 60_000_000
    assert decoded["exhausts_at"] == datetime(2026, 12, 3, 10, 43, 45, tzinfo=UTC)
    sink = ClickHouseSink(client, avro_inserts=True)
    # v1 alone (decoded: not the current schema), then v2 alone (the engine decodes it)
    assert sink.write_verdict_messages([Message(DAILY_V1), Message(ROLLING_V1)]) == 2
    assert sink.write_verdict_messages([Message(v2)]) == 1
    # and one batch of both, on the rows path
    assert (
        ClickHouseSink(client, avro_inserts=False).write_verdict_messages(
            [Message(ROLLING_V1), Message(v2)]
        )
        == 2
    )
    exhausts = datetime(2026, 12, 3, 10, 43, 45, tzinfo=UTC)
    stored = [
        (k, s, n, t, r, sp, None if e is None else e.astimezone(UTC))
        for k, s, n, t, r, sp, e in rows(client)
    ]
    burn = (8 * 10**9, 600, 4, 55 * 60_000_000, exhausts)
    assert stored == [
        (DAILY_KEY, 3, None, None, None, None, None),
        (DAILY_KEY, 4, *burn),
        (DAILY_KEY, 4, *burn),
        (ROLLING_KEY, 3, None, None, None, None, None),
        (ROLLING_KEY, 3, None, None, None, None, None),
    ]
    # the live forecast per counter, as ddl/010 shows it
    live = client.query(
        "SELECT counter_key, argMax(exhausts_at, seq) FROM budget_state GROUP BY counter_key "
        "ORDER BY counter_key"
    ).result_rows
    assert [(k, None if e is None else e.astimezone(UTC)) for k, e in live] == [
        (DAILY_KEY, exhausts),
        (ROLLING_KEY, None),
    ]


def test_a_pruned_counters_tombstone_stores_nothing_on_either_insert_path(client: Any) -> None:
    """The counting stage prunes a counter with a tombstone on budget.verdicts
    (aggregator/counting/pruning.py): budget_state keeps the states it had."""
    v2 = v2_daily()
    tombstone = Message(None)
    for avro in (True, False):
        sink = ClickHouseSink(client, avro_inserts=avro)
        assert sink.write_verdict_messages([Message(v2), tombstone]) == 1
        assert sink.write_verdict_messages([tombstone]) == 0
    assert [(k, s) for k, s, *_ in rows(client)] == [(DAILY_KEY, 4), (DAILY_KEY, 4)]
