"""A budget applied mid-period counts the period's spend already in the ledger (issue 35):
on the real broker, worker and engine, `spendbus budgets apply` of a daily org budget after
the org spent today shows that spend, in its own output and in the verdicts enforcers
follow; the counters that already held those events are not charged twice, ClickHouse
stores each event once, and a restarted worker does not read the period again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from aggregator.counting.backfill import period_begins_us
from aggregator.replay.generations import topic_values
from enforcer import Decision, Enforcer, EnforcerConfig
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY
from schemas.money import format_usd
from schemas.periods import to_micros
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline, poll, publish_usage

pytestmark = pytest.mark.integration

DAILY_YAML = """
- {id: acme-daily, scope: org, match: {org_id: acme}, window: day, limit_usd: "2"}
- {id: acme-tight, scope: org, match: {org_id: acme}, window: day, limit_usd: "0.01"}
"""


def event(n: int, org: str, at: datetime, output_tokens: int) -> UsageEvent:
    return new_usage_event(
        event_id=f"mid-{n:03d}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id=f"sk-{org}-{n % 2}",
        org_id=org,
        gateway_id="mid-period",
        input_tokens=1_000,
        output_tokens=output_tokens,
        occurred_at=at,
    )


def spent_today(pipeline: Pipeline, events: list[UsageEvent], org: str) -> int:
    """The org's spend today by the price book, each event once: the test's own sum."""
    budget = budgets_from_yaml([{"id": "t", "scope": "org", "window": "day", "limit_usd": "1"}])
    begins = period_begins_us(budget[0], to_micros(datetime.now(UTC)))
    return sum(
        pipeline.prices.price_event(e).cost_nanos
        for e in events
        if e["org_id"] == org and to_micros(e["occurred_at"]) >= begins
    )


def apply(pipeline: Pipeline, home: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spendbus",
            "budgets",
            "apply",
            str(path),
            "--worker",
            pipeline.worker.base_url,
        ],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": pipeline.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
            "SPENDBUS_HOME": str(home),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


async def first_check(bootstrap: str, topics: Topics) -> Decision:
    """What a fresh enforcer decides for acme's next request, once it has read everything."""
    config = EnforcerConfig(bootstrap=bootstrap, topic_prefix=topics.prefix)
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        ctx = enforcer.context(
            org_id="acme",
            secret_id="sk-acme-new",  # no spend of its own: only the org's budgets refuse
            model="claude-sonnet-4-5",
            input_tokens=10,
            max_output_tokens=1,
        )
        return enforcer.check(ctx, reserve=False)


def test_a_budget_applied_mid_period_counts_what_the_period_spent(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    pipeline = Pipeline(kafka_bootstrap, topics, tmp_path, clickhouse_dsn)
    pipeline.apply_reference()  # per-secret (month) and org-total: counted from the start
    now = datetime.now(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    morning = [event(n, "acme", midnight + (now - midnight) * n / 12, 50 + n) for n in range(10)]
    morning.append(event(10, "acme", midnight - timedelta(hours=2), 70))  # yesterday, late
    morning.append(event(11, "other", now - timedelta(minutes=5), 90))  # another org
    asyncio.run(publish_usage(kafka_bootstrap, topics.usage_raw, morning))

    pipeline.worker.start(timeout=180)
    try:
        # the worker counted the morning in the budgets it had
        pipeline.stats_until(lambda s: s.get("events", 0) >= len(morning))
        stored = "SELECT count(), sum(cost_nanos) FROM usage_events"
        rows = pipeline.sql_until(stored, lambda r: int(r[0][0]) == len(morning))
        assert int(rows[0][0]) == len(morning)
        total_before = int(rows[0][1])

        # applied at "noon": the morning's spend is in it at once
        budget_file = tmp_path / "daily.yaml"
        budget_file.write_text(DAILY_YAML)
        done = apply(pipeline, tmp_path / "cli", budget_file)
        assert done.returncode == 0, done.stdout + done.stderr
        morning_spend = spent_today(pipeline, morning, "acme")
        assert morning_spend > 0
        assert f"acme-daily: {format_usd(morning_spend)} already spent this period" in (
            done.stdout
        ), done.stdout + done.stderr

        # the enforcers' view: the verdict of acme's daily counter holds the morning
        verdicts = poll(
            lambda: pipeline.sql(
                "SELECT budget_id, spent_nanos FROM budget_state FINAL "
                "WHERE budget_id = 'acme-daily' ORDER BY period DESC LIMIT 1"
            ),
            lambda r: bool(r) and int(r[0][1]) == morning_spend,
        )
        assert [(b, int(n)) for b, n in verdicts] == [("acme-daily", morning_spend)]
        # yesterday's event, read again, is of a period the budget never had: not counted
        periods = pipeline.sql(
            "SELECT DISTINCT period FROM budget_state FINAL WHERE budget_id = 'acme-daily'"
        )
        assert [p for (p,) in periods] == [f"d:{now.date().isoformat()}"]
        # enforced only once counted: the budgets went out as warn, then as enforce, so an
        # enforcer that reads them refuses acme on the morning's spend at once
        history = asyncio.run(topic_values(kafka_bootstrap, topics.budget_policies))
        actions = [
            (record["budget_id"], record["action"])
            for record in (BUDGET_POLICY.decode(v) for v in history if v is not None)
        ]
        assert actions[-4:] == [
            ("acme-daily", "warn"),
            ("acme-tight", "warn"),
            ("acme-daily", "enforce"),
            ("acme-tight", "enforce"),
        ]
        assert "acme-tight: enforced from now" in done.stdout
        refused = asyncio.run(first_check(kafka_bootstrap, topics))
        assert (refused.decision, refused.budget_id) == ("budget_exceeded", "acme-tight"), refused
        spent = {c.budget_id: c.spent_nanos for c in refused.counters}
        assert spent["acme-tight"] == spent["acme-daily"] == morning_spend

        # nothing else counted twice: the org-total counters and the stored events as before
        org_total = pipeline.sql(
            "SELECT sum(spent_nanos) FROM (SELECT spent_nanos FROM budget_state FINAL "
            "WHERE budget_id = 'org-total' ORDER BY period DESC LIMIT 1 BY counter_key)"
        )
        assert int(org_total[0][0]) == total_before
        rows = pipeline.sql(stored)
        assert (int(rows[0][0]), int(rows[0][1])) == (len(morning), total_before)

        # the afternoon counts on top, once
        afternoon = [event(20, "acme", datetime.now(UTC), 40)]
        asyncio.run(publish_usage(kafka_bootstrap, topics.usage_raw, afternoon))
        want = morning_spend + spent_today(pipeline, afternoon, "acme")
        verdicts = poll(
            lambda: pipeline.sql(
                "SELECT spent_nanos FROM budget_state FINAL WHERE budget_id = 'acme-daily' "
                "ORDER BY period DESC LIMIT 1"
            ),
            lambda r: bool(r) and int(r[0][0]) == want,
        )
        assert int(verdicts[0][0]) == want
    finally:
        pipeline.worker.stop()

    # a restart keeps the marker: nothing is read again, the budget counts on
    pipeline.worker.start(timeout=180)
    try:
        stats = pipeline.stats_until(lambda s: "acme-daily" in s.get("budgets_counting", {}))
        assert stats["budgets_loading"] == {}
        late = [event(21, "acme", datetime.now(UTC), 30)]
        asyncio.run(publish_usage(kafka_bootstrap, topics.usage_raw, late))
        stats = pipeline.stats_until(lambda s: s.get("events", 0) >= 1)
        assert stats["events"] == 1 and stats["redelivered"] == 0, stats
    finally:
        pipeline.worker.stop()
