"""kill -9 the aggregator worker under load: counters, verdicts and ClickHouse totals stay exact."""

from __future__ import annotations

import asyncio
import os
import random
from collections import defaultdict
from pathlib import Path

import pytest

from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: kills in `make test`; `make test-faults` raises it with SPENDBUS_FAULT_KILLS
KILLS = int(os.environ.get("SPENDBUS_FAULT_KILLS", "2"))


def test_kill_minus_nine_mid_stream_then_restart_is_exact(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    rng = random.Random(99)
    events = [
        new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{n % 7}",
            org_id=f"org-{n % 5}",
            gateway_id="faults",
            input_tokens=rng.randint(1, 9_000),
            output_tokens=rng.randint(1, 900),
        )
        for n in range(800 * (KILLS + 1))
    ]
    expected_nanos = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    per_secret: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        per_secret[(e["org_id"], e["secret_id"])] += pipeline.prices.price_event(e).cost_nanos

    async def feed_and_kill() -> None:
        config = PublisherConfig(
            bootstrap=pipeline.bootstrap,
            topic_prefix=pipeline.topics.prefix,
            spool_dir=tmp_path / "spool",
        )
        chunk = len(events) // (KILLS + 1)
        async with UsagePublisher(config) as publisher:
            for round_ in range(KILLS + 1):
                for event in events[round_ * chunk : (round_ + 1) * chunk]:
                    await publisher.publish(event)
                await publisher.flush()
                if round_ < KILLS:
                    # let the worker get part-way through the round, then crash it
                    await asyncio.sleep(rng.uniform(0.5, 2.5))
                    await asyncio.to_thread(pipeline.worker.kill)
                    await asyncio.to_thread(pipeline.worker.start, 180)

    asyncio.run(feed_and_kill())

    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos), uniqExact(event_id) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
        timeout=180,
    )
    count, nanos, unique = int(rows[0][0]), int(rows[0][1] or 0), int(rows[0][2])
    print(
        f"ledger: sent={len(events)} stored={count} unique={unique} kills={KILLS} "
        f"difference={count - len(events)}"
    )
    assert (count, unique, nanos) == (len(events), len(events), expected_nanos), (
        f"stats: {pipeline.stats()}\nworker log:\n{pipeline.worker.log_tail(60)}"
    )

    assert pipeline.verdict_spend_until(dict(per_secret)) == dict(per_secret)
