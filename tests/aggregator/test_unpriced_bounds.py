"""Unpriced model names are the clients' own (issue 21): a new name per request must not
grow the worker's state or the alert stream without end. /stats lists a bounded number
and counts the rest; the alert publisher alerts a bounded number one by one and folds
every further model into the one ``unpriced|*`` alert (real engine, real broker)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from aggregator.alerts.publisher import AlertPublisher
from aggregator.counting.fold import MAX_UNPRICED_MODEL_ALERTS
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from aggregator.metrics import MAX_UNPRICED_MODELS_LISTED, Metrics
from aggregator.replay.generations import alert_ids
from aggregator.sink import ClickHouseSink, apply_schema, open_client
from schemas.codec import ALERT, PRICED_USAGE, USAGE_EVENT
from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.topics import Topics
from schemas.usage import new_usage_event

T0 = datetime(2026, 11, 20, tzinfo=UTC)
_databases = itertools.count()


def test_stats_list_a_bounded_number_of_unpriced_models_and_count_the_rest() -> None:
    metrics = Metrics()
    metrics.record_unpriced_models({f"made-up-{i}" for i in range(MAX_UNPRICED_MODELS_LISTED)})
    metrics.record_unpriced_models({"made-up-0", "made-up-1", "new-1", "new-2"})
    snapshot = metrics.snapshot()
    assert len(snapshot["unpriced_models"]) == MAX_UNPRICED_MODELS_LISTED
    assert "new-1" not in snapshot["unpriced_models"]
    # a name already listed is not counted again; each one past the bound is
    assert snapshot["unpriced_models_unlisted"] == 2
    exposition = metrics.exposition().decode()
    assert "spendbus_aggregator_unpriced_models_unlisted_total 2.0" in exposition


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = f"chdb://{tmp_path_factory.mktemp('unpriced')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


def _raw(models: list[str], first: int) -> list[RawRecord]:
    return [
        RawRecord(
            0,
            first + n,
            b"acme",
            USAGE_EVENT.encode(
                new_usage_event(
                    event_id=f"ev-{first + n}",
                    provider="openai",
                    api="openai-chat",
                    model=model,
                    secret_id="sk-1",
                    org_id="acme",
                    gateway_id="gw",
                    input_tokens=10,
                    output_tokens=5,
                    occurred_at=T0 + timedelta(seconds=first + n),
                )
            ),
        )
        for n, model in enumerate(models)
    ]


def _stored(client: Any, models: list[str], first: int) -> None:
    """One priced event per model, folded and stored as the worker does."""
    reference = Reference()
    reference.prices = PriceBook(load_price_file(default_price_file()))
    processor = BatchProcessor(reference, source_topic="usage.raw")
    records = _raw(models, first)
    out = processor.process(records, lambda p, k: None, lambda p, k: None, now=T0 + timedelta(1))
    assert out.stats.unpriced == len(models)
    ClickHouseSink(client).write([PRICED_USAGE.decode(value) for _, _, value, _ in out.priced])


def test_the_alert_publisher_folds_unpriced_models_past_its_bound(
    engine: str, kafka_bootstrap: str, topics: Topics
) -> None:
    admin = open_client(engine)
    name = f"u{next(_databases)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    client = open_client(engine, database=name)
    apply_schema(client)

    async def read(sql: str) -> Any:
        return client.query(sql).result_rows

    folded: list[int] = []

    async def run() -> None:
        publisher = AlertPublisher(kafka_bootstrap, topics, read, folded=folded.append)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            beyond = 30
            _stored(
                client, [f"made-up-{i:04d}" for i in range(MAX_UNPRICED_MODEL_ALERTS + beyond)], 0
            )
            assert await publisher.publish_once(producer) == MAX_UNPRICED_MODEL_ALERTS + 1
            assert publisher.unpriced_folded == folded[0] > 0
            # more new names later: no message per name, the overflow alert is not repeated
            _stored(client, [f"later-{i}" for i in range(20)], 10_000)
            assert await publisher.publish_once(producer) == 0
            assert len(folded) == 2
            # a new owner of the topic reads what was sent and sends nothing again
            again = AlertPublisher(kafka_bootstrap, topics, read)
            assert await again.publish_once(producer) == 0
        finally:
            await producer.stop()

    try:
        asyncio.run(run())
        sent = set(asyncio.run(alert_ids(kafka_bootstrap, topics.shared_alerts)))
    finally:
        client.close()
    unpriced = {i for i in sent if i.startswith("unpriced|")}
    # the oldest names one by one, then the one alert for all the others
    assert unpriced == {f"unpriced|made-up-{i:04d}" for i in range(MAX_UNPRICED_MODEL_ALERTS)} | {
        "unpriced|*"
    }


def test_the_fold_without_a_store_alerts_a_bounded_number_of_models_then_one_overflow() -> None:
    # without a ClickHouse store the fold's own alerts are all that is published: a client
    # sending a new model name per request made one alert (and webhook call) per request
    reference = Reference()
    reference.prices = PriceBook(load_price_file(default_price_file()))
    processor = BatchProcessor(reference, source_topic="usage.raw")
    seen: dict[tuple[int, str], str] = {}

    def process(models: list[str], first: int) -> tuple[list[str], int]:
        out = processor.process(
            _raw(models, first),
            lambda p, k: None,
            lambda p, k: seen.get((p, k)),
            now=T0 + timedelta(1),
        )
        seen.update(out.seen_writes)
        alerted = [ALERT.decode(value)["alert_id"] for _, value in out.alerts]
        return alerted, out.unpriced_alerts_folded

    beyond = 30
    names = [f"made-up-{i:04d}" for i in range(MAX_UNPRICED_MODEL_ALERTS + beyond)]
    alerted, folded = process(names + names[:5], 0)  # each name again: alerted once
    assert alerted == [f"unpriced|{n}" for n in names[:MAX_UNPRICED_MODEL_ALERTS]] + ["unpriced|*"]
    assert folded == beyond
    # later batches: names already seen say nothing; new ones are folded, the overflow
    # alert is not repeated
    assert process(names + [f"later-{i}" for i in range(20)], 10_000) == ([], 20)
