"""The background sender: drains the spool, in order, to Kafka.

One task per publisher. It owns an idempotent aiokafka producer
(``enable_idempotence=True``, ``acks="all"``) and loops:

1. connect: start a producer and learn the partitions of usage.raw; on failure,
   back off (doubling up to ``retry_backoff_max_ms``) and try again, for ever;
2. read the spool from the acknowledged position, in chunks, and append each
   record to a per-partition batch (partition = murmur2(key) like every Kafka
   client, key = org_id); submit the batches without awaiting each ack;
3. when every batch of a chunk *and of every chunk before it* is acknowledged,
   advance the spool's acknowledged position past the chunk (``Spool.ack``) and,
   at most every ``cursor_interval_ms``, write it to disk (``Spool.persist``);
4. on any failure (a batch failed, the producer died, the broker went away for
   good): drop the producer, back off, reconnect and go back to 2 from the
   acknowledged position. Nothing is re-encoded: the bytes sent again are the
   spooled bytes, with the event ids they were created with.

Ordering: records of one key go to one partition in spool order; the
idempotent producer keeps one batch in flight per partition and retries it
until it is written, so a later batch of a partition cannot land before an
earlier one. After a reconnect, the records between the acknowledged position
and the failure are sent again: some may be in the topic twice, same event id,
and the first copies are in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError
from aiokafka.partitioner import murmur2

from ingest.publisher.config import PublisherConfig
from ingest.publisher.metrics import PublisherMetrics
from ingest.publisher.spool import Spool, SpooledRecord

log = logging.getLogger(__name__)

#: distinct keys whose partition is remembered (murmur2 is pure Python)
_PARTITION_CACHE_SIZE = 100_000
#: how long closing a producer may wait for it to flush before it is cut off (what it
#: still holds is in the spool and is sent again by the next producer)
_PRODUCER_CLOSE_TIMEOUT_S = 0.5


def partition_index(key: bytes, count: int) -> int:
    """The partition of ``key`` among ``count``, as Apache Kafka's Java producer picks it for
    a keyed record (``toPositive(murmur2(key)) % count``): a producer in any language that
    uses this rule lands an org's events where this one does (docs/contract.md)."""
    return int(murmur2(key) & 0x7FFFFFFF) % count


@dataclass(eq=False)
class _Chunk:
    """Records read from the spool in one round: acknowledged together, in order."""

    end: int
    count: int
    #: batches not yet settled, plus one while the chunk is still being submitted
    pending: int = 1
    error: BaseException | None = None


@dataclass(eq=False)
class _Session:
    """One producer's lifetime: its chunks in flight and its first failure."""

    inflight: deque[_Chunk] = field(default_factory=deque)
    failure: BaseException | None = None
    over: bool = False


class Sender:
    """Drains a :class:`Spool` to the ``usage.raw`` topic (see the module docstring)."""

    def __init__(
        self,
        config: PublisherConfig,
        spool: Spool,
        metrics: PublisherMetrics,
        on_ack: Callable[[], None],
    ) -> None:
        self._config = config
        self._spool = spool
        self._metrics = metrics
        self._on_ack = on_ack
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._partition_of: dict[bytes, int] = {}
        self._last_persist = 0.0
        #: records up to here are sent at once (flush), not after the linger
        self._send_now_upto = 0
        self.connected = False
        #: False after a failed attempt, until the next connection works
        self.reachable = True
        self.last_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="spendbus-ingest-sender")

    def notify(self) -> None:
        """New records are in the spool."""
        self._wake.set()

    def send_now(self, upto: int) -> None:
        """Send the records up to spool position ``upto`` without lingering (a flush)."""
        if upto > self._send_now_upto:
            self._send_now_upto = upto
            self._wake.set()

    async def close(self, grace_s: float = 0.1) -> None:
        """Stop sending. Unacknowledged records stay in the spool for the next start."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if not done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(OSError):
            self._spool.persist()

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        initial = self._config.retry_backoff_ms / 1000
        backoff = initial
        while not self._closing:
            producer: AIOKafkaProducer | None = None
            session = _Session()
            try:
                producer, partitions = await self._connect()
                self.connected = self.reachable = True
                self._metrics.connected.set(1)
                backoff = initial
                await self._pump(producer, partitions, session)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
            finally:
                session.over = True
                self.connected = False
                self._metrics.connected.set(0)
                if producer is not None:
                    await _close_producer(producer)
            if not self._closing:
                await self._sleep(backoff)
                backoff = min(backoff * 2, self._config.retry_backoff_max_ms / 1000)

    async def _connect(self) -> tuple[AIOKafkaProducer, list[int]]:
        config = self._config
        producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap,
            client_id=config.client_id,
            acks="all",
            enable_idempotence=True,
            compression_type=None if config.compression == "none" else config.compression,
            max_batch_size=config.max_batch_bytes,
            linger_ms=0,  # the sender lingers itself; batches are closed when submitted
            request_timeout_ms=config.send_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            **config.kafka_security.client_kwargs(),
        )
        try:
            await producer.start()
            partitions = sorted(await producer.partitions_for(config.topic))
        except BaseException:
            await _close_producer(producer)
            raise
        if not partitions:
            await _close_producer(producer)
            raise KafkaTimeoutError(f"topic {config.topic} has no partitions")
        if self.last_error is not None:
            log.info("Kafka reachable again; %d spooled bytes to send", self._spool.pending_bytes)
        self.last_error = None
        return producer, partitions

    async def _pump(
        self, producer: AIOKafkaProducer, partitions: list[int], session: _Session
    ) -> None:
        """Send from the acknowledged position until closed and drained, or a failure."""
        config = self._config
        spool = self._spool
        read_pos = spool.acked
        self._partition_of.clear()
        loop = asyncio.get_running_loop()
        linger_s = config.linger_ms / 1000
        #: when the oldest record not yet sent was first seen (None: all sent)
        batch_opened: float | None = None
        while True:
            if session.failure is not None:
                raise session.failure
            if read_pos >= spool.write_end:
                if self._closing and not session.inflight:
                    return
                if not session.inflight and spool.acked > spool.persisted:
                    # the last acks of a burst: write the cursor (and free segments) now,
                    # not at a next ack that may never come
                    self._persist()
                self._wake.clear()
                await self._wake.wait()
                continue
            if read_pos - spool.acked >= config.max_in_flight_bytes:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Kafka's linger: records go out once a batch is full or the oldest of them
            # has waited linger_ms, in flight or not. Each produce request costs the
            # proxy and the broker far more CPU than a record in it (a proxy's events
            # come one at a time, as its responses end)
            if (
                linger_s
                and not self._closing
                and self._send_now_upto <= read_pos
                and spool.write_end - read_pos < config.max_batch_bytes
            ):
                now = loop.time()
                if batch_opened is None:
                    batch_opened = now
                if now < batch_opened + linger_s:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(batch_opened + linger_s - now):
                            await self._wake.wait()
                    continue
            batch_opened = None
            # (no records: only corrupt bytes were skipped; the empty chunk acks past them in turn)
            records, next_pos = spool.read(read_pos, config.read_chunk_bytes)
            chunk = _Chunk(end=next_pos, count=len(records))
            session.inflight.append(chunk)
            try:
                await self._submit_chunk(producer, partitions, records, session, chunk)
            except BaseException as exc:
                chunk.error = chunk.error or exc  # never ack a chunk not wholly submitted
                raise
            finally:
                self._settle(session, chunk, None)
            read_pos = next_pos

    async def _submit_chunk(
        self,
        producer: AIOKafkaProducer,
        partitions: list[int],
        records: list[SpooledRecord],
        session: _Session,
        chunk: _Chunk,
    ) -> None:
        partition_of = self._partition_of
        if len(partition_of) > _PARTITION_CACHE_SIZE:
            partition_of.clear()
        count = len(partitions)
        builders: dict[int, Any] = {}
        for key, value in records:
            partition = partition_of.get(key)
            if partition is None:
                partition = partitions[partition_index(key, count)]
                partition_of[key] = partition
            builder = builders.get(partition)
            if builder is None:
                builder = builders[partition] = producer.create_batch()
            if builder.append(timestamp=None, key=key, value=value) is None:
                await self._submit(producer, builder, partition, session, chunk)
                builder = builders[partition] = producer.create_batch()
                builder.append(timestamp=None, key=key, value=value)
        for partition, builder in builders.items():
            await self._submit(producer, builder, partition, session, chunk)

    async def _submit(
        self,
        producer: AIOKafkaProducer,
        builder: Any,
        partition: int,
        session: _Session,
        chunk: _Chunk,
    ) -> None:
        while True:
            if session.failure is not None:
                raise session.failure
            try:
                future = await producer.send_batch(builder, self._config.topic, partition=partition)
                break
            except KafkaTimeoutError as exc:
                # the partition's queue did not move within send_timeout_ms (broker away);
                # the batch was not taken: offer the same batch again
                self._metrics.send_errors.labels(type(exc).__name__).inc()
                self._note_error(exc)
        chunk.pending += 1
        self._metrics.batches.inc()
        future.add_done_callback(lambda f: self._settle(session, chunk, f))

    # -- acknowledgements --------------------------------------------------------------------------

    def _settle(self, session: _Session, chunk: _Chunk, future: asyncio.Future[Any] | None) -> None:
        """One batch of ``chunk`` settled (or its submission ended); ack what is complete, in order."""
        if future is not None and chunk.error is None:
            if future.cancelled():
                chunk.error = asyncio.CancelledError("batch cancelled")
            elif future.exception() is not None:
                chunk.error = future.exception()
        elif future is not None and not future.cancelled():
            future.exception()  # retrieved: no "exception never retrieved" warning
        chunk.pending -= 1
        if session.over or chunk.pending:
            return
        acked = False
        inflight = session.inflight
        while inflight and inflight[0].pending == 0:
            head = inflight[0]
            if head.error is not None:
                if session.failure is None:
                    session.failure = head.error
                    self._wake.set()
                return
            inflight.popleft()
            self._spool.ack(head.end)
            self._metrics.published.inc(head.count)
            acked = True
        if acked:
            self._wake.set()
            now = time.monotonic()
            if now - self._last_persist >= self._config.cursor_interval_ms / 1000:
                self._persist()
            self._on_ack()

    def _persist(self) -> None:
        """Write the cursor and free acknowledged segments."""
        self._last_persist = time.monotonic()
        try:
            self._spool.persist()
        except OSError as exc:  # a stale cursor only means re-sending
            log.warning("cannot write the spool cursor: %s", exc)

    # -- errors ----------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        self.reachable = False
        self._metrics.send_errors.labels(type(exc).__name__).inc()
        self._note_error(exc)

    def _note_error(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text != self.last_error:
            log.warning(
                "Kafka publish failed (%s); %d bytes stay spooled, retrying",
                text,
                self._spool.pending_bytes,
            )
        self.last_error = text

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by close()."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)


async def _close_producer(producer: AIOKafkaProducer) -> None:
    """Stop a producer, waiting a bounded time for what it holds to be delivered.

    aiokafka's ``stop()`` waits until every queued batch is delivered, for ever
    when the broker is gone. Past the timeout its background sender task is
    cancelled (there is no public abort), which fails the queued batches
    (they stay in the spool) and lets ``stop()`` finish.
    """
    stopping = asyncio.ensure_future(producer.stop())
    done, _ = await asyncio.wait({stopping}, timeout=_PRODUCER_CLOSE_TIMEOUT_S)
    if not done:
        sender = getattr(producer, "_sender", None)
        sender_task = getattr(sender, "sender_task", None)
        if sender_task is not None:
            sender_task.cancel()
    try:
        await asyncio.wait_for(stopping, _PRODUCER_CLOSE_TIMEOUT_S)
    except Exception as exc:  # closing is best effort; the spool keeps the records
        log.debug("producer did not close cleanly: %r", exc)
