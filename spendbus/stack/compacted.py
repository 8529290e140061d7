"""Publish keyed records (a compacted topic's values and tombstones) and wait for their acks.

Reading them back whole: runtime.topic_reader.read_latest_values."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from runtime.kafka import PLAINTEXT, KafkaSecurity


async def publish(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes, bytes | None]],
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Publish keyed records and wait until the broker acknowledged all of them."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **security.client_kwargs()
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for key, value in records]
        for future in futures:
            await future
    finally:
        await producer.stop()
