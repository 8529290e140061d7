"""The counting stage's checkpoint order on the real broker: offsets are committed only
after every output reached Kafka, and never once an output batch failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from aggregator.config import AggregatorConfig
from aggregator.counting.errors import CountingError
from aggregator.counting.process import BatchProcessor
from aggregator.counting.reference import Reference
from aggregator.counting.stage import CountingStage
from aggregator.metrics import Metrics
from schemas.budgets import budgets_from_yaml
from schemas.codec import USAGE_EVENT, VERDICT
from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.pipeline_kit import BUDGETS_YAML, price_book

pytestmark = pytest.mark.integration
EVENTS = 12


def _event_bytes(secret_id: str, org_id: str) -> bytes:
    event = new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id=secret_id,
        org_id=org_id,
        gateway_id="checkpoint",
        input_tokens=100,
        output_tokens=10,
    )
    return USAGE_EVENT.encode(event)


def _stage(
    bootstrap: str, topics: Topics, data_dir: Path, kind: type[CountingStage] = CountingStage
) -> tuple[CountingStage, AggregatorConfig, Metrics]:
    """A counting stage on the pipeline kit's prices and budgets, checkpointing every 0.2 s."""
    reference = Reference()
    reference.prices = price_book()
    reference.budgets = {b.budget_id: b for b in budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))}
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
    processor = BatchProcessor(reference, source_topic=topics.usage_raw)
    return kind(config, topics, processor, metrics, ready), config, metrics


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
                org = f"org-{n % 4}"
                await producer.send_and_wait(
                    topics.usage_raw, _event_bytes(f"sk-{n % 3}", org), org.encode()
                )
        finally:
            await producer.stop()

        stage, config, metrics = _stage(bootstrap, topics, data_dir)
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


class _HeldCheckpoint(CountingStage):
    """A stage whose checkpoints wait, after their cut, until the test lets them finish
    (a broker slow to acknowledge, held as long as the test needs)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.let_finish = asyncio.Event()
        self.cuts = 0

    async def _complete(self, cut: Any, started: float) -> None:
        self.cuts += 1
        await self.let_finish.wait()
        await super()._complete(cut, started)


async def _verdicts_while_a_checkpoint_waits(
    bootstrap: str, topics: Topics, data_dir: Path
) -> tuple[int, list[int]]:
    stage, _, metrics = _stage(bootstrap, topics, data_dir, _HeldCheckpoint)
    assert isinstance(stage, _HeldCheckpoint)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    verdicts = AIOKafkaConsumer(
        topics.budget_verdicts, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await asyncio.gather(stage.start(), producer.start(), verdicts.start())
    loop = asyncio.get_running_loop()

    async def publish() -> None:
        await producer.send_and_wait(
            topics.usage_raw, _event_bytes("sk-held", "org-held"), b"org-held"
        )

    async def until(condition: Any) -> None:
        deadline = loop.time() + 60  # a bound on a hang, not a measurement
        while not condition():
            assert loop.time() < deadline, "the stage never got there"
            await asyncio.sleep(0.05)

    try:
        await until(lambda: stage.serving)
        await publish()
        # the first event folded, then the first checkpoint cut and held
        await until(lambda: metrics.totals.get("events", 0) == 1 and stage.cuts == 1)
        # then one event every 20 ms into the same counter: most of their verdicts are
        # held (< 100 ms after the last one sent), and meanwhile the next cut falls due
        for _ in range(EVENTS - 1):
            await publish()
            await asyncio.sleep(0.02)
        deadline = loop.time() + 60  # a bound on a hang, not a measurement
        requests: list[int] = []
        while loop.time() < deadline and not (requests and requests[-1] == EVENTS):
            for messages in (await verdicts.getmany(timeout_ms=200)).values():
                for message in messages:
                    verdict = VERDICT.decode(message.value)
                    if verdict["budget_id"] == "org-total":
                        requests.append(verdict["spent_requests"])
        return stage.cuts, requests
    finally:
        stage.let_finish.set()
        await asyncio.gather(stage.stop(), producer.stop(), verdicts.stop())


@pytest.mark.timeout(120)
def test_held_verdicts_go_out_while_a_checkpoint_waits_for_the_broker(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A verdict held by the coalescer falls due while the cut is due and the previous
    checkpoint still waits: it is sent then, with the newest totals (the loop neither
    holds it back until the checkpoint ends nor spins without yielding)."""
    cuts, requests = asyncio.run(
        _verdicts_while_a_checkpoint_waits(kafka_bootstrap, topics, tmp_path)
    )
    assert cuts == 1  # the first checkpoint never finished: no second cut
    assert requests and requests[-1] == EVENTS, requests
