"""A day whose residual passes the threshold is an Alert of kind reconciliation on the real
broker's budget.alerts, in the contract's codec, and notify says what it means."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime

import pytest
from aiokafka import AIOKafkaConsumer

from notify.payload import summary
from reconcile import ALERT_KIND, DaySummary, drift_alerts
from schemas.codec import ALERT
from schemas.topics import Topics
from spendbus.commands.reconcile import publish_alerts, usd_nanos
from spendbus.settings import load_settings

DAY = date(2026, 11, 3)
NOW = datetime(2026, 11, 4, 6, tzinfo=UTC)


def days() -> list[DaySummary]:
    drifting = DaySummary("openai", DAY, 1_000, 900, {}, residual=100)
    drifting.provider_nanos, drifting.spendbus_nanos, drifting.cost_residual = 5_000, 4_000, 1_000
    explained = DaySummary("anthropic", DAY, 1_000, 900, {"estimate": 100}, residual=0)
    return [drifting, explained]


def test_only_a_day_past_a_threshold_alerts_and_the_alert_is_the_contracts() -> None:
    assert drift_alerts(days(), now=NOW) == []  # no threshold: no alert
    assert drift_alerts(days(), residual_tokens=100, now=NOW) == []  # not past it
    (alert,) = drift_alerts(days(), residual_tokens=99, now=NOW)
    assert alert["kind"] == ALERT_KIND and alert["period"] == "d:2026-11-03"
    assert (alert["spent_tokens"], alert["limit_tokens"]) == (100, 99)
    assert ALERT.decode(ALERT.encode(alert)) == alert
    (by_cost,) = drift_alerts(days(), residual_nanos=usd_nanos("0.000000999"), now=NOW)
    assert by_cost["spent_nanos"] == 1_000 and by_cost["alert_id"] != alert["alert_id"]
    # a re-run finding the same drift makes the same alert id (notify sends each id once)
    assert drift_alerts(days(), residual_tokens=99)[0]["alert_id"] == alert["alert_id"]
    said = summary(alert, None)
    assert "openai's report of 2026-11-03" in said and "100 tokens" in said


async def read_alerts(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, object]]]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=10_000)
        return [
            (m.key, dict(ALERT.decode(m.value)))
            for messages in batches.values()
            for m in messages
            if m.key is not None and m.value is not None
        ]
    finally:
        await consumer.stop()


@pytest.mark.integration
def test_the_alert_is_published_on_budget_alerts(kafka_bootstrap: str, topics: Topics) -> None:
    settings = load_settings(
        {"KAFKA_BOOTSTRAP": kafka_bootstrap, "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    )
    alerts = drift_alerts(days(), residual_tokens=10, residual_nanos=10, now=NOW)
    publish_alerts(settings, alerts)
    ((key, read),) = asyncio.run(read_alerts(kafka_bootstrap, topics.budget_alerts))
    assert key == alerts[0]["counter_key"].encode()
    assert read == alerts[0]
