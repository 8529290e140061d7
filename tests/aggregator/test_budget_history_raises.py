"""budget_history under temporary raises (ddl/011, issue 23) on the real engine: base,
raise and effective limits per (counter, period), the raise in force at its newest
event (the counter's own over a budget-wide one, a revocation honoured, none once it
ended), its state and thresholds measured against the effective limits, as the fold's
verdicts and threshold alerts measure them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from admin.access import Caller
from admin.console.history import history_sql
from aggregator.alerts.raise_audit import RaiseAudit
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from aggregator.sink import ClickHouseSink, apply_schema, open_client
from schemas.budgets import budgets_from_yaml
from schemas.codec import ALERT, BUDGET_RAISE, PRICED_USAGE, USAGE_EVENT, VERDICT
from schemas.ids import counter_key
from schemas.periods import to_micros
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.raises import BudgetRaise
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

PRICES = price_table_from_yaml(
    yaml.safe_load(
        """
version: "hr-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
"""
    ),
    source="test",
)
#: each event costs $0.0045 (1000 in, 100 out); per-secret's base limit is $0.05
(PER_SECRET,) = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: per-secret, scope: secret, window: month, limit_usd: "0.05", limit_requests: 100, alert_at: [0.5, 1.0]}
"""
    )
)
COST = 4_500_000
BASE = 50_000_000
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=1)
_databases = itertools.count()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = f"chdb://{tmp_path_factory.mktemp('history-raises')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


@pytest.fixture
def client(engine: str) -> Iterator[Any]:
    admin = open_client(engine)
    name = f"hr{next(_databases)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    ch = open_client(engine, database=name)
    apply_schema(ch)
    yield ch
    ch.close()


def a_raise(
    raise_id: str, scope: tuple[str, ...], mode: str, usd: float, hours: float
) -> BudgetRaise:
    return BudgetRaise(
        raise_id=raise_id,
        budget_id=PER_SECRET.budget_id,
        scope_values=scope,
        mode=mode,
        raise_nanos=int(usd * 1_000_000_000),
        raise_tokens=None,
        raise_requests=None,
        starts_at_us=to_micros(T0 - timedelta(hours=1)),
        until_us=to_micros(T0 + timedelta(hours=hours)),
        reason=f"test {raise_id}",
    )


def usage(i: int, secret: str, minutes: int, org: str = "acme") -> UsageEvent:
    return new_usage_event(
        event_id=f"hr-{i}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id=secret,
        org_id=org,
        gateway_id="gw",
        input_tokens=1000,
        output_tokens=100,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def test_history_shows_base_raise_and_effective_limits(client: Any) -> None:
    own = a_raise("r-own", ("acme", "sk-1"), "by", 0.05, 10)  # sk-1: $0.10 while it lasts
    wide = a_raise("r-wide", (), "to", 0.02, 10)  # every other counter: $0.02
    ended = a_raise("r-ended", ("acme", "sk-3"), "by", 1.0, 0.5)  # sk-3's ends at 09:30
    revoked = a_raise("r-revoked", ("acme", "sk-4"), "by", 1.0, 10)
    ref = Reference()
    ref.prices = PriceBook(PRICES if isinstance(PRICES, list) else [PRICES])
    ref.budgets = {PER_SECRET.budget_id: PER_SECRET}
    for r in (own, wide, ended, revoked):
        ref.apply_raise(r.raise_id.encode(), BUDGET_RAISE.encode(r.to_record()))

    async def read(sql: str) -> Any:
        return client.query(sql).result_rows

    async def insert(table: str, columns: Any, rows: list[list[Any]]) -> None:
        client.insert(table, rows, column_names=list(columns))

    audit = RaiseAudit(ref, read, insert)
    assert asyncio.run(audit.sync()) == 4
    # revoked at 09:05 (a new row of the same raise: the newest row per raise_id counts)
    gone = replace(revoked, revoked_at_us=to_micros(T0 + timedelta(minutes=5)))
    ref.apply_raise(gone.raise_id.encode(), BUDGET_RAISE.encode(gone.to_record()))
    assert asyncio.run(audit.sync()) == 1

    # 12 events each on sk-1..sk-4 between 09:00 and 09:55 ($0.054 each), sk-3's last at 09:55
    events = [usage(100 * s + i, f"sk-{s}", 5 * i) for s in (1, 2, 3, 4) for i in range(12)]
    processor = BatchProcessor(ref, source_topic="usage.raw")
    counters: dict[str, Any] = {}
    out = processor.process(
        [RawRecord(0, n, b"acme", USAGE_EVENT.encode(e)) for n, e in enumerate(events)],
        lambda p, k: counters.get(k),
        lambda p, k: None,
        now=NOW,
    )
    ClickHouseSink(client).write([PRICED_USAGE.decode(v) for _, _, v, _ in out.priced])
    rows = client.query(
        "SELECT scope_values[2], spent_nanos, base_limit_nanos, raise_id, raise_mode, "
        "raise_nanos, limit_nanos, base_limit_requests, limit_requests, state, "
        "thresholds_crossed FROM budget_history ORDER BY counter_key"
    ).result_rows
    spent = 12 * COST  # $0.054
    assert [tuple(r) for r in rows] == [
        # its own raise: $0.05 + $0.05; 54% of it: alert, 0.5 crossed (not 1.0)
        ("sk-1", spent, BASE, "r-own", "by", BASE, 2 * BASE, 100, 100, "alert", [0.5]),
        # the budget-wide one: $0.02, exceeded
        (
            "sk-2",
            spent,
            BASE,
            "r-wide",
            "to",
            20_000_000,
            20_000_000,
            100,
            100,
            "exceeded",
            [0.5, 1.0],
        ),
        # its own had ended by its newest event (09:55), the budget-wide one applies
        (
            "sk-3",
            spent,
            BASE,
            "r-wide",
            "to",
            20_000_000,
            20_000_000,
            100,
            100,
            "exceeded",
            [0.5, 1.0],
        ),
        # its own was revoked at 09:05: the budget-wide one
        (
            "sk-4",
            spent,
            BASE,
            "r-wide",
            "to",
            20_000_000,
            20_000_000,
            100,
            100,
            "exceeded",
            [0.5, 1.0],
        ),
    ]
    # the fold measured the same effective limits: its last verdicts agree (one batch:
    # a verdict carries the limits of the counter's last event in it, sk-3's after its
    # raise ended)
    for key, change in out.verdict_changes.items():
        verdict = VERDICT.decode(change.encode(key, NOW))
        secret = verdict["scope_values"][1]
        row = next(r for r in rows if r[0] == secret)
        assert (verdict["limit_nanos"], verdict["state"]) == (row[6], row[9]), secret
    # and the alerts view's threshold alerts are the fold's (each once)
    viewed = {
        r[0]
        for r in client.query("SELECT alert_id FROM alerts WHERE kind = 'threshold'").result_rows
    }
    folded = {
        ALERT.decode(v)["alert_id"] for _, v in out.alerts if ALERT.decode(v)["kind"] == "threshold"
    }
    assert viewed == folded
    assert f"{counter_key('per-secret', ('acme', 'sk-1'))}|m:2026-12|1.0" not in viewed
    # without raises the view shows the base limits as the effective ones
    client.command("TRUNCATE TABLE budget_raises")
    rows = client.query(
        "SELECT DISTINCT base_limit_nanos, raise_id, raise_nanos, limit_nanos FROM budget_history"
    ).result_rows
    assert [tuple(r) for r in rows] == [(BASE, "", None, BASE)]


def test_one_budgets_history_equals_budget_history_of_that_budget(client: Any) -> None:
    """budget_history_of (ddl/014) filters on the budget before it aggregates: its rows
    are budget_history's of that budget, every column to the nano, with raises (the
    counter's own, budget-wide) and rolling windows whose peak is not their newest
    window; the console's query reads them, fenced by org."""
    (rolling,) = budgets_from_yaml(
        yaml.safe_load(
            '- {id: org-rolling, scope: org, window: "rolling:2h", limit_usd: "0.05", '
            "limit_requests: 40, alert_at: [0.5, 1.0]}"
        )
    )
    raises = [
        a_raise("r-own", ("acme", "sk-1"), "by", 0.05, 10),
        replace(a_raise("r-rolling", (), "to", 0.1, 10), budget_id=rolling.budget_id),
    ]
    ref = Reference()
    ref.prices = PriceBook(PRICES if isinstance(PRICES, list) else [PRICES])
    ref.budgets = {b.budget_id: b for b in (PER_SECRET, rolling)}
    for r in raises:
        ref.apply_raise(r.raise_id.encode(), BUDGET_RAISE.encode(r.to_record()))

    async def read(sql: str) -> Any:
        return client.query(sql).result_rows

    async def insert(table: str, columns: Any, rows: list[list[Any]]) -> None:
        client.insert(table, rows, column_names=list(columns))

    assert asyncio.run(RaiseAudit(ref, read, insert).sync()) == 2
    # sk-1 and sk-2 busy for 2 hours, sk-3 every 20 minutes for 5: acme's rolling window
    # peaked early; globex has a counter of its own in both budgets
    events = [usage(100 * s + i, f"sk-{s}", 10 * i) for s in (1, 2) for i in range(12)]
    events += [usage(300 + i, "sk-3", 20 * i) for i in range(16)]
    globex = [usage(400 + i, "sk-9", 15 * i, org="globex") for i in range(6)]
    counters: dict[str, Any] = {}
    out = BatchProcessor(ref, source_topic="usage.raw").process(
        [RawRecord(0, n, b"acme", USAGE_EVENT.encode(e)) for n, e in enumerate(events)]
        + [RawRecord(1, n, b"globex", USAGE_EVENT.encode(e)) for n, e in enumerate(globex)],
        lambda p, k: counters.get(k),
        lambda p, k: None,
        now=NOW,
    )
    ClickHouseSink(client).write([PRICED_USAGE.decode(v) for _, _, v, _ in out.priced])

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in client.query(sql).result_rows]

    order = "ORDER BY counter_key, period"
    for budget in (PER_SECRET.budget_id, rolling.budget_id):
        whole = rows(f"SELECT * FROM budget_history WHERE budget_id = '{budget}' {order}")
        own = rows(f"SELECT * FROM budget_history_of(budget_id = '{budget}') {order}")
        assert own == whole, budget
    # what the comparison covered: both budgets, both raises, a rolling peak above its end
    covered = rows(
        "SELECT budget_id, count(), groupUniqArray(raise_id), "
        "countIf(state != 'exceeded' AND has(thresholds_crossed, 1.0)) "
        "FROM budget_history GROUP BY budget_id ORDER BY budget_id"
    )
    assert [(b, n, sorted(r), p > 0) for b, n, r, p in covered] == [
        (rolling.budget_id, 2, ["r-rolling"], True),
        (PER_SECRET.budget_id, 4, ["", "r-own"], False),
    ]
    # the console's page reads the same rows, an org admin its org's only
    page = "period, scope_values, spent_nanos, limit_nanos, state, events"
    for org in (None, "acme", "globex"):
        caller = Caller("t", "org-admin", org, "127.0.0.1")
        fence = "" if org is None else f" AND scope_values[1] = '{org}'"
        assert rows(history_sql(rolling.budget_id, caller)) == rows(
            f"SELECT {page} FROM budget_history WHERE budget_id = '{rolling.budget_id}'{fence} "
            "ORDER BY period DESC, scope_values"
        )
    with pytest.raises(ValueError, match="budget id"):
        history_sql("", Caller("t", "platform-admin", None, "127.0.0.1"))
