"""The counting stage's checkpoint order on the real broker: offsets are committed only
after every output reached Kafka, and never once an output batch failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from pipeline_kit import BUDGETS_YAML, price_book

from aggregator.config import AggregatorConfig
from aggregator.counting import CountingError, CountingStage
from aggregator.metrics import Metrics
from aggregator.process import BatchProcessor
from aggregator.reference import Reference
from schemas.budgets import budgets_from_yaml
from schemas.codec import USAGE_EVENT
from schemas.topics import Topics
from schemas.usage import new_usage_event

pytestmark = pytest.mark.integration
EVENTS = 12


async def _run_stage(
    bootstrap: str, topics: Topics, data_dir: Path, *, break_priced: bool
) -> dict[str, Any]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if break_priced:  # every batch of priced events is now too large for the broker
            await admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        topics.usage_priced,
                        {"max.message.bytes": "100"},
                    )
                ]
            )
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for n in range(EVENTS):
                event = new_usage_event(
                    provider="anthropic",
                    api="anthropic-messages",
                    model="claude-sonnet-4-5",
                    secret_id=f"sk-{n % 3}",
                    org_id=f"org-{n % 4}",
                    gateway_id="checkpoint",
                    input_tokens=100,
                    output_tokens=10,
                )
                await producer.send_and_wait(
                    topics.usage_raw, USAGE_EVENT.encode(event), event["org_id"].encode()
                )
        finally:
            await producer.stop()

        reference = Reference()
        reference.prices = price_book()
        reference.budgets = {
            b.budget_id: b for b in budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))
        }
        ready = asyncio.Event()
        ready.set()
        config = AggregatorConfig(
            bootstrap=bootstrap,
            topic_prefix=topics.prefix,
            app_id=f"{topics.prefix}agg",
            commit_seconds=0.2,
            data_dir=data_dir,
        )
        metrics = Metrics()
        stage = CountingStage(
            config, topics, BatchProcessor(reference, source_topic=topics.usage_raw), metrics, ready
        )
        crashed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        async def on_crash(exc: BaseException) -> None:
            crashed.set_result(exc)

        stage.on_crash = on_crash
        await stage.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while asyncio.get_running_loop().time() < deadline and not crashed.done():
                if metrics.totals.get("events", 0) >= EVENTS and not break_priced:
                    await asyncio.sleep(0.5)  # a checkpoint or two
                    break
                await asyncio.sleep(0.1)
        finally:
            await stage.stop()  # a last checkpoint, unless one failed
        committed = await admin.list_consumer_group_offsets(config.counting_group)
    finally:
        await admin.close()
    return {
        "crash": crashed.result() if crashed.done() else None,
        "folded": metrics.totals.get("events", 0),
        "committed": sum(
            meta.offset for tp, meta in committed.items() if tp.topic == topics.usage_raw
        ),
    }


def test_offsets_are_committed_after_the_outputs(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    result = asyncio.run(_run_stage(kafka_bootstrap, topics, tmp_path, break_priced=False))
    assert result["crash"] is None and result["folded"] == EVENTS
    assert result["committed"] == EVENTS


def test_a_failed_output_batch_stops_the_stage_and_commits_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    result = asyncio.run(_run_stage(kafka_bootstrap, topics, tmp_path, break_priced=True))
    assert isinstance(result["crash"], CountingError), result
    assert result["folded"] == EVENTS  # it read and folded them...
    assert result["committed"] == 0  # ...and committed none: they will be re-delivered
