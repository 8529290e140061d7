"""Budget history and alerts in ClickHouse, exact however events arrive (issue 17).

The fold (BatchProcessor) and the sink (ClickHouseSink) on the real embedded engine; no
broker: the property below folds random arrival orders, duplicates, re-deliveries and
future-dated events and compares ``budget_history`` and ``alerts`` with a brute-force
recomputation (tests/budget_oracle.py).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.alerts.publisher import alerts_found
from aggregator.counting.priced import CountEntry, PricedWriter
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from aggregator.replay.verify import VerifyReport, compare_history
from aggregator.sink import ClickHouseSink, apply_schema, open_client
from schemas.budgets import applicable, budgets_from_yaml
from schemas.codec import ALERT, PRICED_USAGE, USAGE_EVENT, priced_usage_from_raw
from schemas.periods import MAX_FUTURE_SKEW_SECONDS, period_key
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.records import UsageEvent
from schemas.topics import usage_raw_key
from schemas.usage import new_usage_event
from tests.budget_oracle import (
    alert_ids,
    comparable,
    counted_events,
    history,
    stored_alerts,
    stored_history,
)

README = Path(__file__).resolve().parents[2] / "infra" / "clickhouse" / "README.md"
PRICES = price_table_from_yaml(
    yaml.safe_load(
        """
version: "h-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
  - {match: gpt-4o-mini, input_per_mtok: "0.15", output_per_mtok: "0.60"}
"""
    ),
    source="test",
)
BUDGETS = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: org-day, scope: org, window: day, limit_tokens: 40000, alert_at: [0.5, 1.0]}
- {id: secret-week, scope: secret, window: week, limit_usd: "0.2", alert_at: [0.25, 0.5, 0.75, 1.0]}
- {id: org-month, scope: org, window: month, limit_usd: "0.5", alert_at: [0.8, 1.0]}
- {id: org-total, scope: org, window: total, limit_requests: 30, alert_at: [0.5], count_denied: true}
- {id: org-rolling, scope: org, window: "rolling:2h", limit_usd: "0.05", alert_at: [0.5, 1.0]}
"""
    )
)
T0 = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
#: the worker's clock: after every honest event (three weeks after T0)
NOW = T0 + timedelta(days=21)
SKEW = timedelta(seconds=MAX_FUTURE_SKEW_SECONDS)
_databases = itertools.count()


def price_book() -> PriceBook:
    return PriceBook(PRICES if isinstance(PRICES, list) else [PRICES])


def reference() -> Reference:
    ref = Reference()
    ref.prices = price_book()
    ref.budgets = {b.budget_id: b for b in BUDGETS}
    return ref


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = f"chdb://{tmp_path_factory.mktemp('history')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


def fresh_database(engine: str) -> Any:
    admin = open_client(engine)
    name = f"h{next(_databases)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    client = open_client(engine, database=name)
    apply_schema(client)
    return client


class Worker:
    """The fold's two tables per partition and a sink, as the counting stage and the sink
    agents keep them (values written back after each batch)."""

    def __init__(self, client: Any) -> None:
        self.counters: dict[tuple[int, str], Any] = {}
        self.seen: dict[tuple[int, str], Any] = {}
        self.processor = BatchProcessor(reference(), source_topic="usage.raw")
        self.sink = ClickHouseSink(client)

    def fold(self, batch: list[RawRecord]) -> Any:
        out = self.processor.process(
            batch,
            lambda p, k: self.counters.get((p, k)),
            lambda p, k: self.seen.get((p, k)),
            now=NOW,
        )
        self.counters.update(out.counter_writes)
        self.seen.update(out.seen_writes)
        self.sink.write([PRICED_USAGE.decode(value) for _, _, value, _ in out.priced])
        return out


def usage(i: int, org: str, secret: str, minutes: int, model: str, **over: Any) -> UsageEvent:
    fields: dict[str, Any] = dict(
        event_id=f"ev-{i}",
        provider="anthropic",
        api="anthropic-messages",
        model=model,
        secret_id=secret,
        org_id=org,
        gateway_id="gw",
        input_tokens=1000 + 37 * i,
        output_tokens=100 + 11 * i,
        occurred_at=T0 + timedelta(minutes=minutes),
    )
    fields.update(over)
    return new_usage_event(**fields)


EVENT = st.tuples(
    st.integers(0, 60),  # event id: a repeat is a duplicate publish of the same payload
    st.sampled_from(["acme", "globex"]),
    st.sampled_from(["sk-a", "sk-b"]),
    st.integers(0, 60 * 24 * 20),  # minutes after T0: days, weeks, a month boundary
    st.sampled_from(["claude-sonnet-4-5", "gpt-4o-mini", "mystery-model-1"]),
    st.sampled_from(["allowed", "allowed", "allowed", "refused"]),
    st.booleans() | st.just(False),  # from the future (weighted towards honest events)
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(EVENT, min_size=1, max_size=70), st.integers(1, 9), st.data())
def test_history_and_alerts_equal_a_brute_force_recomputation(
    engine: str, raw: list[Any], batch_size: int, data: st.DataObject
) -> None:
    payloads: dict[int, UsageEvent] = {}
    for i, org, secret, minutes, model, outcome, future in raw:
        if i in payloads:
            continue  # the same id always carries the same payload
        when: dict[str, Any] = (
            {"occurred_at": NOW + SKEW + timedelta(minutes=minutes + 1)} if future else {}
        )
        fields = (
            {"outcome": outcome, "input_tokens": 0, "output_tokens": 0}
            if outcome != "allowed"
            else {}
        )
        if outcome != "allowed":
            fields.update(decision="budget_exceeded", status_code=402)
        payloads[i] = usage(i, org, secret, 0 if future else minutes, model, **when, **fields)
    publishes = [payloads[i] for i, *_ in raw]
    order = data.draw(st.permutations(range(len(publishes))))
    published = [publishes[n] for n in order]
    # usage.raw is keyed by org: one partition per org, offsets in publish order
    offsets = {"acme": 0, "globex": 0}
    records = []
    for e in published:
        partition = 0 if e["org_id"] == "acme" else 1
        records.append(
            RawRecord(
                partition, offsets[e["org_id"]], usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e)
            )
        )
        offsets[e["org_id"]] += 1
    client = fresh_database(engine)
    try:
        worker = Worker(client)
        for start in range(0, len(records), batch_size):
            chunk = records[start : start + batch_size]
            worker.fold(chunk)
            if data.draw(st.booleans()):  # a crash before the commit: delivered again
                if data.draw(st.booleans()):
                    worker.processor = BatchProcessor(reference(), source_topic="usage.raw")
                worker.fold(chunk)
        counted = counted_events([(e, NOW) for e in published], SKEW)
        expected = history(counted, BUDGETS, price_book())
        assert comparable(stored_history(client)) == comparable(expected)
        alerts = stored_alerts(client)
        assert len(alerts) == len(set(alerts))  # each alert once
        assert set(alerts) == alert_ids(expected, counted, price_book())
    finally:
        client.close()


def test_late_events_beyond_the_periods_in_memory_are_exact(engine: str) -> None:
    """A daily budget folded newest day first: the fold keeps 4 periods, ClickHouse all."""
    client = fresh_database(engine)
    try:
        worker = Worker(client)
        events = [
            usage(i, "acme", "sk-a", 60 * 24 * (19 - i), "claude-sonnet-4-5") for i in range(20)
        ]
        worker.fold(
            [
                RawRecord(0, n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
                for n, e in enumerate(events)
            ]
        )
        stored = stored_history(client)
        days = {period for key, period in stored if period.startswith("d:")}
        assert len(days) == 20
        assert comparable(stored) == comparable(history(events, BUDGETS, price_book()))
    finally:
        client.close()


def test_the_documented_query_reads_budget_x_scope_y_november(engine: str) -> None:
    """The analyst's query of infra/clickhouse/README.md, as written there."""
    text = README.read_text()
    block = re.search(r"### Budget X, scope Y, November.*?```sql\n(.*?)```", text, re.S)
    assert block is not None, "the README lost its budget-history query"
    client = fresh_database(engine)
    try:
        worker = Worker(client)
        events = [
            usage(i, "acme", "sk-a", 60 * 24 * d, "claude-sonnet-4-5")
            for i, d in enumerate([1, 3, 9, 10, 12])  # Nov 21 ... Dec 2
        ]
        worker.fold(
            [
                RawRecord(0, n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
                for n, e in enumerate(events)
            ]
        )
        result = client.query(
            block.group(1),
            parameters={"budget": "org-month", "scope": ["acme"], "period": "m:2026-11"},
        )
        assert result.column_names[:4] == (
            "spent_nanos",
            "spent_usd",
            "spent_tokens",
            "spent_requests",
        )
        (row,) = result.result_rows
        november = [e for e in events if e["occurred_at"].month == 11]
        expected = history(november, BUDGETS, price_book())[("9:org-month,4:acme,", "m:2026-11")]
        assert row[0] == expected.spent_nanos and row[2] == expected.spent_tokens
        assert row[3] == len(november) and row[4] == expected.state
    finally:
        client.close()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(BUDGETS),
            st.text(min_size=1, max_size=12),
            st.lists(st.text(max_size=8), max_size=3),
            st.integers(-(2**40), 2**40),
            st.integers(0, 1),
        ),
        max_size=5,
    ),
    st.integers(0, 2**62),
)
def test_priced_bytes_with_counts_equal_the_codec(entries: list[Any], offset: int) -> None:
    raw = USAGE_EVENT.encode(usage(1, "acme", "sk-a", 0, "claude-sonnet-4-5"))
    counts = [
        CountEntry(budget, key, tuple(values), "m:2026-11", bucket, requests)
        for budget, key, values, bucket, requests in entries
    ]
    mine = PricedWriter(T0).write(raw, 5, "h-1", "claude-sonnet-4", False, 2, offset, counts)
    tail = {
        "cost_nanos": 5,
        "price_version": "h-1",
        "price_match": "claude-sonnet-4",
        "unpriced": False,
        "source_partition": 2,
        "source_offset": offset,
        "priced_at": T0,
        "counts": [c.record for c in counts],
    }
    assert mine == priced_usage_from_raw(raw, tail)
    assert PRICED_USAGE.decode(mine)["counts"] == [c.record for c in counts]  # type: ignore[arg-type]  # the writer's bytes, never None here


def test_verify_compares_every_period_with_budget_history() -> None:
    report = VerifyReport(
        history={
            ("k1", "m:2026-11"): (10, 20, 1, 1),
            ("k1", "m:2026-10"): (5, 5, 1, 1),
            ("k2", "t"): (7, 7, 2, 2),
        }
    )
    rows = [
        ["k1", "m:2026-11", 10, 20, 1, 1],
        ["k1", "m:2026-10", 4, 5, 1, 1],  # ClickHouse is short in October
        ["k3", "d:2026-11-02", 1, 1, 1, 1],  # a period the ledger does not have
    ]
    compare_history(report, rows)
    assert report.periods_compared == 3
    assert [
        (d.counter_key, d.period, d.field, d.recomputed, d.live) for d in report.differences
    ] == [
        ("k1", "m:2026-10", "spent_nanos", 5, 4),
        ("k2", "t", "history", "present", "missing"),
        ("k3", "d:2026-11-02", "history", "missing", "present"),
    ]


def test_the_alert_publisher_finds_each_alert_of_what_changed(engine: str) -> None:
    """alerts_found on the real engine: everything at first, then only the (counter,
    period)s and models that received events since the previous poll, late ones included."""
    client = fresh_database(engine)

    async def read(sql: str) -> Any:
        return client.query(sql).result_rows

    try:
        worker = Worker(client)
        # November: acme's org-month crosses 0.8 and 1.0 ($0.5 at ~$0.02 an event), and an
        # enforcer refuses acme's requests for secret-week (twice: one alert)
        refusal = {"outcome": "refused", "input_tokens": 0, "output_tokens": 0}
        november = [usage(i, "acme", "sk-a", 60 * i, "claude-sonnet-4-5") for i in range(40)] + [
            usage(
                41 + i,
                "acme",
                "sk-a",
                60 * 40 + i,
                "claude-sonnet-4-5",
                **refusal,
                decision="budget_exceeded",
                decision_budget_id="secret-week",
            )
            for i in range(2)
        ]
        worker.fold(
            [
                RawRecord(0, n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
                for n, e in enumerate(november)
            ]
        )
        first = asyncio.run(alerts_found(read, None))
        ids = [alert["alert_id"] for _, alert in first]
        assert len(ids) == len(set(ids))
        assert set(ids) == alert_ids(
            history(november, BUDGETS, price_book()), november, price_book(), BUDGETS
        )
        (exhausted,) = [alert for _, alert in first if alert["kind"] == "exhausted"]
        assert exhausted["budget_id"] == "secret-week" and exhausted["threshold"] == 1.0
        (since,) = client.query("SELECT toUnixTimestamp64Milli(now64(3))").result_rows[0]
        time.sleep(0.01)
        # later: globex spends in December, and one unpriced event of acme arrives late
        late = [
            usage(100 + i, "globex", "sk-b", 60 * 24 * 12 + i, "claude-sonnet-4-5")
            for i in range(40)
        ] + [usage(200, "acme", "sk-a", 5, "mystery-model-1")]
        worker.fold(
            [
                RawRecord(1, n, usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e))
                for n, e in enumerate(late)
            ]
        )
        recent = {alert["alert_id"] for _, alert in asyncio.run(alerts_found(read, since))}
        both = november + late
        everything = {alert["alert_id"] for _, alert in asyncio.run(alerts_found(read, None))}
        assert everything == alert_ids(
            history(both, BUDGETS, price_book()), both, price_book(), BUDGETS
        )
        # exactly the alerts of the (counter, period)s the late events touched: acme's
        # November ones again (the publisher drops ids it sent), globex's December ones
        touched = {
            (key, period_key(budget.window, e["occurred_at"]))
            for e in late
            for budget, key, _ in applicable(BUDGETS, e)
        }
        assert recent == {
            i
            for i in everything
            if i.startswith("unpriced|") or tuple(i.rsplit("|", 2)[:2]) in touched
        }
        assert "unpriced|mystery-model-1" in recent and recent < everything
        messages = [ALERT.decode(ALERT.encode(alert)) for _, alert in first]  # valid Alerts
        assert {m["kind"] for m in messages} == {"threshold", "exhausted"}
    finally:
        client.close()
