"""`spendbus dlq`: list the dead letters with their reasons, requeue one after its cause
was fixed, and a letter requeued twice is still charged once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.usage import new_usage_event
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline, poll

pytestmark = pytest.mark.integration


def spendbus(pipeline: Pipeline, *args: str) -> str:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": pipeline.bootstrap,
        "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_list_then_requeue_a_fixed_letter_charged_once(pipeline: Pipeline) -> None:
    # one letter the aggregator wrote itself (garbage), one whose cause was since fixed: its
    # value is a good event (as after deploying a schema version the worker did not know)
    asyncio.run(publish(pipeline.bootstrap, pipeline.topics.usage_raw, [(b"acme", b"garbage")]))
    event = new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o-mini",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="dlq-test",
        input_tokens=1000,
        output_tokens=100,
    )
    fixed = {
        "reason": "unknown_fingerprint",
        "detail": "written by a newer producer",
        "stage": "aggregator",
        "source_topic": pipeline.topics.usage_raw,
        "source_partition": 0,
        "source_offset": 0,
        "key": b"acme",
        "value": USAGE_EVENT.encode(event),
        "failed_at": datetime.now(UTC),
    }
    asyncio.run(
        publish(
            pipeline.bootstrap, pipeline.topics.usage_dlq, [(b"acme", DEAD_LETTER.encode(fixed))]
        )
    )
    deadline = time.monotonic() + 60
    letters: list[dict[str, Any]] = []
    while len(letters) < 2 and time.monotonic() < deadline:
        letters = json.loads(spendbus(pipeline, "dlq", "list", "--json"))
        time.sleep(0.5)
    assert sorted(letter["reason"] for letter in letters) == ["bad_magic", "unknown_fingerprint"]

    assert "would requeue 1" in spendbus(
        pipeline, "dlq", "requeue", "--reason", "unknown_fingerprint", "--dry-run"
    )
    for _ in range(2):  # requeued twice by mistake: still one charge
        assert "requeued 1" in spendbus(
            pipeline, "dlq", "requeue", "--reason", "unknown_fingerprint"
        )
    expected = pipeline.prices.price_event(event).cost_nanos
    pipeline.stats_until(lambda stats: stats.get("duplicates", 0) >= 1, timeout=60)
    rows = pipeline.sql_until(  # the sink writes within a second
        f"SELECT count(), sum(cost_nanos) FROM usage_events WHERE event_id = '{event['event_id']}'",
        lambda rows: int(rows[0][0]) >= 1,
        timeout=60,
    )
    assert (int(rows[0][0]), int(rows[0][1])) == (1, expected)
    assert pipeline.stats()["duplicates"] == 1


def test_a_mis_keyed_event_is_dead_lettered_then_requeued_and_counted_once(
    pipeline: Pipeline,
) -> None:
    """A producer that is not ours keys ten events of one org by their secret id, and sends
    one of them again under the org's key: the ten are dead-lettered (wrong_key), nothing of
    them counted; requeued, each goes to its org's partition and is counted once (the one
    sent twice too), in the verdict and in ClickHouse."""
    from aiokafka import AIOKafkaProducer

    events = [
        new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id=f"sk-mis-{n % 3}",
            org_id="misco",
            gateway_id="java-producer",
            input_tokens=1000 + n,
            output_tokens=100,
        )
        for n in range(10)
    ]

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=pipeline.bootstrap, acks="all")
        await producer.start()
        try:
            for e in events:
                key = e["secret_id"].encode()
                await producer.send_and_wait(pipeline.topics.usage_raw, USAGE_EVENT.encode(e), key)
            again = events[4]
            await producer.send_and_wait(
                pipeline.topics.usage_raw, USAGE_EVENT.encode(again), b"misco"
            )
        finally:
            await producer.stop()

    asyncio.run(produce())
    letters = poll(
        lambda: json.loads(spendbus(pipeline, "dlq", "list", "--json")),
        lambda found: len(found) >= 10,
    )
    assert [letter["reason"] for letter in letters] == ["wrong_key"] * 10
    assert "not the event's org_id b'misco'" in letters[0]["detail"]
    # only the one sent under its key counted so far
    stored = "SELECT count(), sum(cost_nanos) FROM usage_events WHERE org_id = 'misco'"
    rows = pipeline.sql_until(stored, lambda r: int(r[0][0]) >= 1)
    assert (int(rows[0][0]), int(rows[0][1])) == (
        1,
        pipeline.prices.price_event(events[4]).cost_nanos,
    )

    assert "requeued 10" in spendbus(pipeline, "dlq", "requeue", "--reason", "wrong_key")
    expected = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    rows = pipeline.sql_until(stored, lambda r: int(r[0][0]) >= 10)
    assert (int(rows[0][0]), int(rows[0][1])) == (10, expected)
    org_total = pipeline.sql_until(
        "SELECT spent_tokens FROM budget_state FINAL WHERE budget_id = 'org-total' "
        "AND scope_values = ['misco'] ORDER BY period DESC LIMIT 1",
        lambda r: bool(r) and int(r[0][0]) == sum(1100 + n for n in range(10)),
    )
    assert int(org_total[0][0]) == sum(1100 + n for n in range(10))
    stats = pipeline.stats_until(lambda s: s.get("duplicates", 0) >= 1)
    assert stats["duplicates"] == 1 and stats["dead_letters"] == 10
