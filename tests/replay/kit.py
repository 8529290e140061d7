"""Helpers of the replay tests: deterministic events, publishing, a replay beside a pipeline."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aggregator.replay.run import GenerationReplay, StackPlace
from schemas.records import UsageEvent
from schemas.usage import new_usage_event
from spendbus.commands.replay import generation_replay
from tests.pipeline_kit import Pipeline
from tests.pipeline_kit import publish_usage as publish  # the replay tests' name for it

#: events happen in one month (the per-secret budget's period), spread over its first days
BASE_TIME = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def make_events(n: int, seed: int, start: int = 0) -> list[UsageEvent]:
    """Realistic events with fixed ids and times, so two runs publish the same ledger."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        org = rng.choice(["acme", "globex", "initech"])
        out.append(
            new_usage_event(
                provider="anthropic",
                api="anthropic-messages",
                model=rng.choice(["claude-sonnet-4-5", "gpt-4o-mini"]),
                secret_id=f"sk-{org}-{rng.randint(1, 3)}",
                org_id=org,
                gateway_id="replay-test",
                input_tokens=rng.randint(1, 20_000),
                output_tokens=rng.randint(1, 2_000),
                cache_read_tokens=rng.choice([0, 0, rng.randint(1, 50_000)]),
                occurred_at=BASE_TIME + timedelta(seconds=37 * i),
                event_id=f"ev-{seed}-{i:06d}",
            )
        )
    return out


def publish_events(pipeline: Pipeline, events: list[UsageEvent]) -> None:
    asyncio.run(publish(pipeline.bootstrap, pipeline.topics.usage_raw, events))


def replay_beside(pipeline: Pipeline, home: Path, generation: str) -> GenerationReplay:
    """A replay into ``generation`` on the pipeline's topics and store, not started."""
    place = StackPlace(
        bootstrap=pipeline.bootstrap,
        topics=pipeline.topics,
        dsn=pipeline.dsn,
        home=home,
        partitions=4,
    )
    return generation_replay(place, generation)
