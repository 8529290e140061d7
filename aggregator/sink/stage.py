"""The sink stage: usage.priced and budget.verdicts into ClickHouse, in large batches.

Why not a Faust agent: Faust's per-message stream path (an Event, a conductor dispatch,
a queue hop and an ack per record) costs more than the whole insert, which capped the
sink end to end far below the counting stage, off that path. Like the counting stage, this stage reads with aiokafka's ``getmany`` (its own
consumer in the sink group ``config.sink_app_id``, client id ``sink_client_id``: how
``sink_owner.py`` tells its own earlier process from a second sink) and hands whole
batches to :class:`~aggregator.agents.ClickHouseWriter`.

A batch is up to ``sink_batch_size`` records, or what came within ``sink_batch_seconds``
of its first record. Per batch, in this order (aggregator/sink/README.md, flush order):

  1. its usage.priced records, in partition order, into ``usage_events``
     (``ClickHouseSink.write_messages``: fenced by source position, one deduplication
     token per INSERT, records with the store-row header stored from their Avro bytes);
  2. its verdicts into ``budget_state``;
  3. only then the batch's offsets are committed. While ClickHouse is away the same batch
     is retried with backoff and nothing is committed; Kafka keeps the records.

On revocation the batch in flight is finished and committed first, records collected
from revoked partitions are dropped (their new owner reads them from the last commit),
and the sink forgets those partitions' fences: another worker may advance them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError, KafkaError

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.rebalance import StageRebalance
from aggregator.sink.clickhouse import ClickHouseSink
from aggregator.sink.owner import sink_client_id
from schemas.topics import Topics

log = logging.getLogger(__name__)

#: bytes one fetch may bring per partition and in all: a batch of 50k priced records is
#: ~30 MB, so a few fetches fill it
PARTITION_FETCH_BYTES: Final = 8 * 1024 * 1024
FETCH_BYTES: Final = 32 * 1024 * 1024
#: records taken from the consumer per call while a batch fills (the loop yields between)
RECORDS_PER_FETCH: Final = 4_000
#: a sink waiting for ClickHouse does not poll; after this long without a poll the consumer
#: leaves the group and its partitions move (a re-delivery the fences absorb)
MAX_POLL_INTERVAL_MS: Final = 15 * 60 * 1000


class BatchWriter(Protocol):
    """What the stage needs of its writer (``aggregator.agents.ClickHouseWriter``): open
    the store once, write a batch until it is stored."""

    @property
    def sink(self) -> ClickHouseSink | None: ...

    async def open(self) -> ClickHouseSink: ...

    async def write_messages_until_done(self, messages: Sequence[Any]) -> None: ...

    async def write_verdict_messages_until_done(self, messages: Sequence[Any]) -> None: ...


class SinkStage:
    """Owns the sink group's consumer on usage.priced and budget.verdicts."""

    def __init__(
        self,
        config: AggregatorConfig,
        topics: Topics,
        writer: BatchWriter,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.topics = topics
        self.writer = writer
        self.metrics = metrics
        self.assigned: set[TopicPartition] = set()
        self.on_crash: Callable[[BaseException], Awaitable[None]] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._crash_task: asyncio.Future[None] | None = None
        #: records read and not yet stored, per partition (pruned on revocation)
        self._collected: dict[TopicPartition, list[Any]] = {}
        #: held while a batch is stored: a revocation waits for it, then commits it
        self._lock = asyncio.Lock()
        #: source partition -> next offset to store (for the lag gauge)
        self._stored_to: dict[TopicPartition, int] = {}
        #: the batch being stored while the next one is read
        self._in_flight: asyncio.Task[None] | None = None
        #: the offsets of the batch stored last, until committed
        self._uncommitted: dict[TopicPartition, int] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.writer.open()
        backoff = 0.5
        while True:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.config.bootstrap,
                group_id=self.config.sink_app_id,
                client_id=sink_client_id(self.config),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
                fetch_max_bytes=FETCH_BYTES,
                max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
                session_timeout_ms=int(self.config.session_timeout_s * 1000),
                heartbeat_interval_ms=int(self.config.session_timeout_s * 250),
                **self.config.kafka_security.client_kwargs(),
            )
            try:
                await consumer.start()
                break
            except KafkaConnectionError as exc:
                # the broker away while the store opened (the worker is serving already):
                # the stage waits for it, as its reads and commits do, never the worker's end
                await consumer.stop()
                log.warning("sink stage: %s; connecting again in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
        self._consumer = consumer
        self._consumer.subscribe(
            [self.topics.usage_priced, self.topics.budget_verdicts], listener=StageRebalance(self)
        )
        self._task = asyncio.create_task(self._run(), name="sink-stage")
        self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            # what was collected and not stored is simply not committed: read again later
            await self._consumer.stop()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("sink stage stopped: %r", exc)
            if self.on_crash is not None:
                self._crash_task = asyncio.ensure_future(self.on_crash(exc))

    def lag(self) -> dict[str, int]:
        """Records of the assigned partitions not stored yet (as of the last fetch)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        behind: dict[str, int] = {}
        for tp in self.assigned:
            end = consumer.highwater(tp)
            if end is None:
                continue
            stored = self._stored_to.get(tp, end)
            behind[tp.topic] = behind.get(tp.topic, 0) + max(0, end - stored)
        return behind

    # --- rebalancing -------------------------------------------------------------------
    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        # the batch in flight is stored first: the new owner reads the fences only after its
        # rows landed. Its commit is made here, in the listener: a commit from another task
        # during the rebalance would wait for the rebalance, which waits for this listener
        async with self._lock:
            await self._commit_stored()
            gone = set(revoked)
            for tp in gone:
                self._collected.pop(tp, None)
                self._stored_to.pop(tp, None)
            self.assigned -= gone
            partitions = {tp.partition for tp in gone if tp.topic == self.topics.usage_priced}
            if partitions and self.writer.sink is not None:
                # another worker may write these partitions now: re-read their fences later
                self.writer.sink.forget(partitions)

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        self.assigned = set(assigned)
        consumer = self._consumer
        assert consumer is not None
        for tp in assigned:  # the lag gauge counts from the last commit until a batch is stored
            if tp not in self._stored_to:
                self._stored_to[tp] = await consumer.committed(tp) or 0

    # --- the loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        # the next batch is read while the one before is stored (at most one in flight, in
        # order: a batch's inserts start only after the previous batch was committed)
        try:
            while True:
                await self._collect()
                await self._settled()
                async with self._lock:
                    batch, self._collected = self._collected, {}
                if batch:
                    self._in_flight = asyncio.create_task(self._store_locked(batch))
        finally:
            if self._in_flight is not None:
                self._in_flight.cancel()

    async def _settled(self) -> None:
        """Wait for the batch in flight (its failure stops the stage)."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await task

    async def _store_locked(self, batch: dict[TopicPartition, list[Any]]) -> None:
        started = time.perf_counter()
        async with self._lock:
            await self._store(batch)
        # outside the lock: a revocation meanwhile commits it itself (on_revoked)
        await self._commit_stored()
        self.metrics.record_sink_batch(
            sum(len(m) for m in batch.values()), (time.perf_counter() - started) * 1000
        )

    async def _commit_stored(self) -> None:
        """Commit the offsets of the batch stored last, unless that was done already."""
        offsets, self._uncommitted = self._uncommitted, None
        if not offsets:
            return
        consumer = self._consumer
        assert consumer is not None
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # a rebalance took the partitions: their records are re-delivered, and fenced
            log.warning("sink offset commit failed (%s); the records will be re-delivered", exc)
        self._stored_to.update(offsets)

    async def _collect(self) -> None:
        """Read until a batch is full or its time is up (or a second passed with nothing)."""
        consumer = self._consumer
        assert consumer is not None
        size = self.config.sink_batch_size
        deadline: float | None = None
        while True:
            held = sum(len(m) for m in self._collected.values())
            if held >= size:
                return
            wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            # a few thousand records a call: making a whole batch's records at once holds the
            # loop too long for the verdicts' latency
            fetched = await consumer.getmany(
                timeout_ms=int(wait * 1000), max_records=min(size - held, RECORDS_PER_FETCH)
            )
            for tp, messages in fetched.items():
                self._collected.setdefault(tp, []).extend(messages)
            await asyncio.sleep(0)  # getmany does not suspend while it has records buffered
            if self._collected and deadline is None:
                deadline = time.monotonic() + self.config.sink_batch_seconds
            if deadline is None:
                if not fetched:
                    return  # nothing for a second: let the loop go round
            elif time.monotonic() >= deadline:
                return

    async def _store(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Steps 1 and 2 of the module docstring for one batch; its offsets are then the
        ones to commit (step 3, ``_commit_stored``)."""
        priced = [
            m
            for tp, ms in sorted(batch.items())
            if tp.topic == self.topics.usage_priced
            for m in ms
        ]
        verdicts = [
            m
            for tp, ms in sorted(batch.items())
            if tp.topic == self.topics.budget_verdicts
            for m in ms
        ]
        if priced:
            await self.writer.write_messages_until_done(priced)
        if verdicts:
            await self.writer.write_verdict_messages_until_done(verdicts)
        self._uncommitted = {tp: ms[-1].offset + 1 for tp, ms in batch.items() if ms}
