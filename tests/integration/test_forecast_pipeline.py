"""Forecasts on the real broker, worker and engine (issue 23): a counter burning fast gets
its projection in its verdict (budget_state's ddl/010 columns), one forecast alert on the
shared alert topic, still one after the worker restarts and folds more of the same, and
``spendbus usage`` (table and --json) shows the burn and the projection."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aggregator.replay.generations import alert_ids
from schemas.ids import counter_key
from schemas.periods import parse_window, period_key
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline, poll, publish_usage

pytestmark = pytest.mark.integration


def spendbus(pipeline: Pipeline, home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": pipeline.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
            "SPENDBUS_HOME": str(home),
            "COLUMNS": "200",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def events(secret: str, first: int, count: int, start: datetime) -> list[UsageEvent]:
    """``count`` calls a minute apart from ``start``, $0.0045 each (pipeline_kit's prices)."""
    return [
        new_usage_event(
            event_id=f"fc-{secret}-{first + i}",
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=secret,
            org_id="acme",
            gateway_id="it",
            input_tokens=1_000,
            output_tokens=100,
            occurred_at=start + timedelta(minutes=i),
        )
        for i in range(count)
    ]


def forecast_ids(pipeline: Pipeline) -> list[str]:
    ids = asyncio.run(alert_ids(pipeline.bootstrap, pipeline.topics.shared_alerts))
    return [i for i in ids if i.startswith("forecast|")]


def test_a_forecast_reaches_the_verdict_the_alert_topic_once_and_usage(
    pipeline: Pipeline, topics: Topics, tmp_path: Path
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(minutes=9)
    # per-secret: $0.10 a month; ten calls in nine minutes ($0.045) project the rest within
    # about twenty minutes, long before the month ends
    asyncio.run(publish_usage(pipeline.bootstrap, topics.usage_raw, events("sk-1", 0, 10, start)))
    key = counter_key("per-secret", ("acme", "sk-1"))
    period = period_key(parse_window("month"), now)
    stored = pipeline.sql_until(
        "SELECT argMax(spent_nanos, seq), argMax(burn_nanos, seq), argMax(burn_span_us, seq), "
        "toUnixTimestamp64Micro(argMax(exhausts_at, seq)) FROM budget_state "
        f"WHERE counter_key = '{key}'",
        lambda r: bool(r) and r[0][0] == 45_000_000,
    )
    spent, burn, span, exhausts_us = stored[0]
    assert (spent, burn) == (45_000_000, 45_000_000)
    as_of_us = int((start + timedelta(minutes=9)).timestamp() * 1_000_000)
    assert exhausts_us == as_of_us + -(-55_000_000 * span // 45_000_000)
    assert poll(lambda: forecast_ids(pipeline), lambda ids: len(ids) == 1, 60) == [
        f"forecast|{key}|{period}"
    ]

    # a restart, then more of the same counter and a second secret burning as fast: the
    # second one's alert shows the publisher polled everything again; sk-1's is not repeated
    pipeline.worker.stop()
    pipeline.worker.start(timeout=180)
    more = events("sk-1", 10, 2, start + timedelta(minutes=10)) + events("sk-2", 0, 10, start)
    asyncio.run(publish_usage(pipeline.bootstrap, topics.usage_raw, more))
    other = counter_key("per-secret", ("acme", "sk-2"))
    ids = poll(lambda: forecast_ids(pipeline), lambda ids: len(ids) >= 2, 90)
    assert ids == [f"forecast|{key}|{period}", f"forecast|{other}|{period}"]

    # usage: the enforcer's projection of the verdict's burn onto the limit it checks
    home = tmp_path / "cli"
    wanted = int((start + timedelta(minutes=11)).timestamp() * 1_000_000)

    def shown() -> dict[str, Any]:
        rows = json.loads(
            spendbus(pipeline, home, "usage", "--org-id", "acme", "--secret-id", "sk-1", "--json")
        )
        return next(r for r in rows if r["budget_id"] == "per-secret")

    row = poll(shown, lambda r: r["spent_nanos"] == 54_000_000, 60, interval=1.0)
    assert row["spent_nanos"] == 54_000_000
    assert row["burn_per_hour"]["nanos"] > 0 and row["exhausts_at"] is not None
    exhausts = datetime.fromisoformat(row["exhausts_at"].replace("Z", "+00:00"))
    assert to_us(datetime.fromisoformat(row["as_of"].replace("Z", "+00:00"))) == wanted
    assert now < exhausts < now + timedelta(hours=1)
    table = spendbus(pipeline, home, "usage", "--org-id", "acme", "--secret-id", "sk-1")
    assert "burn/h" in table and "exhausts" in table
    print(table)


def to_us(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)
