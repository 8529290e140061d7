"""Forecast alerts from ClickHouse's record (aggregator/alerts/forecasts.py) on the real
engine: the alert publisher finds, over the stored events, exactly the counters whose
fold ends with a projection before their period's end, at the same instant, however the
events arrived; a raise in force at the newest event moves the projection."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from aggregator.alerts.publisher import alerts_found
from aggregator.counting.fold import CounterState
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from aggregator.counting.verdict_codec import period_bounds_us
from aggregator.sink import ClickHouseSink, apply_schema, open_client
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_RAISE, PRICED_USAGE, USAGE_EVENT, VERDICT
from schemas.forecast import forecast_alert_id
from schemas.periods import to_micros
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.raises import BudgetRaise
from schemas.records import UsageEvent, Verdict
from schemas.topics import usage_raw_key
from schemas.usage import new_usage_event
from tests.budget_oracle import forecast_alert_ids

PRICES = price_table_from_yaml(
    yaml.safe_load(
        """
version: "fa-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
"""
    ),
    source="test",
)
BUDGETS = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: org-day, scope: org, window: day, limit_usd: "2", alert_at: [0.5]}
- {id: secret-week, scope: secret, window: week, limit_tokens: 3000000}
- {id: org-month-ny, scope: org, window: month, timezone: America/New_York, limit_usd: "40"}
- {id: org-total, scope: org, window: total, limit_requests: 50}
- {id: org-rolling, scope: org, window: "rolling:1h", limit_usd: "1"}
"""
    )
)
T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=3)
_databases = itertools.count()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = f"chdb://{tmp_path_factory.mktemp('forecast')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


def fresh_client(engine: str) -> Any:
    admin = open_client(engine)
    name = f"f{next(_databases)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    client = open_client(engine, database=name)
    apply_schema(client)
    return client


def reference(*raises: BudgetRaise) -> Reference:
    ref = Reference()
    ref.prices = PriceBook(PRICES if isinstance(PRICES, list) else [PRICES])
    ref.budgets = {b.budget_id: b for b in BUDGETS}
    for r in raises:
        ref.apply_raise(r.raise_id.encode(), BUDGET_RAISE.encode(r.to_record()))
    return ref


def ledger() -> list[UsageEvent]:
    """Three orgs, 40 events each: acme spends ~$0.36 an hour from 08:00 (its day and month
    run out before they end, its secrets' weeks do not), globex a cent every half hour
    (nothing runs out), initech $5.64 between 02:00 and 04:00 (its day is exhausted
    already, no forecast; its secrets' weeks and its month run out)."""
    rng = random.Random(23)
    events = []
    for i in range(120):
        org, minutes, output = (
            ("acme", 2 * i, 2_000),
            ("globex", 30 * i, 200),
            ("initech", -6 * 60 + i, 9_000),
        )[i % 3]
        events.append(
            new_usage_event(
                event_id=f"fa-{i}",
                provider="anthropic",
                api="anthropic-messages",
                model="claude-sonnet-4-5",
                secret_id=f"sk-{rng.randrange(2)}",
                org_id=org,
                gateway_id="gw",
                input_tokens=2_000,
                output_tokens=output,
                occurred_at=T0 + timedelta(minutes=minutes),
            )
        )
    return events


def fold(
    events: list[UsageEvent], ref: Reference, client: Any, batches: int
) -> dict[str, tuple[Verdict, CounterState, Any]]:
    """Folds ``events`` in ``batches`` batches (one partition, offsets in list order) into
    the counters and the store; returns each counter's last (verdict, state, budget)."""
    processor = BatchProcessor(ref, source_topic="usage.raw")
    sink = ClickHouseSink(client)
    counters: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    last: dict[str, tuple[Verdict, CounterState, Any]] = {}
    size = -(-len(events) // batches)
    for start in range(0, len(events), size):
        batch = [
            RawRecord(0, start + n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
            for n, e in enumerate(events[start : start + size])
        ]
        out = processor.process(
            batch, lambda p, k: counters.get(k), lambda p, k: seen.get(k), now=NOW
        )
        counters.update({k: v for (_, k), v in out.counter_states.items()})
        seen.update({k: v for (_, k), v in out.seen_writes.items()})
        sink.write([PRICED_USAGE.decode(value) for _, _, value, _ in out.priced])
        for key, change in out.verdict_changes.items():
            last[key] = (VERDICT.decode(change.encode(key, NOW)), change.state, change.budget)
    return last


def expected_forecasts(
    last: dict[str, tuple[Verdict, CounterState, Any]],
) -> dict[str, datetime]:
    """alert id -> exhausts_at, from the fold's final verdicts: a projection before the
    period's end (windows that end only)."""
    out = {}
    for key, (verdict, state, budget) in last.items():
        bounds = period_bounds_us(budget.window, state.period, state.periods[state.period].as_of_us)
        at = verdict["exhausts_at"]
        if bounds is not None and at is not None and to_micros(at) < bounds[1]:
            out[forecast_alert_id(key, verdict["period"])] = at
    return out


def found(client: Any, ref: Reference) -> dict[str, datetime]:
    async def read(sql: str) -> Any:
        return client.query(sql).result_rows

    alerts = asyncio.run(alerts_found(read, None, ref))
    forecasts = [a for _, a in alerts if a["kind"] == "forecast"]
    assert len({a["alert_id"] for a in forecasts}) == len(forecasts)
    return {a["alert_id"]: a["exhausts_at"].astimezone(UTC) for a in forecasts}


def test_the_store_finds_the_forecasts_the_fold_ends_with(engine: str) -> None:
    events = ledger()
    client = fresh_client(engine)
    try:
        last = fold(sorted(events, key=lambda e: e["occurred_at"]), reference(), client, 7)
        expected = expected_forecasts(last)
        # a total window never ends, a rolling one has no forecast (see ledger())
        assert sorted(i.split("|")[1] for i in expected) == [
            "11:secret-week,7:initech,4:sk-0,",
            "11:secret-week,7:initech,4:sk-1,",
            "12:org-month-ny,4:acme,",
            "12:org-month-ny,7:initech,",
            "7:org-day,4:acme,",
        ]
        assert found(client, reference()) == expected
        # and a brute-force recomputation written apart from the fold agrees
        assert set(expected) == forecast_alert_ids(events, BUDGETS, reference().prices)
    finally:
        client.close()
    # the same events arriving shuffled, in other batches: the same alerts
    shuffled = list(events)
    random.Random(5).shuffle(shuffled)
    client = fresh_client(engine)
    try:
        fold(shuffled, reference(), client, 3)
        assert found(client, reference()) == expected
    finally:
        client.close()


def test_a_raise_in_force_at_the_newest_event_moves_the_projection(engine: str) -> None:
    events = sorted(ledger(), key=lambda e: e["occurred_at"])
    granted = BudgetRaise(
        raise_id="r-acme",
        budget_id="org-day",
        scope_values=("acme",),
        mode="to",
        raise_nanos=200 * 10**9,
        raise_tokens=None,
        raise_requests=None,
        starts_at_us=to_micros(T0 - timedelta(days=1)),
        until_us=to_micros(T0 + timedelta(days=1)),
        reason="launch",
    )
    client = fresh_client(engine)
    try:
        plain = found_after(client, events, reference())
        raised_ref = reference(granted)
    finally:
        client.close()
    client = fresh_client(engine)
    try:
        last = fold(events, raised_ref, client, 4)
        raised = found(client, raised_ref)
        assert raised == expected_forecasts(last)
    finally:
        client.close()
    day = [i for i in plain if i.startswith("forecast|7:org-day,4:acme,")]
    assert day, plain
    # $200 a day: acme's burn does not run out before midnight
    assert not any(i.startswith("forecast|7:org-day,4:acme,") for i in raised)
    assert {i: at for i, at in plain.items() if i not in day} == raised


def found_after(client: Any, events: list[UsageEvent], ref: Reference) -> dict[str, datetime]:
    fold(events, ref, client, 2)
    return found(client, ref)
