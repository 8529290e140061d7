"""Keyed records on compacted topics: publish them and wait for their acks, and follow
topics into a live view that also holds the follower's own acknowledged writes.

Reading them back whole once: runtime.topic_reader.read_latest_values; the follower
under the view: runtime/topic_follower.py.

:class:`CompactedView` reads its topics from the start, is ready once it reached the end
offsets it saw then, and keeps applying what comes after. A writer applies its own
acknowledged record at once (:meth:`CompactedView.apply_written`), so a read right after
a write sees it (read your writes); the follower, behind on that partition, later meets
older records of the same key and skips them: a key's value only ever moves forward in
offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.topic_follower import TopicFollower

#: topic -> key -> (offset, value) of what a view holds (value None: a tombstone)
Entries = dict[bytes, tuple[int, bytes | None]]


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
        await publish_with(producer, topic, records)
    finally:
        await producer.stop()


async def publish_with(
    producer: AIOKafkaProducer, topic: str, records: Sequence[tuple[bytes, bytes | None]]
) -> list[tuple[int, int]]:
    """Publish keyed records through a started producer; (partition, offset) of each once
    acknowledged, in order."""
    futures = [await producer.send(topic, key=key, value=value) for key, value in records]
    placed = []
    for future in futures:
        metadata = await future
        placed.append((metadata.partition, metadata.offset))
    return placed


class CompactedView:
    """The latest value of every key of ``topics``, followed live.

    ``start`` (returns once caught up with the end offsets seen at start) → reads
    (:meth:`values`, :meth:`get`) → :meth:`stop`. ``on_change(topic, key, value)`` is called
    for every value that moves the view (a follower's or a writer's)."""

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        *,
        security: KafkaSecurity = PLAINTEXT,
        on_change: Callable[[str, bytes, bytes | None], None] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.security = security
        self.on_change = on_change
        self._entries: dict[tuple[str, int], Entries] = {}
        self._follower = TopicFollower(
            bootstrap, self.topics, self._apply, security=security, name="compacted view"
        )

    async def start(self) -> None:
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()

    async def caught_up(self, topic: str) -> None:
        """Returns once the view has applied every record of ``topic`` the broker held when
        called: what another process wrote before is read (the view is started)."""
        consumer = self._follower.consumer
        assert consumer is not None, "caught_up() needs a started view"
        ends = await consumer.end_offsets([tp for tp in consumer.assignment() if tp.topic == topic])
        for tp, end in ends.items():
            # the follower applies a fetch whole before it yields, so a position past a
            # record means the record is in the view
            while await consumer.position(tp) < end:
                await asyncio.sleep(0.01)

    def apply_written(
        self, topic: str, placed: Sequence[tuple[int, int]], records: Sequence[tuple[bytes, Any]]
    ) -> None:
        """A writer's acknowledged records ((partition, offset) from :func:`publish_with`)."""
        for (partition, offset), (key, value) in zip(placed, records, strict=True):
            self._apply(topic, partition, offset, key, value)

    def _apply(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        if key is None:
            return
        entries = self._entries.setdefault((topic, partition), {})
        held = entries.get(key)
        if held is not None and held[0] >= offset:
            return  # already past it (a writer's own record came first)
        entries[key] = (offset, value)
        if self.on_change is not None:
            self.on_change(topic, key, value)

    def values(self, topic: str) -> dict[bytes, bytes]:
        """Every live key of ``topic`` and its value (tombstones left out)."""
        out: dict[bytes, bytes] = {}
        for (name, _), entries in self._entries.items():
            if name == topic:
                out.update((k, v) for k, (_, v) in entries.items() if v is not None)
        return out

    def get(self, topic: str, key: bytes) -> bytes | None:
        for (name, _), entries in self._entries.items():
            if name == topic and key in entries:
                return entries[key][1]
        return None
