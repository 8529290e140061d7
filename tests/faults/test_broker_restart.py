"""Kill the broker under load and restart it: the publisher's spool and the worker's consumers
resume, and counters, verdicts and ClickHouse totals stay exact (nothing lost, nothing doubled)."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.stack.topics import ensure_topics
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: how long the broker stays down; `make test-faults` may raise it
DOWN_SECONDS = float(os.environ.get("SPENDBUS_BROKER_DOWN_SECONDS", "4"))


def test_broker_killed_and_restarted_under_load_loses_and_doubles_nothing(
    local_broker: Any, tmp_path: Path, clickhouse_dsn: str
) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    asyncio.run(ensure_topics(local_broker.bootstrap, topics, partitions=4))
    pipeline = Pipeline(local_broker.bootstrap, topics, tmp_path, clickhouse_dsn)
    pipeline.apply_reference()
    pipeline.worker.start(timeout=180)
    try:
        _run(pipeline, local_broker, tmp_path)
    finally:
        pipeline.worker.stop()


def _run(pipeline: Pipeline, broker: Any, tmp_path: Path) -> None:
    rng = random.Random(7)
    events = [
        new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id=f"sk-{n % 6}",
            org_id=f"org-{n % 4}",
            gateway_id="faults",
            input_tokens=rng.randint(1, 8_000),
            output_tokens=rng.randint(1, 800),
        )
        for n in range(2_400)
    ]
    costs = [pipeline.prices.price_event(e).cost_nanos for e in events]
    per_secret: dict[tuple[str, str], int] = defaultdict(int)
    for e, cost in zip(events, costs, strict=True):
        per_secret[(e["org_id"], e["secret_id"])] += cost
    third = len(events) // 3

    async def feed_through_an_outage() -> None:
        config = PublisherConfig(
            bootstrap=pipeline.bootstrap,
            topic_prefix=pipeline.topics.prefix,
            spool_dir=tmp_path / "spool",
        )
        async with UsagePublisher(config) as publisher:
            for event in events[:third]:
                await publisher.publish(event)
            await publisher.flush()
            await asyncio.sleep(0.5)  # the worker is mid-stream when the broker dies
            await asyncio.to_thread(broker.kill)  # SIGKILL: no clean shutdown
            try:
                for event in events[third : 2 * third]:
                    await publisher.publish(event)  # into the spool while Kafka is away
                await asyncio.sleep(DOWN_SECONDS)
                assert publisher.spooled_bytes > 0
            finally:
                await asyncio.to_thread(broker.start, 180)
            for event in events[2 * third :]:
                await publisher.publish(event)
            await publisher.flush(120)

    asyncio.run(feed_through_an_outage())
    assert pipeline.worker.pid() is not None, pipeline.worker.log_tail(60)

    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos), uniqExact(event_id) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
        timeout=240,
    )
    count, nanos, unique = int(rows[0][0]), int(rows[0][1] or 0), int(rows[0][2])
    print(
        f"ledger: sent={len(events)} stored={count} unique={unique} "
        f"broker down {DOWN_SECONDS:g}s difference={count - len(events)} "
        f"nanos difference={nanos - sum(costs)}"
    )
    assert (count, unique, nanos) == (len(events), len(events), sum(costs)), (
        f"stats: {pipeline.stats()}\nworker log:\n{pipeline.worker.log_tail(60)}"
    )

    assert pipeline.verdict_spend_until(dict(per_secret)) == dict(per_secret)
