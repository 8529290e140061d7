"""The counting stage's state: counters and event-id dedupe per usage.raw partition.

In memory while a worker owns a partition; durable in two compacted changelog
topics (co-partitioned with usage.raw: changelog partition p holds the state of
source partition p), written once per counter per batch and once per new event
id, and flushed before the source offsets are committed. A worker that is given
a partition reads both changelog partitions from the start before it folds a
record of it (``recover``), so after a crash or a rebalance the state is exactly
what the flushed changelog says; records past the committed offset are then
re-delivered and the counters' fences and the dedupe entries absorb them.

Values: a counter's ``CounterState.to_json()`` as compact JSON; a dedupe entry's
value is the position (``partition:offset``) that first carried the event id.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from aggregator.fold import CounterState

log = logging.getLogger(__name__)


@dataclass
class PartitionState:
    counters: dict[str, CounterState] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)


@dataclass
class RecoveryStats:
    partitions: int = 0
    counters: int = 0
    seen: int = 0
    records: int = 0
    seconds: float = 0.0


def encode_counter(state: CounterState) -> bytes:
    return json.dumps(state.to_json(), separators=(",", ":")).encode()


def decode_counter(value: bytes) -> CounterState:
    return CounterState.from_json(json.loads(value))


class CountingStore:
    """The state of the partitions this worker owns."""

    def __init__(self) -> None:
        self.partitions: dict[int, PartitionState] = {}

    def counter(self, partition: int, key: str) -> CounterState | None:
        return self.partitions[partition].counters.get(key)

    def seen(self, partition: int, event_id: str) -> str | None:
        return self.partitions[partition].seen.get(event_id)

    def drop(self, partitions: set[int]) -> None:
        for partition in partitions:
            self.partitions.pop(partition, None)

    async def recover(
        self, bootstrap: str, partitions: set[int], counters_topic: str, seen_topic: str
    ) -> RecoveryStats:
        """Read both changelogs of ``partitions`` from the start to their current end."""
        stats = RecoveryStats(partitions=len(partitions))
        if not partitions:
            return stats
        started = time.perf_counter()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in (counters_topic, seen_topic) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            pending = {tp for tp in tps if ends[tp] > 0}
            counters: dict[int, dict[str, bytes | None]] = {p: {} for p in partitions}
            seen: dict[int, dict[str, str]] = {p: {} for p in partitions}
            while pending:
                batches = await consumer.getmany(timeout_ms=500, max_records=50_000)
                for tp, messages in batches.items():
                    stats.records += len(messages)
                    if tp.topic == counters_topic:
                        into = counters[tp.partition]
                        for m in messages:
                            if m.key is not None:
                                into[m.key.decode()] = m.value
                    else:
                        seen_into = seen[tp.partition]
                        for m in messages:
                            if m.key is None:
                                continue
                            if m.value is None:
                                seen_into.pop(m.key.decode(), None)
                            else:
                                seen_into[m.key.decode()] = m.value.decode()
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
        finally:
            await consumer.stop()
        for partition in partitions:
            state = self.partitions[partition] = PartitionState(seen=seen[partition])
            for key, value in counters[partition].items():
                if value is not None:
                    state.counters[key] = decode_counter(value)
            stats.counters += len(state.counters)
            stats.seen += len(state.seen)
        stats.seconds = time.perf_counter() - started
        log.info(
            "recovered %d partitions: %d counters, %d event ids from %d records in %.2fs",
            stats.partitions,
            stats.counters,
            stats.seen,
            stats.records,
            stats.seconds,
        )
        return stats
