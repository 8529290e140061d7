"""The sink stage (aggregator/sink/stage.py) on the real broker and the embedded engine.

Two stages of one sink group share usage.priced as two workers would; the second joins
while the first is storing, so partitions move mid-stream (revocation: the batch in flight
is finished and committed, records collected from revoked partitions dropped, the fences
forgotten). Every record is stored once, and the group's commits reach the ends.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.sink.rows import month_of
from aggregator.sink.stage import SinkStage
from aggregator.sink.writer import ClickHouseWriter
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.ids import ids_are_canonical
from schemas.topics import STORE_ROW_HEADER, Topics, store_row_value
from schemas.usage import new_usage_event

PARTITIONS = 4
NOW = datetime.now(UTC)


def priced_value(partition: int, offset: int) -> dict[str, Any]:
    event = new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o",
        secret_id=f"sk-{offset % 7}",
        org_id=f"org-{partition}",
        user_id=(
            " Mixed@Example.com "
            if offset < UPGRADED_AT and offset % 11 == 0
            else f"user-{offset % 5}@example.com"
        ),
        gateway_id="gw",
        input_tokens=100 + offset % 50,
        output_tokens=10,
        occurred_at=NOW - timedelta(seconds=offset),
        event_id=f"ev-{partition}-{offset}",
    )
    return {
        "event": event,
        "cost_nanos": 1_000 + offset,
        "price_version": "2026-11-01",
        "price_match": "gpt-4o",
        "unpriced": False,
        "source_partition": partition,
        "source_offset": offset,
        "priced_at": NOW,
    }


#: records below this offset come from a counting stage older than the store-row header:
#: no header, and every 11th one's ids are not canonical (the sink decodes them)
UPGRADED_AT = 200


async def publish_priced(bootstrap: str, topics: Topics, offsets: range) -> None:
    """PricedUsage records as the counting stage writes them: partition = source partition,
    the store-row header (and canonical ids) from UPGRADED_AT on."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for offset in offsets:
            for partition in range(PARTITIONS):
                record = priced_value(partition, offset)
                headers = []
                if offset >= UPGRADED_AT:
                    assert ids_are_canonical(record["event"])
                    position = store_row_value(
                        partition, offset, month_of(record["event"]["occurred_at"])
                    )
                    headers = [(STORE_ROW_HEADER, position)]
                await producer.send(
                    topics.usage_priced,
                    PRICED_USAGE.encode(record),
                    key=f"org-{partition}".encode(),
                    partition=partition,
                    headers=headers,
                )
        await producer.flush()
    finally:
        await producer.stop()


async def publish_verdicts(bootstrap: str, topics: Topics, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(count):
            key = f"counter-{n}"
            verdict = {
                "counter_key": key,
                "budget_id": "b",
                "scope": "org",
                "scope_values": [f"org-{n}"],
                "period": "m:2026-12",
                "state": "ok",
                "spent_nanos": n,
                "spent_tokens": 0,
                "spent_requests": 0,
                "limit_nanos": 10**12,
                "limit_tokens": None,
                "limit_requests": None,
                "action": "enforce",
                "refusal": "budget_exceeded",
                "reset_at": None,
                "as_of": NOW,
                "seq": n + 1,
                "emitted_at": NOW,
            }
            await producer.send(topics.budget_verdicts, VERDICT.encode(verdict), key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()


def test_two_sink_stages_split_the_partitions_and_store_each_record_once(
    kafka_bootstrap: str, topics: Topics, clickhouse_dsn: str, tmp_path: Path
) -> None:
    config = AggregatorConfig(
        bootstrap=kafka_bootstrap,
        clickhouse_dsn=clickhouse_dsn,
        topic_prefix=topics.prefix,
        app_id=f"{topics.prefix}agg",
        data_dir=tmp_path,
        partitions=PARTITIONS,
        sink_batch_size=700,
        sink_batch_seconds=0.2,
        session_timeout_s=6.0,
    )
    per_partition = 3_000

    async def scenario() -> tuple[list[Any], dict[tuple[str, int], int]]:
        writers = [ClickHouseWriter(clickhouse_dsn, Metrics()) for _ in range(2)]
        first, second = (SinkStage(config, topics, w, w.metrics) for w in writers)
        await publish_priced(kafka_bootstrap, topics, range(0, 1_000))
        await first.start()
        try:
            # the first stage is storing when the second joins: its partitions move mid-stream
            while writers[0].metrics.sink_batches < 2:
                await asyncio.sleep(0.05)
            await second.start()
            # the rest once the group gave both stages partitions: each has records to store
            # (a stage fast enough would otherwise store them all before the rebalance ends)
            while not (first.assigned and second.assigned):
                await asyncio.sleep(0.05)
            await publish_priced(kafka_bootstrap, topics, range(1_000, per_partition))
            await publish_verdicts(kafka_bootstrap, topics, 50)
            deadline = time.monotonic() + 180
            goal = PARTITIONS * per_partition
            query = (
                "SELECT count(), uniqExact(source_partition, source_offset), "
                "countIf(user_id = 'mixed@example.com'), "
                "(SELECT count() FROM budget_state) FROM usage_events"
            )
            rows: list[Any] = []
            while time.monotonic() < deadline:
                rows = list((await writers[0].read(query))[0])
                if rows[0] >= goal and rows[3] >= 50:
                    break
                await asyncio.sleep(0.5)
            # both stages stored batches: the partitions really were shared
            assert all(w.metrics.sink_batches for w in writers)
            # a stored batch is committed after it: every record's offset, in the end
            ends = {(topics.usage_priced, p): per_partition for p in range(PARTITIONS)}
            offsets: dict[tuple[str, int], int] = {}
            while time.monotonic() < deadline:
                offsets = await committed(kafka_bootstrap, config.sink_app_id)
                verdicts = sum(v for (t, _), v in offsets.items() if t == topics.budget_verdicts)
                if all(offsets.get(k) == v for k, v in ends.items()) and verdicts == 50:
                    break
                await asyncio.sleep(0.5)
        finally:
            await second.stop()
            await first.stop()
            for w in writers:
                if w.sink is not None:
                    w.sink.client.close()
        return rows, offsets

    rows, offsets = asyncio.run(scenario())
    total = PARTITIONS * per_partition
    mixed = PARTITIONS * len([o for o in range(UPGRADED_AT) if o % 11 == 0])
    # every row once, the non-canonical ones decoded and stored canonical; every verdict
    assert rows == [total, total, mixed, 50]
    for partition in range(PARTITIONS):
        assert offsets[(topics.usage_priced, partition)] == per_partition
    assert sum(v for (t, _), v in offsets.items() if t == topics.budget_verdicts) == 50
