"""Read topics from their start to the end offsets seen at start, and never hang doing it.

Every room reads some topic whole: the compacted reference and keys topics before a
follower is ready, the ledger for a verify or a replay, the snapshots, the dead letters.
They all read the same way, here:

- the ends are taken once, after seeking to the beginning; records that arrive later are
  not part of the read (a follower goes on from exactly there: after the read every
  partition's position is its end, records fetched past it are given back by a seek);
- a partition is done when its position reaches its end, not when a record with the end's
  offset arrives (compaction, deleted segments and transaction markers leave gaps);
- a read that makes no progress for ``stall_s`` (the broker gone, an end past the log)
  raises :class:`TopicReadStalled` naming every unfinished partition and its offsets.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from schemas.errors import SpendbusError

#: seconds a read may go without any partition's position moving before it is a stall
STALL_S = 30.0

#: what one fetch waits at most, so a stall is seen within about this of ``stall_s``
_POLL_MS = 1000

Records = list[ConsumerRecord[Any, Any]]


class TopicReadStalled(SpendbusError):
    """A read to the end offsets made no progress within its stall window."""

    retriable = True

    def __init__(self, stall_s: float, behind: Mapping[TopicPartition, tuple[int, int]]) -> None:
        where = ", ".join(
            f"{tp.topic}[{tp.partition}] at offset {position} of end {end}"
            for tp, (position, end) in sorted(behind.items())
        )
        super().__init__(f"reading to the end offsets made no progress in {stall_s:g} s: {where}")
        #: the unfinished partitions: (position, end) each
        self.behind = dict(behind)


async def start_at_beginning(
    consumer: AIOKafkaConsumer, partitions: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """Assign ``partitions``, seek them to their first offset; the end offsets now."""
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)
    ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
    return ends


async def read_until(
    consumer: AIOKafkaConsumer,
    ends: Mapping[TopicPartition, int],
    *,
    stall_s: float = STALL_S,
    max_records: int | None = None,
) -> AsyncIterator[tuple[TopicPartition, Records]]:
    """The records of an assigned, positioned ``consumer`` below ``ends``, by partition.

    Yields (partition, records) per fetched partition (never an empty list); returns once
    every partition's position reached its end, and leaves each position at its end."""
    pending = {tp for tp, end in ends.items() if await consumer.position(tp) < end}
    positions = {tp: await consumer.position(tp) for tp in pending}
    last_progress = time.monotonic()
    while pending:
        fetched = await consumer.getmany(*pending, timeout_ms=_POLL_MS, max_records=max_records)
        for tp, messages in fetched.items():
            end = ends[tp]
            if messages and messages[-1].offset >= end:  # a partition's records come in order
                messages = [m for m in messages if m.offset < end]
                consumer.seek(tp, end)  # what lies past the end is the follower's, not ours
            if messages:
                yield tp, messages
        for tp in list(pending):
            position = await consumer.position(tp)
            if position >= ends[tp]:
                pending.discard(tp)
            if position != positions[tp]:
                positions[tp] = position
                last_progress = time.monotonic()
        if pending and time.monotonic() - last_progress > stall_s:
            raise TopicReadStalled(stall_s, {tp: (positions[tp], ends[tp]) for tp in pending})


class TopicReader:
    """One read of whole topics with a consumer of its own::

        async with TopicReader(bootstrap, topic, security=security) as reader:
            async for partition, records in reader:
                ...

    ``ends`` (the end offsets seen at start) is known once entered, e.g. for progress."""

    def __init__(
        self,
        bootstrap: str,
        *topics: str,
        security: KafkaSecurity = PLAINTEXT,
        stall_s: float = STALL_S,
        max_records: int | None = None,
        fetch_bytes: int | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.security = security
        self.stall_s = stall_s
        self.max_records = max_records
        self.fetch_bytes = fetch_bytes
        self.ends: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> TopicReader:
        partitions = await topic_partitions(self.bootstrap, *self.topics, security=self.security)
        options: dict[str, Any] = {}
        if self.fetch_bytes is not None:
            options["max_partition_fetch_bytes"] = self.fetch_bytes
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **options,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            self.ends = await start_at_beginning(consumer, partitions)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def __aiter__(self) -> AsyncIterator[tuple[TopicPartition, Records]]:
        if self._consumer is None:
            raise RuntimeError("TopicReader is read inside `async with`")
        return read_until(
            self._consumer, self.ends, stall_s=self.stall_s, max_records=self.max_records
        )


async def read_latest_values(
    bootstrap: str,
    topic: str,
    *,
    security: KafkaSecurity = PLAINTEXT,
    stall_s: float = STALL_S,
    fetch_bytes: int | None = None,
) -> dict[bytes, bytes | None]:
    """Every key's last value (None: a tombstone) up to the end offsets seen at start:
    what a compacted topic says now. Records without a key are not in it."""
    values: dict[bytes, bytes | None] = {}
    async with TopicReader(
        bootstrap, topic, security=security, stall_s=stall_s, fetch_bytes=fetch_bytes
    ) as reader:
        async for _, records in reader:
            for record in records:
                if record.key is not None:
                    values[record.key] = record.value
    return values
