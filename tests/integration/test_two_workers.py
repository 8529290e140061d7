"""Two aggregator workers in one group: partitions handed over both ways, counts stay exact.

A second worker joins mid-stream (the first checkpoints and gives up two partitions,
the second recovers their counters and dedupe state from the changelogs), then
leaves (the first recovers what the second wrote). ClickHouse totals and the
enforcer's view of every per-secret counter equal the ledger.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from pathlib import Path

import pytest

from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.records import UsageEvent
from schemas.usage import new_usage_event
from spendbus.stack.broker_probe import free_port
from spendbus.stack.worker import WorkerProcess
from tests.pipeline_kit import Pipeline, poll

pytestmark = pytest.mark.integration


def test_a_second_worker_takes_partitions_and_gives_them_back_exactly(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    rng = random.Random(8)
    events = [
        new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{n % 11}",
            org_id=f"org-{n % 9}",
            gateway_id="two-workers",
            input_tokens=rng.randint(1, 5_000),
            output_tokens=rng.randint(1, 500),
        )
        for n in range(1500)
    ]
    per_secret: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        per_secret[(e["org_id"], e["secret_id"])] += pipeline.prices.price_event(e).cost_nanos
    port = free_port()
    second = WorkerProcess(
        run_dir=tmp_path / "second" / "run",
        env={
            **{k: v for k, v in pipeline.worker.env.items() if k != "CLICKHOUSE_DSN"},
            "SPENDBUS_HOME": str(tmp_path / "second"),
            "SPENDBUS_WEB_PORT": str(port),
        },
        web_port=port,
        args=("--no-sink",),  # the embedded store is one process per path: the first sinks
    )

    async def publish(chunk: list[UsageEvent], spool: str) -> None:
        config = PublisherConfig(
            bootstrap=pipeline.bootstrap,
            topic_prefix=pipeline.topics.prefix,
            spool_dir=tmp_path / spool,
        )
        async with UsagePublisher(config) as publisher:
            for event in chunk:
                await publisher.publish(event)
            await publisher.flush()

    try:
        asyncio.run(publish(events[:500], "spool-1"))
        second.start(timeout=180)
        split = poll(
            lambda: (pipeline.stats()["assigned_partitions"], second.get("/stats")),
            lambda s: s[0] == 2 and s[1]["assigned_partitions"] == 2 and s[1]["serving"],
        )
        assert split[0] == 2 and split[1]["assigned_partitions"] == 2, split
        asyncio.run(publish(events[500:1000], "spool-2"))
        taken = poll(lambda: second.get("/stats"), lambda s: s.get("events", 0) > 0)
        assert taken.get("events", 0) > 0, "the second worker folded nothing"
    finally:
        second.stop()  # SIGTERM: a last checkpoint, then its partitions go back
    asyncio.run(publish(events[1000:], "spool-3"))

    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos), uniqExact(event_id) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
        timeout=180,
    )
    expected = sum(per_secret.values())
    assert (int(rows[0][0]), int(rows[0][2]), int(rows[0][1] or 0)) == (
        len(events),
        len(events),
        expected,
    ), pipeline.worker.log_tail(60)

    assert pipeline.verdict_spend_until(dict(per_secret)) == dict(per_secret)
