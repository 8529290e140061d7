"""Read a compacted topic from the beginning to its current end: the live value of every key."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.kafka import PLAINTEXT, KafkaSecurity, topic_partitions


async def read_compacted(
    bootstrap: str, topic: str, timeout_s: float = 30.0, *, security: KafkaSecurity = PLAINTEXT
) -> dict[bytes, bytes | None]:
    """Every key's last value (None = tombstone) up to the end offsets seen at start."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        **security.client_kwargs(),
    )
    await consumer.start()
    try:
        partitions = await topic_partitions(bootstrap, topic, security=security)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: dict[bytes, bytes | None] = {}
        pending = {tp for tp in partitions if ends[tp] > 0}
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=int(timeout_s * 1000))
            if not batches:
                raise TimeoutError(f"reading {topic!r} stalled before its end offsets")
            for tp, messages in batches.items():
                for message in messages:
                    if message.key is not None:
                        values[message.key] = message.value
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
        return values
    finally:
        await consumer.stop()


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
