"""Forecasts (issue 23): the burn over the trailing window and the projected exhaustion,
by event time. The formula by hand, the fold's buckets whatever the arrival order, the
verdict carrying both, and the fold's forecast alert once per (counter, period)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.fold import CounterState, apply
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from aggregator.counting.verdict_codec import encode_verdict
from schemas.budgets import budgets_from_yaml
from schemas.codec import ALERT, USAGE_EVENT, VERDICT
from schemas.forecast import (
    FORECAST_BUCKET_US,
    FORECAST_HORIZON_US,
    Burn,
    burn_of,
    exhausts_at_us,
    forecast_alert_due,
)
from schemas.ids import counter_key
from schemas.periods import to_micros
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.records import Alert, UsageEvent
from schemas.usage import new_usage_event

DAY, MONTH, TOTAL, ROLLING = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: day, scope: org, window: day, limit_usd: "10", limit_tokens: 1000000}
- {id: month, scope: org, window: month, limit_usd: "100", alert_at: [0.5]}
- {id: total, scope: org, window: total, limit_requests: 1000}
- {id: rolling, scope: org, window: "rolling:1h", limit_usd: "1"}
"""
    )
)
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)  # a Thursday, 09:00 UTC
HOUR = 3_600_000_000
PRICES = price_table_from_yaml(
    yaml.safe_load(
        """
version: "f-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
"""
    ),
    source="test",
)


def event(minutes: float, i: int = 0) -> dict[str, Any]:
    return {
        "occurred_at": T0 + timedelta(minutes=minutes),
        "outcome": "allowed",
        "input_tokens": 1000,
        "output_tokens": 100,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "event_id": f"e{i}",
    }


def test_the_burn_and_the_projection_by_hand() -> None:
    as_of = to_micros(T0) + 30 * 60_000_000  # 09:30
    # buckets of 5 minutes: 08:55 (out of the hour ending 09:30's bucket), 09:00 .. 09:30
    first = (as_of // FORECAST_BUCKET_US) - 11  # 08:35's bucket
    buckets = {first - 1: [7, 7, 7], first: [1, 10, 1], first + 11: [2, 20, 1]}
    burn = burn_of(buckets, as_of, None)
    assert burn == Burn(3, 30, 2, as_of - first * FORECAST_BUCKET_US, as_of)
    assert burn.span_us == 55 * 60_000_000  # 08:35 .. 09:30
    # the period began at 09:00: the window starts there
    burn = burn_of(buckets, as_of, to_micros(T0))
    assert burn.span_us == 30 * 60_000_000
    # $3 burnt in 30 minutes, $4 spent of $10: the remaining $6 last an hour
    usd = 10**9
    burn = Burn(3 * usd, 0, 0, 30 * 60_000_000, as_of)
    assert exhausts_at_us(burn, (4 * usd, 0, 0), (10 * usd, None, None)) == as_of + HOUR
    # the earliest limit wins: 30 requests in 30 minutes, 10 of 40 left → 10 minutes
    burn = Burn(3 * usd, 0, 30, 30 * 60_000_000, as_of)
    at = exhausts_at_us(burn, (4 * usd, 0, 30), (10 * usd, None, 40))
    assert at == as_of + 10 * 60_000_000
    # rounded up to the µs, never before the limit is reached
    burn = Burn(3, 0, 0, 10, as_of)
    assert exhausts_at_us(burn, (0, 0, 0), (1, None, None)) == as_of + 4  # 10/3 → 4
    # none: no limit, nothing burnt, exhausted already, beyond the horizon
    assert exhausts_at_us(burn, (0, 0, 0), (None, None, None)) is None
    assert exhausts_at_us(Burn(0, 0, 0, 10, as_of), (0, 0, 0), (5, None, None)) is None
    assert exhausts_at_us(burn, (5, 0, 0), (5, None, None)) is None
    far = Burn(1, 0, 0, HOUR, as_of)
    assert exhausts_at_us(far, (0, 0, 0), (FORECAST_HORIZON_US, None, None)) is None
    # at least one bucket of span: a period's first event projects no infinite rate
    assert burn_of({as_of // FORECAST_BUCKET_US: [1, 1, 1]}, as_of, as_of).span_us == (
        FORECAST_BUCKET_US
    )
    assert forecast_alert_due(5, 6) and not forecast_alert_due(6, 6)
    assert not forecast_alert_due(None, 6) and not forecast_alert_due(5, None)


def _fold(events: list[dict[str, Any]], order: list[int]) -> CounterState:
    state = CounterState()
    for n in order:  # one source partition each: no fence skips an event that came late
        apply(state, DAY, events[n], 1_000_000 * (n + 1), n, 0)
    return state


@settings(max_examples=150, deadline=None)
@given(
    minutes=st.lists(st.floats(0, 14 * 60, allow_nan=False), min_size=1, max_size=40),
    seed=st.integers(0, 2**32),
)
def test_the_fold_keeps_the_same_buckets_whatever_the_arrival_order(
    minutes: list[float], seed: int
) -> None:
    """The trailing buckets, hence the burn and the forecast, are those of a fold in time
    order however the events arrive (a replay decides alike)."""
    events = [event(m, i) for i, m in enumerate(minutes)]
    by_time = sorted(range(len(events)), key=lambda n: events[n]["occurred_at"])
    shuffled = list(range(len(events)))
    random.Random(seed).shuffle(shuffled)
    ordered, arrived = _fold(events, by_time), _fold(events, shuffled)
    assert arrived.to_json() == ordered.to_json()
    # and the buckets hold exactly the events of the hour up to the newest one
    totals = ordered.periods[ordered.period]
    first = totals.as_of_us // FORECAST_BUCKET_US - 11
    expected: dict[int, int] = {}
    for n, e in enumerate(events):
        index = to_micros(e["occurred_at"]) // FORECAST_BUCKET_US
        if index >= first:
            expected[index] = expected.get(index, 0) + 1_000_000 * (n + 1)
    assert {b: v[0] for b, v in totals.buckets.items()} == expected
    emitted = to_micros(T0)
    assert encode_verdict(DAY, "k", ("acme",), arrived, emitted) == encode_verdict(
        DAY, "k", ("acme",), ordered, emitted
    )


def test_the_verdict_carries_the_burn_and_the_projection() -> None:
    # $1 every 6 minutes from 09:00 to 09:54 (10 events): $10 a day runs out at 10:00
    state = CounterState()
    for i in range(10):
        apply(state, DAY, event(6 * i, i), 1_000_000_000, 0, i)
    verdict = VERDICT.decode(encode_verdict(DAY, "k", ("acme",), state, to_micros(T0)))
    as_of = T0 + timedelta(minutes=54)
    assert verdict["burn_nanos"] == 10 * 10**9 and verdict["burn_requests"] == 10
    # the window starts at 08:55 (12 buckets up to 09:50's), after the day's 00:00
    assert verdict["burn_span_us"] == 59 * 60_000_000
    assert verdict["exhausts_at"] is None  # $10 spent of $10: exceeded, not forecast
    assert verdict["state"] == "exceeded" and verdict["as_of"] == as_of
    # nine events: $9 of $10, at $9 over the 58 minutes from 08:50 to 09:48
    state = CounterState()
    for i in range(9):
        apply(state, DAY, event(6 * i, i), 1_000_000_000, 0, i)
    verdict = VERDICT.decode(encode_verdict(DAY, "k", ("acme",), state, to_micros(T0)))
    span = 58 * 60_000_000
    assert verdict["burn_span_us"] == span
    expected = to_micros(T0 + timedelta(minutes=48)) + -(-(10**9) * span // (9 * 10**9))
    exhausts_at = verdict["exhausts_at"]
    assert exhausts_at is not None and to_micros(exhausts_at) == expected
    # a total window has a forecast (no period start); a rolling one none
    state = CounterState()
    apply(state, TOTAL, event(0), 1, 0, 0)
    verdict = VERDICT.decode(encode_verdict(TOTAL, "k", ("acme",), state, to_micros(T0)))
    assert verdict["burn_requests"] == 1 and verdict["exhausts_at"] is not None
    state = CounterState()
    apply(state, ROLLING, event(0), 1, 0, 0)
    verdict = VERDICT.decode(encode_verdict(ROLLING, "k", ("acme",), state, to_micros(T0)))
    assert verdict["burn_nanos"] is None and verdict["exhausts_at"] is None


def _reference() -> Reference:
    ref = Reference()
    ref.prices = PriceBook(PRICES if isinstance(PRICES, list) else [PRICES])
    ref.budgets = {b.budget_id: b for b in (DAY, MONTH)}
    return ref


def _usage(i: int, minutes: float, output_tokens: int) -> UsageEvent:
    return new_usage_event(
        event_id=f"u{i}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-a",
        org_id="acme",
        gateway_id="gw",
        input_tokens=1000,
        output_tokens=output_tokens,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def test_the_fold_sends_a_forecast_alert_once_per_counter_and_period() -> None:
    """Without a store the fold's own forecast alert goes out: once, when the projection
    falls before the period's end, and again in the next period only."""
    processor = BatchProcessor(_reference(), source_topic="usage.raw")
    day_key = counter_key("day", ("acme",))
    counters: dict[str, Any] = {}
    seen: dict[str, Any] = {}

    def run(events: list[UsageEvent], start: int) -> list[Alert]:
        batch = [
            RawRecord(0, start + n, b"acme", USAGE_EVENT.encode(e)) for n, e in enumerate(events)
        ]
        out = processor.process(
            batch, lambda p, k: counters.get(k), lambda p, k: seen.get(k), now=T0 + timedelta(2)
        )
        counters.update({k: v for (_, k), v in out.counter_writes.items()})
        seen.update({k: v for (_, k), v in out.seen_writes.items()})
        return [ALERT.decode(v) for k, v in out.alerts if k == day_key.encode()]

    # $0.0045 an event: one an hour projects nothing before the day's end ($10)
    assert run([_usage(0, 0, 100)], 0) == []
    # ~$1.5 a call every minute: $10 runs out within the day → one forecast alert
    alerts = run([_usage(i, i, 100_000) for i in range(1, 5)], 1)
    assert [(a["kind"], a["alert_id"]) for a in alerts] == [
        ("forecast", f"forecast|{day_key}|d:2026-12-03")
    ]
    exhausts_at = alerts[0]["exhausts_at"]
    assert exhausts_at is not None and T0 < exhausts_at < datetime(2026, 12, 4, tzinfo=UTC)
    assert alerts[0]["limit_nanos"] == 10 * 10**9
    # more of the same: no second one in this period (the mark is in the counter's value)
    assert [a["kind"] for a in run([_usage(i, i, 100_000) for i in range(5, 7)], 5)] == []
    # the next day: a forecast alert of that period
    alerts = run([_usage(9, 24 * 60 + 1, 100_000), _usage(10, 24 * 60 + 2, 100_000)], 9)
    assert [a["alert_id"] for a in alerts if a["kind"] == "forecast"] == [
        f"forecast|{day_key}|d:2026-12-04"
    ]
