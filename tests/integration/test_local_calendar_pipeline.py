"""Local calendars on the real broker, worker and engine (issue 23): events on either side
of the DST changes of America/New_York and Europe/Berlin and of a billing-cycle day are
counted in their local periods by the aggregator, stored so in ClickHouse's history,
recomputed equal by verify, and the current period's reset is local midnight in the
verdicts (ClickHouse budget_state) and in ``spendbus usage`` (the enforcer)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from aggregator.replay.verify import verify_counters
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.pricing import price_table_from_yaml
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.stack.compacted import publish
from tests.pipeline_kit import PRICES_YAML, Pipeline, publish_usage

pytestmark = pytest.mark.integration

BUDGETS_YAML = """
- {id: ny-day, scope: org, window: day, limit_usd: "1000", timezone: America/New_York}
- {id: utc-day, scope: org, window: day, limit_usd: "1000"}
- {id: berlin-week, scope: org, window: week, limit_usd: "1000", timezone: Europe/Berlin, week_start: sunday}
- {id: berlin-cycle, scope: org, window: month, limit_usd: "1000", timezone: Europe/Berlin, month_start_day: 15}
"""
NEW_YORK, BERLIN = ZoneInfo("America/New_York"), ZoneInfo("Europe/Berlin")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


#: each instant with the period every budget counts it in, worked out by hand
#: (EST = UTC-5, EDT = UTC-4 from 2026-03-08 07:00Z to 2026-11-01 06:00Z;
#: CET = UTC+1, CEST = UTC+2 from 2026-03-29 01:00Z to 2026-10-25 01:00Z)
LEDGER: list[tuple[datetime, dict[str, str]]] = [
    # NY 03-07 23:59 EST; Berlin Sunday 03-08 05:59 (its week: 03-08..03-14, ISO W11)
    (
        utc(2026, 3, 8, 4, 59),
        {
            "ny-day": "d:2026-03-07",
            "utc-day": "d:2026-03-08",
            "berlin-week": "w:2026-W11",
            "berlin-cycle": "m:2026-02",
        },
    ),
    # NY 03-08 00:00 EST: the 23-hour day begins
    (
        utc(2026, 3, 8, 5),
        {
            "ny-day": "d:2026-03-08",
            "utc-day": "d:2026-03-08",
            "berlin-week": "w:2026-W11",
            "berlin-cycle": "m:2026-02",
        },
    ),
    # NY 03-08 23:59 EDT: still the 23-hour day
    (
        utc(2026, 3, 9, 3, 59),
        {
            "ny-day": "d:2026-03-08",
            "utc-day": "d:2026-03-09",
            "berlin-week": "w:2026-W11",
            "berlin-cycle": "m:2026-02",
        },
    ),
    # Berlin Saturday 03-14 23:59 CET: the week and the cycle are the old ones
    (
        utc(2026, 3, 14, 22, 59),
        {
            "ny-day": "d:2026-03-14",
            "utc-day": "d:2026-03-14",
            "berlin-week": "w:2026-W11",
            "berlin-cycle": "m:2026-02",
        },
    ),
    # Berlin Sunday 03-15 00:00 CET: a new week and a new billing cycle
    (
        utc(2026, 3, 14, 23),
        {
            "ny-day": "d:2026-03-14",
            "utc-day": "d:2026-03-14",
            "berlin-week": "w:2026-W12",
            "berlin-cycle": "m:2026-03",
        },
    ),
    # NY 11-01 00:00 EDT: the 25-hour day begins; Berlin Sunday 11-01 05:00 CET (W45)
    (
        utc(2026, 11, 1, 4),
        {
            "ny-day": "d:2026-11-01",
            "utc-day": "d:2026-11-01",
            "berlin-week": "w:2026-W45",
            "berlin-cycle": "m:2026-10",
        },
    ),
    # NY 11-01 23:59 EST: still that day, 24 h 59 min later
    (
        utc(2026, 11, 2, 4, 59),
        {
            "ny-day": "d:2026-11-01",
            "utc-day": "d:2026-11-02",
            "berlin-week": "w:2026-W45",
            "berlin-cycle": "m:2026-10",
        },
    ),
    (
        utc(2026, 11, 2, 5),
        {
            "ny-day": "d:2026-11-02",
            "utc-day": "d:2026-11-02",
            "berlin-week": "w:2026-W45",
            "berlin-cycle": "m:2026-10",
        },
    ),
]


def midnight(zone: ZoneInfo, day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=zone).astimezone(UTC)


def current_resets(now: datetime) -> dict[str, tuple[str, datetime]]:
    """(period, reset_at) of each budget at ``now``: the test's own reckoning."""
    ny = now.astimezone(NEW_YORK).date()
    berlin = now.astimezone(BERLIN).date()
    sunday = berlin - timedelta(days=(berlin.weekday() + 1) % 7)
    iso = (sunday + timedelta(days=3)).isocalendar()
    cycle = berlin.replace(day=15) if berlin.day >= 15 else _month(berlin.replace(day=15), -1)
    today = now.date()
    return {
        "ny-day": (f"d:{ny.isoformat()}", midnight(NEW_YORK, ny + timedelta(days=1))),
        "utc-day": (f"d:{today.isoformat()}", midnight(ZoneInfo("UTC"), today + timedelta(1))),
        "berlin-week": (
            f"w:{iso.year}-W{iso.week:02d}",
            midnight(BERLIN, sunday + timedelta(days=7)),
        ),
        "berlin-cycle": (f"m:{cycle:%Y-%m}", midnight(BERLIN, _month(cycle, 1))),
    }


def _month(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return day.replace(year=index // 12, month=index % 12 + 1)


def event(n: int, at: datetime) -> UsageEvent:
    return new_usage_event(
        event_id=f"cal-{n:03d}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-acme-1",
        org_id="acme",
        gateway_id="calendar",
        input_tokens=1_000,
        output_tokens=100,
        occurred_at=at,
    )


def test_local_periods_agree_in_the_aggregator_clickhouse_verify_and_usage(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    pipeline = Pipeline(kafka_bootstrap, topics, tmp_path, clickhouse_dsn)
    tables = price_table_from_yaml(yaml.safe_load(PRICES_YAML), source="it")
    budgets = budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))
    now = datetime.now(UTC)
    asyncio.run(
        publish(
            kafka_bootstrap,
            topics.pricing,
            [
                (t.version.encode(), PRICE_TABLE.encode(t.to_record()))
                for t in (tables if isinstance(tables, list) else [tables])
            ],
        )
    )
    asyncio.run(
        publish(
            kafka_bootstrap,
            topics.budget_policies,
            [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
        )
    )
    # the ledger, then one event now: the counters' newest period is the current one
    events = [event(n, at) for n, (at, _) in enumerate(LEDGER)]
    events.append(event(len(LEDGER), now - timedelta(seconds=1)))
    asyncio.run(publish_usage(kafka_bootstrap, topics.usage_raw, events))
    resets = current_resets(now - timedelta(seconds=1))
    want: collections.Counter[tuple[str, str]] = collections.Counter(
        (budget_id, period) for _, periods in LEDGER for budget_id, period in periods.items()
    )
    want.update((budget_id, period) for budget_id, (period, _) in resets.items())

    pipeline.worker.start(timeout=180)
    try:
        history = "SELECT budget_id, period, events FROM budget_history ORDER BY budget_id, period"
        rows = pipeline.sql_until(
            history, lambda r: sum(int(x[2]) for x in r) >= sum(want.values()), timeout=180
        )
        assert {(b, p): int(n) for b, p, n in rows} == dict(want), pipeline.worker.log_tail(30)

        # the newest verdict of each counter, as ClickHouse stores it: the local reset
        verdicts = pipeline.sql_until(
            "SELECT budget_id, period, reset_at FROM budget_state FINAL "
            "ORDER BY budget_id, period DESC LIMIT 1 BY budget_id",
            lambda r: len(r) == len(budgets) and all(r_[1] == resets[r_[0]][0] for r_ in r),
        )
        assert {b: (p, _utc(r)) for b, p, r in verdicts} == resets

        # verify recomputes every counter from the ledger: the same periods, the same sums
        report = asyncio.run(verify_counters(kafka_bootstrap, topics, history_query=pipeline.sql))
        assert report.ok, report.differences[:5]
        assert report.periods_compared == len(want)

        # `spendbus usage` is the enforcer: its period and reset by its own clock
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "spendbus",
                "usage",
                "--org-id",
                "acme",
                "--secret-id",
                "sk-acme-1",
                "--json",
            ],
            env={
                **os.environ,
                "KAFKA_BOOTSTRAP": kafka_bootstrap,
                "SPENDBUS_TOPIC_PREFIX": topics.prefix,
                "SPENDBUS_HOME": str(tmp_path / "cli"),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        usage = {
            r["budget_id"]: (r["period"], _utc(r["reset_at"])) for r in json.loads(done.stdout)
        }
        assert usage == resets
    finally:
        pipeline.worker.stop()


def _utc(value: Any) -> datetime:
    """A reset as ClickHouse (a naive UTC datetime or text) or JSON (ISO text) gives it."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
