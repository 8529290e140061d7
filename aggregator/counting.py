"""The counting stage: usage.raw in large batches, counters, verdicts, outputs.

Why not a Faust agent: Faust's stream path costs ~220 µs a message on the
development VM even for an empty agent (an Event, a conductor dispatch, a queue
hop and an ack per record), which caps a worker at ~4.5k events/s before any
work. This stage reads usage.raw with aiokafka's ``getmany`` (thousands of
records a call), folds each batch with :class:`~aggregator.process.BatchProcessor`
and writes whole record batches with ``create_batch``/``send_batch``, so what is
paid per event is the decode, the fold and one append per output record. It runs
inside the Faust worker (started by a service in ``agents.py``) beside the web
pages and the ClickHouse sink agents.

Delivery: at-least-once with offset-fenced, deduplicated state (DESIGN.md
invariant 1; Faust's exactly_once mode is avoided on purpose). A checkpoint, every
``commit_seconds`` and before partitions are given up, runs in this order:

  1. send every verdict the coalescer still holds (a committed record never has its
     verdict waiting in memory);
  2. flush the producer: priced events, verdicts, alerts, dead letters and both
     changelogs (counters with their fences, event-id dedupe) of every batch so far;
  3. check each delivery: one failure aborts the checkpoint and stops the worker,
     nothing is committed, the records are re-delivered to the next owner;
  4. commit the source offsets past the last folded record of each partition.

A crash anywhere re-delivers records from the last commit; the changelog may
already hold some of their effects, which the counters' fences and the dedupe
entries (same partition, same offset = re-delivery) make harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError, KafkaError, TopicAlreadyExistsError
from aiokafka.partitioner import DefaultPartitioner

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.process import BatchProcessor
from aggregator.state import CountingStore, encode_counter
from aggregator.verdicts import VerdictCoalescer
from schemas.topics import COMPACTED_CONFIG, Topics

log = logging.getLogger(__name__)

#: bytes per record batch the stage builds (below the broker's 1 MiB message limit)
RECORD_BATCH_BYTES = 512 * 1024


class CountingError(Exception):
    """The counting stage cannot go on (a delivery failed): the worker must stop."""


@dataclass
class _Outgoing:
    """Record batches being filled, per (topic, partition); sent whole."""

    producer: AIOKafkaProducer
    open: dict[tuple[str, int], Any] = field(default_factory=dict)
    full: list[tuple[str, int, Any]] = field(default_factory=list)

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        where = (topic, partition)
        batch = self.open.get(where)
        if batch is None:
            batch = self.open[where] = self.producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            self.full.append((topic, partition, batch))
            batch = self.open[where] = self.producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise CountingError(f"a record of {len(value)} bytes does not fit a record batch")

    async def send(self) -> list[asyncio.Future[Any]]:
        """Hand every batch to the producer; the futures resolve when the broker has them."""
        sends = [*self.full, *((t, p, b) for (t, p), b in self.open.items())]
        self.full = []
        self.open = {}
        return [await self.producer.send_batch(b, t, partition=p) for t, p, b in sends]


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, stage: CountingStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.stage.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.stage.on_assigned(assigned)


class CountingStage:
    """Owns a usage.raw consumer (group ``config.counting_group``), a producer and the state."""

    def __init__(
        self,
        config: AggregatorConfig,
        topics: Topics,
        processor: BatchProcessor,
        metrics: Metrics,
        reference_ready: asyncio.Event,
    ) -> None:
        self.config = config
        self.topics = topics
        self.processor = processor
        self.metrics = metrics
        self.reference_ready = reference_ready
        self.store = CountingStore()
        self.verdicts = VerdictCoalescer(config.batch_seconds)
        #: usage.raw partitions this worker owns and has recovered
        self.owned: set[int] = set()
        self.rebalancing = True
        self._lock = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._outgoing: _Outgoing | None = None
        self._deliveries: list[asyncio.Future[Any]] = []
        #: source partition -> next offset to commit
        self._positions: dict[int, int] = {}
        self._last_checkpoint = time.monotonic()
        self._partitions: dict[str, list[int]] = {}
        self._verdict_partition: dict[bytes, int] = {}
        self._partitioner = DefaultPartitioner()
        self._task: asyncio.Task[None] | None = None
        self.on_crash: Callable[[BaseException], Awaitable[None]] | None = None
        self._crash_task: asyncio.Future[None] | None = None

    @property
    def serving(self) -> bool:
        return self.reference_ready.is_set() and bool(self.owned) and not self.rebalancing

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await self._ensure_changelogs()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.config.bootstrap,
            acks="all",
            linger_ms=0,
            max_batch_size=RECORD_BATCH_BYTES,
            max_request_size=4 * RECORD_BATCH_BYTES,
        )
        await self._producer.start()
        self._outgoing = _Outgoing(self._producer)
        for topic in (
            self.topics.usage_priced,
            self.topics.budget_verdicts,
            self.topics.budget_alerts,
            self.topics.usage_dlq,
            self.config.counter_changelog,
            self.config.seen_changelog,
        ):
            self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.config.bootstrap,
            group_id=self.config.counting_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=16 * 1024 * 1024,
            session_timeout_ms=int(self.config.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.config.session_timeout_s * 250),
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name="counting-stage")
        self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            if self._consumer is not None and self.owned:
                async with self._lock:
                    await self._checkpoint()
        except Exception:  # stopping anyway: what was not committed is re-delivered
            log.exception("last checkpoint failed")
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("counting stage stopped: %r", exc)
            if self.on_crash is not None:
                self._crash_task = asyncio.ensure_future(self.on_crash(exc))

    async def _ensure_changelogs(self) -> None:
        """Create the two changelog topics, co-partitioned with usage.raw, if missing."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.config.bootstrap)
        await admin.start()
        try:
            source = await admin.describe_topics([self.topics.usage_raw])
            partitions = len(source[0]["partitions"]) or self.config.partitions
            existing = set(await admin.list_topics())
            wanted = [
                NewTopic(name, partitions, 1, topic_configs=dict(COMPACTED_CONFIG))
                for name in (self.config.counter_changelog, self.config.seen_changelog)
                if name not in existing
            ]
            if wanted:
                response = await admin.create_topics(wanted)
                for name, code, *_ in response.topic_errors:
                    if code not in (0, TopicAlreadyExistsError.errno):
                        raise CountingError(f"cannot create changelog {name}: error {code}")
        finally:
            await admin.close()

    # --- rebalancing -------------------------------------------------------------------
    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            self.rebalancing = True
            if self.owned:
                # the partitions may go to another worker: everything folded so far is
                # made durable and committed before it may read them
                await self._checkpoint()

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            wanted = {tp.partition for tp in assigned if tp.topic == self.topics.usage_raw}
            gone = self.owned - wanted
            self.store.drop(gone)
            for partition in gone:
                self._positions.pop(partition, None)
            new = wanted - self.owned
            # a partition kept across the rebalance had no other writer: its state is current
            await self.store.recover(
                self.config.bootstrap,
                new,
                self.config.counter_changelog,
                self.config.seen_changelog,
            )
            self.owned = wanted
            if gone or new:
                self.verdicts.forget()
            self.rebalancing = False

    # --- the loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        await self.reference_ready.wait()  # budgets and prices whole before the first batch
        consumer.subscribe([self.topics.usage_raw], listener=_Rebalance(self))
        interval = self.config.commit_seconds
        while True:
            timeout = self._last_checkpoint + interval - time.monotonic()
            held = self.verdicts.next_due()
            if held is not None:
                timeout = min(timeout, held - time.monotonic())
            batches = await consumer.getmany(
                timeout_ms=max(0, int(timeout * 1000)), max_records=self.config.batch_size
            )
            async with self._lock:
                if batches:
                    await self._fold(batches)
                now = time.monotonic()
                if now - self._last_checkpoint >= interval:
                    await self._checkpoint()
                else:
                    due = self.verdicts.due(now)
                    if due:
                        await self._send_verdicts(due)

    async def _fold(self, batches: dict[TopicPartition, list[Any]]) -> None:
        started = time.perf_counter()
        records = [
            m for tp, messages in batches.items() if tp.partition in self.owned for m in messages
        ]
        if not records:
            return
        out = self.processor.process(records, self.store.counter, self.store.seen)
        folded = time.perf_counter()
        outgoing = self._outgoing
        assert outgoing is not None
        add = outgoing.add
        store = self.store.partitions
        counters_topic = self.config.counter_changelog
        for (partition, key), state in out.counter_states.items():
            store[partition].counters[key] = state
            add(counters_topic, partition, key.encode(), encode_counter(state))
        seen_topic = self.config.seen_changelog
        for (partition, event_id), position in out.seen_writes.items():
            store[partition].seen[event_id] = position
            add(seen_topic, partition, event_id.encode(), position.encode())
        written = time.perf_counter()
        priced_topic = self.topics.usage_priced
        for partition, org, priced in out.priced:
            add(priced_topic, partition, org, priced)
        now = time.monotonic()
        offer = self.verdicts.offer
        send_now = [(k, c) for k, c in out.verdict_changes.items() if offer(k, c, now)]
        self._add_verdicts(send_now)
        for counter, alert in out.alerts:
            add(
                self.topics.budget_alerts,
                self._partition_of(self.topics.budget_alerts, counter),
                counter,
                alert,
            )
        for raw_key, letter in out.dead_letters:
            add(
                self.topics.usage_dlq,
                self._partition_of(self.topics.usage_dlq, raw_key),
                raw_key,
                letter,
            )
        self._deliveries.extend(await outgoing.send())
        for message in records:
            self._positions[message.partition] = message.offset + 1
        sent = time.perf_counter()
        self.metrics.record_batch(out.stats, len(send_now), sent - started)
        self.metrics.record_phases(
            fold=folded - started, state=written - folded, sends=sent - written
        )
        if out.unpriced_models:
            self.metrics.unpriced_models.update(out.unpriced_models)

    def _add_verdicts(self, verdicts: list[tuple[str, Any]]) -> None:
        if not verdicts:
            return
        outgoing = self._outgoing
        assert outgoing is not None
        topic = self.topics.budget_verdicts
        emitted = self._emitted_at()
        for key, change in verdicts:
            key_bytes = key.encode()
            outgoing.add(
                topic, self._verdict_partition_of(key_bytes), key_bytes, change.encode(key, emitted)
            )

    async def _send_verdicts(self, verdicts: list[tuple[str, Any]]) -> None:
        self._add_verdicts(verdicts)
        outgoing = self._outgoing
        assert outgoing is not None
        self._deliveries.extend(await outgoing.send())
        self.metrics.record_verdicts(len(verdicts))

    async def _checkpoint(self) -> None:
        """Steps 1-4 of the module docstring, in that order."""
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        # 1. held verdicts go out now
        await self._send_verdicts(self.verdicts.due(time.monotonic(), force=True))
        # 2. every output and changelog record so far reaches the broker
        await producer.flush()
        # 3. a failed delivery stops here: nothing is committed
        deliveries, self._deliveries = self._deliveries, []
        for delivery in deliveries:
            if delivery.cancelled() or delivery.exception() is not None:
                raise CountingError(f"an output batch was not delivered: {delivery!r}")
        # 4. the source offsets
        offsets = {
            TopicPartition(self.topics.usage_raw, partition): offset
            for partition, offset in self._positions.items()
            if partition in self.owned
        }
        if offsets:
            try:
                await consumer.commit(offsets)
            except (CommitFailedError, KafkaError) as exc:
                # a rebalance took the partitions: their records are re-delivered, fenced
                log.warning("offset commit failed (%s); the records will be re-delivered", exc)
        self._positions.clear()
        self._last_checkpoint = time.monotonic()

    # --- partitions of the outputs -------------------------------------------------------
    def _verdict_partition_of(self, key: bytes) -> int:
        partition = self._verdict_partition.get(key)
        if partition is None:
            if len(self._verdict_partition) > 500_000:
                self._verdict_partition.clear()
            partition = self._verdict_partition[key] = self._partition_of(
                self.topics.budget_verdicts, key
            )
        return partition

    def _partition_of(self, topic: str, key: bytes | None) -> int:
        """The partition Kafka's default partitioner picks (murmur2 of the key), so a
        compacted topic keeps one value per key whichever client wrote it."""
        partitions = self._partitions[topic]
        if key is None:
            return partitions[0]
        return int(self._partitioner(key, partitions, partitions))

    @staticmethod
    def _emitted_at() -> datetime:
        return datetime.now(UTC)
