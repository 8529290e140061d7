"""Hostile input and retry storms against a running worker: nothing crashes, nothing is
charged that should not be, everything refused is in the DLQ with its reason."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from io import BytesIO
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from fastavro import schemaless_writer

from schemas.codec import DEAD_LETTER, MAGIC, USAGE_EVENT
from schemas.records import UsageEvent
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

HOSTILE = 10_000


def valid(i: int, rng: random.Random) -> UsageEvent:
    return new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o-mini",
        secret_id=f"sk-{i % 3}",
        org_id="acme",
        gateway_id="faults",
        input_tokens=rng.randint(1, 10_000),
        output_tokens=rng.randint(1, 1_000),
    )


def raw_avro(record: dict[str, Any]) -> bytes:
    """Encoded past the validation a well-behaved producer applies (a foreign producer)."""
    buf = BytesIO()
    buf.write(USAGE_EVENT.header)
    schemaless_writer(buf, USAGE_EVENT.parsed, record)
    return buf.getvalue()


def hostile(i: int, rng: random.Random) -> bytes | None:
    base = valid(i, rng)
    kind = i % 10
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300))
    if kind == 1:
        return MAGIC + rng.randbytes(8) + rng.randbytes(rng.randint(0, 100))
    if kind == 2:
        good = USAGE_EVENT.encode(base)
        return good[: rng.randint(10, len(good) - 1)]
    if kind == 3:
        return USAGE_EVENT.header + rng.randbytes(rng.randint(1, 200))
    if kind == 4:
        return raw_avro({**base, "input_tokens": -rng.randint(1, 10**9)})
    if kind == 5:
        return raw_avro({**base, "output_tokens": 10**12 + rng.randint(0, 10**9)})
    if kind == 6:
        return raw_avro({**base, "org_id": rng.choice(["", "   ", "x" * 5000])})
    if kind == 7:
        return raw_avro(
            {**base, "occurred_at": datetime(1990, 1, 1, tzinfo=UTC) + timedelta(days=i % 3000)}
        )
    if kind == 8:
        return raw_avro({**base, "event_id": f"\x00unpriced\x00{i}"})
    return None  # a null value


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def count_dlq(bootstrap: str, topic: str, expected: int) -> dict[str, int]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    reasons: dict[str, int] = {}
    seen = 0
    try:
        deadline = time.monotonic() + 60
        while seen < expected and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                for m in messages:
                    letter = DEAD_LETTER.decode(m.value)
                    assert letter["detail"] and letter["source_topic"].endswith("usage.raw")
                    reasons[letter["reason"]] = reasons.get(letter["reason"], 0) + 1
                    seen += 1
    finally:
        await consumer.stop()
    return reasons


def wait_for_events(pipeline: Pipeline, n: int) -> dict[str, Any]:
    return pipeline.stats_until(lambda stats: stats.get("events", 0) >= n, timeout=240)


def test_ten_thousand_hostile_records_all_dead_lettered_and_charge_nothing(
    pipeline: Pipeline,
) -> None:
    rng = random.Random(2026)
    good = [valid(i, rng) for i in range(100)]
    records: list[tuple[bytes, bytes | None]] = [(b"acme", hostile(i, rng)) for i in range(HOSTILE)]
    for n, event in enumerate(good):  # the valid events are spread among the hostile ones
        records.insert(n * (HOSTILE // len(good)), (b"acme", USAGE_EVENT.encode(event)))
    asyncio.run(produce(pipeline.bootstrap, pipeline.topics.usage_raw, records))

    stats = wait_for_events(pipeline, len(records))
    assert stats["events"] == len(records), stats
    assert stats["dead_letters"] == HOSTILE and stats["charged"] == len(good)
    reasons = asyncio.run(count_dlq(pipeline.bootstrap, pipeline.topics.usage_dlq, HOSTILE))
    print(f"ledger: hostile={HOSTILE} dead-lettered={sum(reasons.values())} reasons={reasons}")
    assert sum(reasons.values()) == HOSTILE
    assert set(reasons) <= {
        "bad_magic",
        "unknown_fingerprint",
        "malformed",
        "invalid_field",
        "null_value",
        "wrong_schema",
    }

    expected = sum(pipeline.prices.price_event(e).cost_nanos for e in good)
    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(good),
    )
    assert (int(rows[0][0]), int(rows[0][1])) == (len(good), expected)
    # counters hold exactly the valid events (budget_state follows the verdicts within seconds)
    query = (
        "SELECT sum(spent_nanos) FROM (SELECT counter_key, argMax(spent_nanos, seq) AS spent_nanos "
        "FROM budget_state WHERE budget_id = 'per-secret' GROUP BY counter_key)"
    )
    rows = pipeline.sql_until(query, lambda rows: int(rows[0][0] or 0) == expected)
    assert int(rows[0][0] or 0) == expected


def test_a_retry_storm_reusing_event_ids_is_charged_once(pipeline: Pipeline) -> None:
    rng = random.Random(7)
    events = [valid(i, rng) for i in range(200)]
    storm = [e for e in events for _ in range(20)]
    rng.shuffle(storm)
    # the first copy of each id must come first in its partition: a retry follows the original
    first_seen: set[str] = set()
    ordered = []
    for e in storm:
        if e["event_id"] not in first_seen:
            first_seen.add(e["event_id"])
            ordered.append(e)
    ordered += [e for e in storm][len(ordered) :]
    asyncio.run(
        produce(
            pipeline.bootstrap,
            pipeline.topics.usage_raw,
            [(b"acme", USAGE_EVENT.encode(e)) for e in storm],
        )
    )
    stats = wait_for_events(pipeline, len(storm))
    print(
        f"ledger: published={len(storm)} unique={len(events)} charged={stats['charged']} "
        f"duplicates={stats['duplicates']}"
    )
    assert (stats["charged"], stats["duplicates"]) == (len(events), len(storm) - len(events))
    expected = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos), uniqExact(event_id) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
    )
    assert (int(rows[0][0]), int(rows[0][1]), int(rows[0][2])) == (
        len(events),
        expected,
        len(events),
    )
