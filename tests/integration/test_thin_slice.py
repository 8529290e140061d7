"""The thin slice, all real: publisher -> Kafka -> Faust aggregator -> ClickHouse + verdicts -> enforcer 402."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from enforcer import Enforcer, EnforcerConfig
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.records import UsageEvent
from schemas.topics import usage_raw_key
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration


def make_events(n: int, seed: int = 7) -> list[UsageEvent]:
    rng = random.Random(seed)
    events = []
    for _ in range(n):
        org = rng.choice(["acme", "globex", "initech"])
        events.append(
            new_usage_event(
                provider="anthropic",
                api="anthropic-messages",
                model=rng.choice(["claude-sonnet-4-5", "gpt-4o-mini", "mystery-model-9"]),
                secret_id=f"sk-{org}-{rng.randint(1, 3)}",
                org_id=org,
                gateway_id="it",
                input_tokens=rng.randint(1, 20_000),
                output_tokens=rng.randint(1, 2_000),
                cache_read_tokens=rng.choice([0, 0, rng.randint(1, 50_000)]),
            )
        )
    return events


async def publish_events(pipeline: Pipeline, spool: Path, events: list[UsageEvent]) -> None:
    config = PublisherConfig(
        bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix, spool_dir=spool
    )
    async with UsagePublisher(config) as publisher:
        for event in events:
            await publisher.publish(event)
        await publisher.flush()


async def publish_raw(
    pipeline: Pipeline, records: Sequence[tuple[bytes | None, bytes | None]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=pipeline.bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(pipeline.topics.usage_raw, key=key, value=value)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(messages)
    finally:
        await consumer.stop()
    return out


def test_events_are_priced_counted_stored_and_enforced(pipeline: Pipeline, tmp_path: Path) -> None:
    events = make_events(1500)
    duplicates = events[:25]  # a proxy re-publishing the same event ids
    asyncio.run(publish_events(pipeline, tmp_path / "spool", events + duplicates))

    expected_nanos = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
    )
    assert (int(rows[0][0]), int(rows[0][1] or 0)) == (len(events), expected_nanos)
    stats = pipeline.stats()
    assert stats["duplicates"] == len(duplicates)
    assert stats["unpriced_models"] == ["mystery-model-9"]
    unpriced = pipeline.sql("SELECT count() FROM usage_events WHERE unpriced")[0][0]
    assert unpriced == sum(1 for e in events if e["model"] == "mystery-model-9")

    # every per-secret budget of $0.10 is long exhausted: the enforcer refuses with the contract's 402
    async def enforce() -> tuple[Any, Any]:
        config = EnforcerConfig(bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix)
        async with Enforcer(config) as enforcer:
            await enforcer.wait_ready(60)
            secret = events[0]["secret_id"]
            per_secret = sum(
                pipeline.prices.price_event(e).cost_nanos
                for e in events
                if e["secret_id"] == secret
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                statuses = enforcer.usage(
                    enforcer.context(org_id=events[0]["org_id"], secret_id=secret)
                )
                spent = {s.budget_id: s.spent_nanos for s in statuses}
                if spent.get("per-secret") == per_secret:
                    break
                await asyncio.sleep(0.2)
            decision = enforcer.peek(enforcer.context(org_id=events[0]["org_id"], secret_id=secret))
            return decision, spent

    decision, spent = asyncio.run(enforce())
    secret = events[0]["secret_id"]
    assert spent["per-secret"] == sum(
        pipeline.prices.price_event(e).cost_nanos for e in events if e["secret_id"] == secret
    )
    assert decision.status == 402
    body = decision.body
    assert body["error"] == "budget_exceeded" and body["budget_id"] == "per-secret"
    assert set(body) >= {
        "error",
        "budget_id",
        "counter",
        "period",
        "limit_nanos",
        "spent_nanos",
        "reset_at",
    }
    assert body["spent_nanos"] == spent["per-secret"] and body["limit_nanos"] == 100_000_000


def test_bad_records_go_to_the_dlq_with_reason_and_bytes_and_the_worker_goes_on(
    pipeline: Pipeline,
) -> None:
    good = make_events(3, seed=1)
    negative = dict(good[0], event_id="bad-negative")
    from io import BytesIO

    from fastavro import schemaless_writer

    buf = BytesIO()
    buf.write(USAGE_EVENT.header)
    schemaless_writer(buf, USAGE_EVENT.parsed, {**negative, "input_tokens": -40})
    absurd = BytesIO()
    absurd.write(USAGE_EVENT.header)
    schemaless_writer(
        absurd, USAGE_EVENT.parsed, {**negative, "event_id": "bad-absurd", "output_tokens": 10**15}
    )
    bad: list[tuple[bytes | None, bytes | None]] = [
        (b"acme", b"\x00\x01garbage"),
        (b"acme", b"\xc3\x01" + b"\xee" * 8 + b"\x00"),
        (b"acme", USAGE_EVENT.header + b"\x02"),
        (b"acme", buf.getvalue()),
        (b"acme", absurd.getvalue()),
        (b"acme", None),
    ]
    asyncio.run(
        publish_raw(
            pipeline, [(usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e)) for e in good[:2]] + bad
        )
    )
    asyncio.run(
        publish_raw(pipeline, [(usage_raw_key(good[2]["org_id"]), USAGE_EVENT.encode(good[2]))])
    )
    letters = asyncio.run(read_all(pipeline.bootstrap, pipeline.topics.usage_dlq, len(bad)))
    decoded = [DEAD_LETTER.decode(m.value) for m in letters]
    assert sorted(d["reason"] for d in decoded) == sorted(
        [
            "bad_magic",
            "unknown_fingerprint",
            "malformed",
            "invalid_field",
            "invalid_field",
            "null_value",
        ]
    )
    assert {d["value"] for d in decoded} == {value for _, value in bad}
    assert any("input_tokens" in d["detail"] for d in decoded)
    rows = pipeline.sql_until("SELECT count() FROM usage_events", lambda rows: int(rows[0][0]) >= 3)
    assert int(rows[0][0]) == 3  # the good events around the bad ones, all charged
    assert pipeline.stats()["dead_letters"] == len(bad)
